// 2-D convolution and pooling over channels-last images (Keras' layout): x (B, H, W, C), kernel
// (KH, KW, C, F) as Keras stores it, outputs (B, OH, OW, F).
//
// Plan: each image is copied once with its padding written out (pad_image), so no window leaves it.
// The forward reads the windows there in place as the left operand of the register tiles of
// packed.hpp (a row per output pixel: KH runs of KW * C values), against the kernel read as a
// (KH * KW * C, F) matrix and packed once per call; a 3x3 kernel with stride 1 on 8 or more channels
// goes through Winograd F(2x2, 3x3) instead. The activation runs as the product stores (relu) or on
// the rows just written. Backward: with stride 1, dx is a forward convolution of dz with the kernel
// turned around (the same code); with larger strides dz . K^T goes back through the windows into the
// padded image (col2im) and is cropped out of it. The kernel gradient, a reduction over the output
// pixels, runs on the same tiles: through Winograd's transforms where the forward does, else as
// dK^T = dz^T . patches with the patches of a block of output rows copied (im2col, one row of
// KH * KW * C values per output pixel, in the kernel's (i, j, c) order) and read in place as the
// right operand.
// Images are split across the thread budget (parallel_for), so that the input gradient each thread
// writes stays in its own images; each thread sums its kernel gradient apart and adds it under a lock.
// Pooling reads windows of the same geometry; padded positions are never part of a window (max
// ignores them, the average divides by the real pixels only), as in TensorFlow.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnx/activations.hpp"
#include "attnx/bf16.hpp"
#include "attnx/packed.hpp"
#include "attnx/parallel.hpp"

namespace attnx {

// The windows of a convolution or pooling: input (B, H, W, C), windows of KH x KW pixels, SH and SW
// apart, output (B, OH, OW, .), the input padded by pad_top rows and pad_left columns first.
struct Window2D {
    int B = 0, H = 0, W = 0, C = 0;
    int KH = 1, KW = 1, SH = 1, SW = 1;
    int OH = 0, OW = 0, pad_top = 0, pad_left = 0;

    size_t out_pixels() const { return (size_t)OH * OW; }
    size_t in_pixels() const { return (size_t)H * W; }
    int patch() const { return KH * KW * C; }
    // the rows and columns of the input the windows reach, padding included
    int padded_rows() const { return (OH - 1) * SH + KH; }
    int padded_cols() const { return (OW - 1) * SW + KW; }
};

// Keras / TensorFlow geometry. 'valid': only whole windows, OH = (H - KH) / SH + 1. 'same':
// OH = ceil(H / SH), padded by max((OH - 1) * SH + KH - H, 0) rows of which the extra odd one goes
// to the bottom (and right). Throws std::invalid_argument for sizes that have no output.
// (Sizes in 64 bits here: H + SH or KH + H may pass int.)
inline Window2D window_2d(int B, int H, int W, int C, int KH, int KW, int SH, int SW, bool same) {
    if (KH < 1 || KW < 1) throw std::invalid_argument("window sizes must be positive");
    if (SH < 1 || SW < 1) throw std::invalid_argument("strides must be positive");
    Window2D w;
    w.B = B, w.H = H, w.W = W, w.C = C, w.KH = KH, w.KW = KW, w.SH = SH, w.SW = SW;
    if (same) {
        using I = long long;
        const I OH = (I(H) + SH - 1) / SH, OW = (I(W) + SW - 1) / SW;
        w.OH = (int)OH, w.OW = (int)OW;
        w.pad_top = (int)(std::max((OH - 1) * SH + KH - H, I(0)) / 2);
        w.pad_left = (int)(std::max((OW - 1) * SW + KW - W, I(0)) / 2);
    } else {
        if (KH > H || KW > W)
            throw std::invalid_argument("window " + std::to_string(KH) + "x" + std::to_string(KW) +
                                        " is larger than the input " + std::to_string(H) + "x" + std::to_string(W) +
                                        " with padding 'valid'");
        w.OH = (H - KH) / SH + 1, w.OW = (W - KW) / SW + 1;
    }
    return w;
}

// The window offsets k in [lo, hi) of output position o whose input position o * stride - pad + k
// lies inside [0, size)
struct Span {
    int lo, hi;
};
inline Span inside(int o, int stride, int pad, int k, int size) {
    const int start = o * stride - pad;
    return {std::max(0, -start), std::min(k, size - start)};
}

// The offset in x of pixel (i, j) of output pixel (oh, ow)'s window in image b (inside the image)
inline size_t window_pixel(const Window2D& w, size_t b, int oh, int ow, int i, int j) {
    return ((b * w.H + (size_t)(oh * w.SH - w.pad_top + i)) * w.W + (size_t)(ow * w.SW - w.pad_left + j)) * w.C;
}

// fn(b0, b1) over the images, split across the thread budget (`work`: multiply-adds)
template <class F> void for_images(const Window2D& w, double work, F&& fn) {
    parallel_for((size_t)w.B, work, [&](size_t b0, size_t b1) { fn((int)b0, (int)b1); });
}

// ---------------------------------------------------------------------------------- Conv2D
// The widest vectors' lanes: the padding a matrix read in place as panels needs past its end
constexpr int kMaxLanes = 16;

// One image (H, W, C) as its windows read it: (rows, cols, C), rows and cols at least padded_rows()
// and padded_cols(), pixel (ih, iw) at (ih + pad_top, iw + pad_left), zeros around it (pixels no
// window reaches left out)
template <class T> void pad_image(std::vector<T>& xp, const T* image, const Window2D& w, int rows, int cols) {
    const int C = w.C;
    xp.assign((size_t)rows * cols * C, T(0));
    const int inside_rows = std::min(w.H, w.padded_rows() - w.pad_top);
    const int inside_cols = std::min(w.W, w.padded_cols() - w.pad_left);
    for (int ih = 0; ih < inside_rows; ++ih)
        std::copy_n(image + (size_t)ih * w.W * C, (size_t)inside_cols * C,
                    xp.data() + ((size_t)(ih + w.pad_top) * cols + w.pad_left) * C);
}

// One image's gradient = the pixels of its padded image's gradient dxp that are the image's (0 for
// pixels no window reaches)
template <class T> void crop_image(T* image, const T* dxp, const Window2D& w) {
    const int Wp = w.padded_cols(), C = w.C;
    const int rows = std::min(w.H, w.padded_rows() - w.pad_top), cols = std::min(w.W, Wp - w.pad_left);
    std::fill(image, image + w.in_pixels() * C, T(0));
    for (int ih = 0; ih < rows; ++ih)
        std::copy_n(dxp + ((size_t)(ih + w.pad_top) * Wp + w.pad_left) * C, (size_t)cols * C,
                    image + (size_t)ih * w.W * C);
}

// The patches of output rows oh, oh + 1, ... of a padded image, read in place as the left operand of
// a product: row k is output pixel k's window, its KH rows (runs of KW * C values, padded_cols * C
// apart) one after another. Consecutive output pixels' windows are SW * C apart: within an output
// row, or across rows too when windows_evenly_spaced.
template <class T> LeftRows<T> window_rows(const T* xp, const Window2D& w, int oh) {
    const size_t row_values = (size_t)w.padded_cols() * w.C;
    return {xp + (size_t)oh * w.SH * row_values, (size_t)w.SW * w.C, w.KW * w.C, nullptr, 0, 0, w.KH, row_values};
}
inline bool windows_evenly_spaced(const Window2D& w) { return (size_t)w.SH * w.padded_cols() == (size_t)w.OW * w.SW; }

// fn(k, offset) for the output pixels k = (oh - oh0) * OW + ow of output rows [oh0, oh1): offset is
// where the window of pixel (oh, ow) starts in a padded image
template <class F> ATTNX_ALWAYS_INLINE void walk_windows(const Window2D& w, int oh0, int oh1, F&& fn) {
    const size_t C = w.C, Wp = w.padded_cols();
    for (int oh = oh0, k = 0; oh < oh1; ++oh)
        for (int ow = 0; ow < w.OW; ++ow, ++k) fn(k, ((size_t)oh * w.SH * Wp + (size_t)ow * w.SW) * C);
}

// cols[k, (i * KW + j) * C + c] = xp[oh * SH + i, ow * SW + j, c] for the output pixels k of output rows
// [oh0, oh1) of a padded image. The copies stay loops (GCC would call memmove for each window row:
// 3 values for a 3x3 kernel on one channel, where the call costs more than the copy).
template <class T>
__attribute__((optimize("no-tree-loop-distribute-patterns"))) void im2col(T* cols, const T* xp, const Window2D& w,
                                                                           int oh0, int oh1) {
    const size_t P = w.patch(), run = (size_t)w.KW * w.C, row_values = (size_t)w.padded_cols() * w.C;
    walk_windows(w, oh0, oh1, [&](int k, size_t at) __attribute__((always_inline)) {
        for (int i = 0; i < w.KH; ++i)
            for (size_t e = 0; e < run; ++e) cols[k * P + i * run + e] = xp[at + i * row_values + e];
    });
}

// The transpose of im2col: dxp[oh * SH + i, ow * SW + j, c] += dcols[k, (i * KW + j) * C + c]
template <class T> void col2im_add(T* dxp, const T* dcols, const Window2D& w, int oh0, int oh1) {
    const size_t P = w.patch(), run = (size_t)w.KW * w.C, row_values = (size_t)w.padded_cols() * w.C;
    walk_windows(w, oh0, oh1, [&](int k, size_t at) __attribute__((always_inline)) {
        for (int i = 0; i < w.KH; ++i)
            for (size_t e = 0; e < run; ++e) dxp[at + i * row_values + e] += dcols[k * P + i * run + e];
    });
}

// colsT[p, k] = cols[k, p], the patches of output rows [oh0, oh1) transposed (rows ld apart), for a
// one-channel image and stride 1: each patch position's values along an output row are a run of
// the padded image
template <class T> void im2col_transposed(T* colsT, size_t ld, const T* xp, const Window2D& w, int oh0, int oh1) {
    const size_t Wp = w.padded_cols();
    for (int oh = oh0; oh < oh1; ++oh)
        for (int i = 0; i < w.KH; ++i)
            for (int j = 0; j < w.KW; ++j)
                std::copy_n(xp + (size_t)(oh * w.SH + i) * Wp + j, w.OW,
                            colsT + (size_t)(i * w.KW + j) * ld + (size_t)(oh - oh0) * w.OW);
}

// fn(oh0, oh1) over blocks of an image's output rows whose patches take about 256 KiB
template <class T, class F> void for_output_row_blocks(const Window2D& w, F&& fn) {
    const size_t row_values = std::max<size_t>((size_t)w.OW * w.patch(), 1);
    const int rows = (int)std::max<size_t>(1, (size_t(1) << 16) * 4 / sizeof(T) / row_values);
    for (int oh0 = 0; oh0 < w.OH; oh0 += rows) fn(oh0, std::min(w.OH, oh0 + rows));
}

// ------------------------------------------------ Winograd F(2x2, 3x3) (Lavin & Gray, 2016)
// A 3x3 convolution with stride 1 computes each 2x2 block of outputs from the 4x4 block of the padded
// image under it with 16 multiplies a channel pair instead of 36:
//   Y = A^T [ (G g G^T) . (B^T d B) ] A, summed over the input channels,
//   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1],
//   A^T = [1 1 1 0; 0 1 -1 -1].
// The sum over channels is 16 products (blocks, C) . (C, F), one per position of the 4x4 block, on the
// register tiles. The transforms add and subtract the values of a block, so an infinite input comes
// out NaN where the direct product gives +-Inf (at the same outputs: those whose windows hold it).
// Below 8 input channels those products are too thin to pay for the transforms
// (measured against the direct product, one thread: 1-4 channels 1.6-4x slower, 8 the same, 16 to 128
// channels 1.1-1.7x faster whatever the filters, 1 to 128).
inline bool winograd_applies(const Window2D& w) { return w.KH == 3 && w.KW == 3 && w.SH == 1 && w.SW == 1 && w.C >= 8; }

// B^T v (v: a column of the block, or B^T d's row)
template <class V> ATTNX_ALWAYS_INLINE void winograd_input_4(V& v0, V& v1, V& v2, V& v3) {
    const V t0 = v0 - v2, t1 = v1 + v2, t2 = v2 - v1, t3 = v1 - v3;
    v0 = t0, v1 = t1, v2 = t2, v3 = t3;
}

// fn(lanes, t, ty, tx, rows, cols, c, m) for every block t = (ty - ty0) * tiles_w + tx of the tile rows
// [ty0, ty1) and every vector of `channels` (c its first channel, m its lanes, lanes a vector of the
// widest width this CPU runs): rows x cols of the block's 2x2 output pixels lie inside the output
template <class T, class Fn>
void for_block_vectors(const Window2D& w, int channels, int ty0, int ty1, int tiles_w, Fn&& fn) {
    on_widest_lanes<T>([&](auto lanes) __attribute__((always_inline)) {
        constexpr int W = Lanes<decltype(lanes)>::W;
        for (int ty = ty0; ty < ty1; ++ty)
            for (int tx = 0; tx < tiles_w; ++tx) {
                const size_t t = (size_t)(ty - ty0) * tiles_w + tx;
                const int rows = std::min(2, w.OH - 2 * ty), cols = std::min(2, w.OW - 2 * tx);
                for (int c = 0; c < channels; c += W) fn(lanes, t, ty, tx, rows, cols, c, std::min(W, channels - c));
            }
    });
}

// V[e, t, c] (at V + e * plane + t * C + c) = (B^T d_t B)[e / 4, e % 4] for the 4x4 blocks d_t (every
// channel) of the tile rows [ty0, ty1) of a padded image (rows cols * C values apart): block
// t = (ty - ty0) * tiles_w + tx starts at pixel (2 ty, 2 tx)
template <class T>
void winograd_input(T* V, size_t plane, const T* xp, int cols, const Window2D& w, int ty0, int ty1, int tiles_w) {
    const int C = w.C;
    for_block_vectors<T>(w, C, ty0, ty1, tiles_w, [&](auto lanes, size_t t, int ty, int tx, int, int, int c, int m)
                                                      __attribute__((always_inline)) {
        using Vec = decltype(lanes);
        const T* block = xp + ((size_t)2 * ty * cols + 2 * tx) * C;
        // B^T d B: B^T on the block's columns, then on the rows of the result (named values: an array
        // of them GCC keeps on the stack)
        auto column = [&](int j, Vec& v0, Vec& v1, Vec& v2, Vec& v3) __attribute__((always_inline)) {
            auto at = [&](int i) __attribute__((always_inline)) {
                return vload<Vec>(block + ((size_t)i * cols + j) * C + c, m);
            };
            v0 = at(0), v1 = at(1), v2 = at(2), v3 = at(3);
            winograd_input_4(v0, v1, v2, v3);
        };
        Vec d00, d10, d20, d30, d01, d11, d21, d31, d02, d12, d22, d32, d03, d13, d23, d33;
        column(0, d00, d10, d20, d30), column(1, d01, d11, d21, d31);
        column(2, d02, d12, d22, d32), column(3, d03, d13, d23, d33);
        auto row = [&](int i, Vec v0, Vec v1, Vec v2, Vec v3) __attribute__((always_inline)) {
            winograd_input_4(v0, v1, v2, v3);
            T* to = V + (size_t)(4 * i) * plane + t * C + c;
            vstore(to, v0, m), vstore(to + plane, v1, m), vstore(to + 2 * plane, v2, m), vstore(to + 3 * plane, v3, m);
        };
        row(0, d00, d01, d02, d03), row(1, d10, d11, d12, d13);
        row(2, d20, d21, d22, d23), row(3, d30, d31, d32, d33);
    });
}

// z's 2x2 blocks of output pixels of tile rows [ty0, ty1) = A^T M_t A (+ bias, relu as stored), for
// M[e, t, f] (at M + e * plane + t * F + f) the products; pixels past the output (odd sizes) are dropped
template <class T>
void winograd_output(T* z, const T* M, size_t plane, const T* bias, bool relu, const Window2D& w, int F, int ty0,
                     int ty1, int tiles_w) {
    for_block_vectors<T>(w, F, ty0, ty1, tiles_w, [&](auto lanes, size_t t, int ty, int tx, int rows, int cols, int f,
                                                      int m) __attribute__((always_inline)) {
        using Vec = decltype(lanes);
        auto at = [&](int e) __attribute__((always_inline)) { return vload<Vec>(M + e * plane + t * F + f, m); };
        // A^T M, column by column (named values: an array of them GCC keeps on the stack)
        const Vec m4 = at(4), m5 = at(5), m6 = at(6), m7 = at(7), m8 = at(8), m9 = at(9), m10 = at(10), m11 = at(11);
        const Vec s0 = at(0) + m4 + m8, s1 = at(1) + m5 + m9, s2 = at(2) + m6 + m10, s3 = at(3) + m7 + m11;
        const Vec d0 = m4 - m8 - at(12), d1 = m5 - m9 - at(13), d2 = m6 - m10 - at(14), d3 = m7 - m11 - at(15);
        const Vec b = bias ? vload<Vec>(bias + f, m) : Vec{};
        auto put = [&](int i, int j, Vec v) __attribute__((always_inline)) {
            if (i >= rows || j >= cols) return;
            if (relu) v = v < T(0) ? Vec{} : v;
            vstore(z + (((size_t)2 * ty + i) * w.OW + 2 * tx + j) * F + f, v, m);
        };
        put(0, 0, s0 + s1 + s2 + b), put(0, 1, s1 - s2 - s3 + b);
        put(1, 0, d0 + d1 + d2 + b), put(1, 1, d1 - d2 - d3 + b);
    });
}

// dM[e, t, f] (at dM + e * plane + t * F + f) = (A dY_t A^T)[e / 4, e % 4], the gradient of the products
// from the gradient dY_t of z's 2x2 block t of tile rows [ty0, ty1) (dz: one image's, (OH, OW, F); 0
// past the output); A = [1 0; 1 1; 1 -1; 0 -1]
template <class T>
void winograd_output_gradient(T* dM, size_t plane, const T* dz, const Window2D& w, int F, int ty0, int ty1,
                              int tiles_w) {
    for_block_vectors<T>(w, F, ty0, ty1, tiles_w, [&](auto lanes, size_t t, int ty, int tx, int rows, int cols, int f,
                                                      int m) __attribute__((always_inline)) {
        using Vec = decltype(lanes);
        auto at = [&](int i, int j) __attribute__((always_inline)) {
            return i < rows && j < cols ? vload<Vec>(dz + (((size_t)2 * ty + i) * w.OW + 2 * tx + j) * F + f, m) : Vec{};
        };
        const Vec y00 = at(0, 0), y01 = at(0, 1), y10 = at(1, 0), y11 = at(1, 1);
        // A dY: rows y0, y0 + y1, y0 - y1, -y1 of each column; then the same on the rows
        auto row = [&](int i, Vec a, Vec b) __attribute__((always_inline)) {
            T* to = dM + (size_t)(4 * i) * plane + t * F + f;
            vstore(to, a, m), vstore(to + plane, a + b, m), vstore(to + 2 * plane, a - b, m);
            vstore(to + 3 * plane, Vec{} - b, m);
        };
        row(0, y00, y01), row(1, y00 + y10, y01 + y11), row(2, y00 - y10, y01 - y11), row(3, Vec{} - y10, Vec{} - y11);
    });
}

// dK[i, j, c, f] += (G^T dU[c, f] G)[i, j] for dU (16, C, F), the gradient of the transformed kernel;
// G^T = [1 .5 .5 0; 0 .5 -.5 0; 0 .5 .5 1]
template <class T> void add_winograd_kernel_gradient(T* dK, const T* dU, int C, int F) {
    const size_t CF = (size_t)C * F;
    for (size_t cf = 0; cf < CF; ++cf) {
        T u[4][4], a[3][4];
        for (int e = 0; e < 16; ++e) u[e / 4][e % 4] = dU[e * CF + cf];
        for (int j = 0; j < 4; ++j)
            a[0][j] = u[0][j] + (u[1][j] + u[2][j]) / 2, a[1][j] = (u[1][j] - u[2][j]) / 2,
            a[2][j] = (u[1][j] + u[2][j]) / 2 + u[3][j];
        for (int i = 0; i < 3; ++i) {
            dK[(i * 3 + 0) * CF + cf] += a[i][0] + (a[i][1] + a[i][2]) / 2;
            dK[(i * 3 + 1) * CF + cf] += (a[i][1] - a[i][2]) / 2;
            dK[(i * 3 + 2) * CF + cf] += (a[i][1] + a[i][2]) / 2 + a[i][3];
        }
    }
}

// `values` (floats or doubles) rounded up to whole 64-byte lines, one line more if that is a multiple
// of 4 KiB: rows or planes that far apart fall in the same L1 sets
inline size_t lines_apart(size_t values) {
    const size_t line = 16, page = 1024;  // in 4-byte values; doubles get twice the room
    const size_t rounded = (values + line - 1) / line * line;
    return rounded % page == 0 ? rounded + line : rounded;
}

// A block of tile rows [ty0, ty1) of one image: tiles = (ty1 - ty0) * tiles_w 4x4 blocks of the padded
// image, whose rows are `cols` pixels long
struct WinogradBlock {
    int ty0, ty1, tiles_w, tiles, cols;
    // the values apart of the 16 planes of a transform with `channels` values a block: room for 8
    // blocks more (the transposes read up to 4 past the end, the in-place panel reads kMaxLanes
    // values), rounded to whole cache lines and then one more if they would be a multiple of 4 KiB
    // apart (the transforms' 16 loads or stores of a block fell in one L1 set)
    size_t plane(int channels) const { return lines_apart((size_t)(tiles + 8) * channels + kMaxLanes); }
};

// Pads one image for Winograd (whole 4x4 blocks) into xp and calls fn(block) for blocks of tile rows
// whose transforms (C and F values a block, 16 planes each) take about 512 KiB
template <class T, class Fn>
void for_winograd_blocks(const Window2D& w, int F, const T* image, std::vector<T>& xp, Fn&& fn) {
    const int tiles_h = (w.OH + 1) / 2, tiles_w = (w.OW + 1) / 2, cols = 2 * tiles_w + 2;
    pad_image(xp, image, w, 2 * tiles_h + 2, cols);
    const size_t block_values = (size_t)16 * ((size_t)w.C + F) * tiles_w;
    const int rows = (int)std::clamp<size_t>((size_t(1) << 17) / block_values, 1, (size_t)tiles_h);
    for (int ty0 = 0; ty0 < tiles_h; ty0 += rows) {
        const int ty1 = std::min(tiles_h, ty0 + rows);
        fn(WinogradBlock{ty0, ty1, tiles_w, (ty1 - ty0) * tiles_w, cols});
    }
}

// A kernel (KH, KW, C, F) ready for conv2d_image: a (KH * KW * C, F) matrix packed for the direct
// product, or, where Winograd applies, its 16 transformed (C, F) matrices G g G^T packed
template <class T> struct ConvKernel {
    bool winograd;
    std::vector<PackedRight<T>> packed;
    ConvKernel(const T* kernel, const Window2D& w, int F) : winograd(winograd_applies(w)) {
        if (!winograd) {
            packed.emplace_back(kernel, w.patch(), F, false);
            return;
        }
        const size_t CF = (size_t)w.C * F;
        std::vector<T> U(16 * CF);
        for (size_t cf = 0; cf < CF; ++cf) {
            T g[3][3], Gg[4][3];
            for (int i = 0; i < 3; ++i)
                for (int j = 0; j < 3; ++j) g[i][j] = kernel[(i * 3 + j) * CF + cf];
            for (int j = 0; j < 3; ++j) {
                Gg[0][j] = g[0][j], Gg[3][j] = g[2][j];
                Gg[1][j] = (g[0][j] + g[1][j] + g[2][j]) / 2, Gg[2][j] = (g[0][j] - g[1][j] + g[2][j]) / 2;
            }
            for (int i = 0; i < 4; ++i) {
                T* u = U.data() + (size_t)i * 4 * CF + cf;
                u[0] = Gg[i][0], u[3 * CF] = Gg[i][2];
                u[CF] = (Gg[i][0] + Gg[i][1] + Gg[i][2]) / 2, u[2 * CF] = (Gg[i][0] - Gg[i][1] + Gg[i][2]) / 2;
            }
        }
        for (int e = 0; e < 16; ++e) packed.emplace_back(U.data() + e * CF, w.C, F, false);
    }
};

// One image's z (OH, OW, F) = bias + its convolution with the kernel, y = act(z) (y may alias z; relu
// then runs as z is stored). xp and scratch: the caller's buffers, reused from image to image.
template <class T>
void conv2d_image(T* y, T* z, const T* image, const ConvKernel<T>& kernel, const T* bias, const Window2D& w, int F,
                  Activation act, std::vector<T>& xp, std::vector<T>& scratch) {
    const bool fused_relu = act == Activation::relu && y == z;
    auto activate = [&](int oh0, int oh1) {
        const size_t r0 = (size_t)oh0 * w.OW * F;
        if (!fused_relu) activation_forward<T>(y + r0, z + r0, (size_t)(oh1 - oh0) * w.OW, (size_t)F, act);
    };
    if (!kernel.winograd) {
        pad_image(xp, image, w, w.padded_rows(), w.padded_cols());
        const int rows = windows_evenly_spaced(w) ? w.OH : 1;
        for (int oh = 0; oh < w.OH; oh += rows) {
            packed_rows(z + (size_t)oh * w.OW * F, window_rows(xp.data(), w, oh), rows * w.OW, kernel.packed[0], bias,
                        fused_relu);
            activate(oh, oh + rows);
        }
        return;
    }
    const int C = w.C;
    for_winograd_blocks(w, F, image, xp, [&](const WinogradBlock& block) {
        const int n = block.tiles;
        const size_t plane_v = block.plane(C), plane_m = block.plane(F);
        scratch.resize(16 * (plane_v + plane_m));
        T *V = scratch.data(), *M = V + 16 * plane_v;
        winograd_input(V, plane_v, xp.data(), block.cols, w, block.ty0, block.ty1, block.tiles_w);
        for (int e = 0; e < 16; ++e)
            packed_rows(M + e * plane_m, LeftRows<T>{V + e * plane_v, (size_t)C, C, nullptr, 0, 0}, n,
                        kernel.packed[e], (const T*)nullptr);
        winograd_output(z, M, plane_m, bias, fused_relu, w, F, block.ty0, block.ty1, block.tiles_w);
        activate(2 * block.ty0, std::min(w.OH, 2 * block.ty1));
    });
}

// reference: cpp/reference/conv.hpp, conv2d_forward
// z[b, oh, ow, f] = bias[f] + sum_{i, j, c} x[b, oh * SH - pad_top + i, ow * SW - pad_left + j, c] K[i, j, c, f]
// y = act(z) (y may alias z: gelu's backward alone needs z). bias may be null. The windows are read
// in place from the padded image (no im2col), or through Winograd's transforms; relu runs as z is
// stored when y is z.
template <class T>
void conv2d_forward(T* y, T* z, const T* x, const T* kernel, const T* bias, const Window2D& w, int F, Activation act) {
    if (F == 0 || w.out_pixels() == 0) return;  // no output (and a kernel of no filters may be any size)
    const ConvKernel<T> packed_kernel(kernel, w, F);
    const size_t in_image = w.in_pixels() * w.C, out_image = w.out_pixels() * F;
    for_images(w, double(w.B) * w.out_pixels() * w.patch() * F, [&](int b0, int b1) {
        std::vector<T> xp, scratch;
        for (int b = b0; b < b1; ++b)
            conv2d_image(y + b * out_image, z + b * out_image, x + b * in_image, packed_kernel, bias, w, F, act, xp,
                         scratch);
    });
}

// out[m, c] += sum_k left[m, k] right[k, c] for out (M, N): left (M, n) rows ld_left apart, right
// (n, N) read in place as panels of Q vectors (no packing: its rows are the panels' rows, N apart).
// A row's last vector may run past N into the next row (right holds kMaxLanes values more at its
// end); those lanes are dropped.
template <class T> void add_product_in_place(T* out, const T* left, size_t ld_left, int M, const T* right, int n, int N) {
    on_widest_lanes<T>([&](auto lanes) __attribute__((always_inline)) {
        using V = decltype(lanes);
        constexpr int W = Lanes<V>::W;
        auto product = [&](auto vectors) __attribute__((always_inline)) {
            constexpr int Q = decltype(vectors)::value;
            panels_product<V, Q>(0, M, LeftRows<T>{left, ld_left, n, nullptr, 0, 0},
                                 RightPanels<T>{right, (size_t)N, (size_t)Q * W, (size_t)N}, 0, N,
                                 [&](int m, auto pre, int p) __attribute__((always_inline)) {
                                     for (int q = 0; q < pre.count && (p * Q + q) * W < N; ++q) {
                                         T* to = out + (size_t)m * N + (p * Q + q) * W;
                                         const int count = std::min(W, N - (p * Q + q) * W);
                                         vstore(to, vload<V>(to, count) + pre.q[q], count);
                                     }
                                 });
        };
        const int Q = tile_vectors(N, W);
        if (Q == 1) product(std::integral_constant<int, 1>{});
        else if (Q == 2) product(std::integral_constant<int, 2>{});
        else product(std::integral_constant<int, 3>{});
    });
}

// sums[f] += sum_k m[k, f] for m (n, F)
template <class T> void add_column_sums(T* sums, const T* m, int n, int F) {
    on_widest_lanes<T>([&](auto lanes) __attribute__((always_inline)) {
        using V = decltype(lanes);
        constexpr int W = Lanes<V>::W;
        for (int f = 0; f < F; f += W) {
            const int count = std::min(W, F - f);
            V sum = {};
            for (int k = 0; k < n; ++k) sum += vload<V>(m + (size_t)k * F + f, count);
            vstore(sums + f, vload<V>(sums + f, count) + sum, count);
        }
    });
}

// With stride 1, dx is dz convolved with the kernel turned half around, its channels swapped:
//   dx[ih, iw, c] = sum_{i', j', f} dz[ih + i' - (KH - 1 - pad_top), iw + j' - (KW - 1 - pad_left), f]
//                   K[KH - 1 - i', KW - 1 - j', c, f]
// the geometry of that convolution (one image of dz in, one of dx out) ...
inline Window2D input_gradient_windows(const Window2D& w, int F) {
    Window2D t = w;
    t.H = w.OH, t.W = w.OW, t.C = F, t.OH = w.H, t.OW = w.W;
    t.pad_top = w.KH - 1 - w.pad_top, t.pad_left = w.KW - 1 - w.pad_left;
    return t;
}
// ... and its kernel (KH, KW, F, C)
template <class T> std::vector<T> turned_kernel(const T* kernel, const Window2D& w, int F) {
    std::vector<T> turned((size_t)w.patch() * F);
    for (int i = 0; i < w.KH; ++i)
        for (int j = 0; j < w.KW; ++j)
            for (int c = 0; c < w.C; ++c)
                for (int f = 0; f < F; ++f)
                    turned[(((size_t)i * w.KW + j) * F + f) * w.C + c] =
                        kernel[(((size_t)(w.KH - 1 - i) * w.KW + (w.KW - 1 - j)) * w.C + c) * F + f];
    return turned;
}

// reference: cpp/reference/conv.hpp, conv2d_backward
// Backward of conv2d_forward from dy and the forward's y and z: dz = dy * act'(z),
// dK[i, j, c, f] += sum_{b, oh, ow} patch[b, oh, ow][i, j, c] dz[b, oh, ow, f], dbias[f] += sum dz[..., f],
// dx = col2im(dz . K^T) (overwritten; null: not computed), with stride 1 the convolution above
// (conv2d_image: Winograd for 3x3 when F, its input channels, is 8 or more). dbias may be null.
// The kernel gradient: where Winograd applies, through its transforms (dU[e] = V[e]^T . dM[e] over the
// blocks, then G^T dU G); else taken transposed, dK^T (F, P) = dz^T . patches, so that the patches are
// the right operand as im2col wrote them and only dz (F values a row against P) is transposed; on one
// channel with stride 1 it is dK = patches^T . dz, patches^T copied in runs of the image and dz the
// right operand as it is (nothing transposed: a 3 x 3 kernel's 9 values a patch filled 9 of 16 lanes).
template <class T>
void conv2d_backward(T* dx, T* dkernel, T* dbias, const T* dy, const T* x, const T* kernel, const T* y, const T* z,
                     const Window2D& w, int F, Activation act) {
    const int P = w.patch(), C = w.C;
    const size_t in_image = w.in_pixels() * C, out_image = w.out_pixels() * F;
    if (F == 0 || w.out_pixels() == 0) {  // no output: no gradient, and no patches to read
        if (dx) std::fill(dx, dx + w.B * in_image, T(0));
        return;
    }
    const bool winograd = winograd_applies(w), patches_transposed = C == 1 && w.SW == 1;
    const bool dx_by_convolution = w.SH == 1 && w.SW == 1;
    const Window2D dx_windows = input_gradient_windows(w, F);
    // dx's kernel: the turned kernel (dx_by_convolution), else K^T (F, P) for dpatches = dz . K^T
    std::optional<ConvKernel<T>> turned;
    std::optional<PackedRight<T>> packed_kernel_t;
    if (dx && dx_by_convolution) turned.emplace(turned_kernel(kernel, w, F).data(), dx_windows, C);
    else if (dx) packed_kernel_t.emplace(kernel, F, P, true);
    // the transposes' rows (whole 4 x 4 blocks) 4 values more apart when they would be a multiple of
    // 64: 1024 values (a 32 x 32 image) apart they fell in one L1 set and the transpose ran 7x slower
    auto transposed_rows = [](int n) { return (n + 3) / 4 * 4 + (n % 64 == 0 ? 4 : 0); };
    std::mutex sum_lock;
    for_images(w, double(w.B) * w.out_pixels() * P * F * (dx ? 2 : 1), [&](int b0, int b1) {
        // this thread's images' share of the kernel gradient (dU, dK or dK^T) and dbias, added at the end
        std::vector<T> dK((size_t)F * (winograd ? 16 * C : P), T(0)), db(F, T(0)), xp, dxp, cols, dcols, dz, scratch;
        Panels<T> transposed;
        for (int b = b0; b < b1; ++b) {
            // the image's dz, and past its end zeros for the rows the transposes below read (up to 4) and
            // the in-place panel reads (kMaxLanes values)
            dz.resize(out_image + (size_t)8 * F + kMaxLanes);
            std::fill(dz.begin() + out_image, dz.end(), T(0));
            activation_backward<T>(dz.data(), dy + b * out_image, z + b * out_image, y + b * out_image,
                                   w.out_pixels(), (size_t)F, act);
            add_column_sums(db.data(), dz.data(), (int)w.out_pixels(), F);
            if (winograd) {
                for_winograd_blocks(w, F, x + b * in_image, xp, [&](const WinogradBlock& block) {
                    const int n = block.tiles, ld = transposed_rows(n);
                    const size_t plane_v = block.plane(C), plane_m = block.plane(F);
                    scratch.resize(16 * (plane_v + plane_m));
                    T *V = scratch.data(), *dM = V + 16 * plane_v;
                    winograd_input(V, plane_v, xp.data(), block.cols, w, block.ty0, block.ty1, block.tiles_w);
                    winograd_output_gradient(dM, plane_m, dz.data(), w, F, block.ty0, block.ty1, block.tiles_w);
                    for (int e = 0; e < 16; ++e) {
                        pack_panels_t(transposed, V + e * plane_v, (size_t)C, C, ld, ld, 4);  // V[e]^T (C, ld)
                        add_product_in_place(dK.data() + (size_t)e * C * F, transposed.data(), (size_t)ld, C,
                                             dM + e * plane_m, n, F);
                    }
                });
            } else {
                pad_image(xp, x + b * in_image, w, w.padded_rows(), w.padded_cols());
                if (dx && !dx_by_convolution) dxp.assign((size_t)w.padded_rows() * w.padded_cols() * C, T(0));
                for_output_row_blocks<T>(w, [&](int oh0, int oh1) {
                    const T* dz_block = dz.data() + (size_t)oh0 * w.OW * F;
                    const int n = (oh1 - oh0) * w.OW, ld = transposed_rows(n);
                    if (patches_transposed) {
                        cols.resize((size_t)P * ld);
                        im2col_transposed(cols.data(), (size_t)ld, xp.data(), w, oh0, oh1);
                        add_product_in_place(dK.data(), cols.data(), (size_t)ld, P, dz_block, n, F);
                    } else {
                        cols.resize((size_t)n * P + kMaxLanes);
                        im2col(cols.data(), xp.data(), w, oh0, oh1);
                        pack_panels_t(transposed, dz_block, (size_t)F, F, ld, ld, 4);  // dz^T (F, ld)
                        add_product_in_place(dK.data(), transposed.data(), (size_t)ld, F, cols.data(), n, P);
                    }
                    if (!dx || dx_by_convolution) return;
                    dcols.resize((size_t)n * P);
                    packed_rows(dcols.data(), LeftRows<T>{dz_block, (size_t)F, F, nullptr, 0, 0}, n, *packed_kernel_t,
                                (const T*)nullptr);
                    col2im_add(dxp.data(), dcols.data(), w, oh0, oh1);
                });
            }
            if (dx && dx_by_convolution)
                conv2d_image(dx + b * in_image, dx + b * in_image, dz.data(), *turned, (const T*)nullptr, dx_windows, C,
                             Activation::linear, dxp, scratch);
            else if (dx) crop_image(dx + b * in_image, dxp.data(), w);
        }
        std::lock_guard<std::mutex> hold(sum_lock);
        if (winograd) add_winograd_kernel_gradient(dkernel, dK.data(), C, F);
        else
            for (int p = 0; p < P; ++p)
                for (int f = 0; f < F; ++f)
                    dkernel[(size_t)p * F + f] += patches_transposed ? dK[(size_t)p * F + f] : dK[(size_t)f * P + p];
        if (dbias)
            for (int f = 0; f < F; ++f) dbias[f] += db[f];
    });
}

// ------------------------------------------------------------------------- Conv2D on bf16 products
// Under mixed_bfloat16 a convolution is a Dense product of its patches: im2col rows (OH OW, P) of a
// group of images times K (P, F) on bf16.hpp's tiles, forward and backward (col2im for dx). The groups
// keep the patches to about 16 MiB and give bf16_gemm rows of several images to split across threads.
inline int bf16_conv_images_per_group(const Window2D& w) {
    const size_t image_patches = std::max<size_t>(w.out_pixels() * w.patch(), 1);
    return (int)std::max<size_t>(1, std::min<size_t>(w.B, (size_t(4) << 20) / image_patches));
}

// the patches of images [b0, b1) of x, one row per output pixel, image after image
inline void bf16_conv_patches(std::vector<float>& cols, std::vector<float>& xp, const float* x, const Window2D& w,
                              int b0, int b1) {
    const size_t in_image = w.in_pixels() * w.C, image_rows = w.out_pixels();
    cols.resize((b1 - b0) * image_rows * w.patch());
    for (int b = b0; b < b1; ++b) {
        pad_image(xp, x + b * in_image, w, w.padded_rows(), w.padded_cols());
        im2col(cols.data() + (b - b0) * image_rows * w.patch(), xp.data(), w, 0, w.OH);
    }
}

// reference: cpp/reference/bf16.hpp, bf16_conv2d_forward
// z[b, oh, ow, f] = bias[f] + sum_{i, j, c} bf16(x[b, oh SH - pad_top + i, ow SW - pad_left + j, c]) bf16(K[i, j, c, f]),
// y = act(z) (y may alias z, except for gelu)
inline void bf16_conv2d_forward(float* y, float* z, const float* x, const float* kernel, const float* bias,
                                const Window2D& w, int F, Activation act) {
    if (F == 0 || w.out_pixels() == 0) return;
    const int group = bf16_conv_images_per_group(w);
    const size_t out_image = w.out_pixels() * F;
    std::vector<float> cols, xp;
    for (int b0 = 0; b0 < w.B; b0 += group) {
        const int b1 = std::min(w.B, b0 + group);
        bf16_conv_patches(cols, xp, x, w, b0, b1);
        bf16_dense_forward(y + b0 * out_image, z + b0 * out_image, cols.data(), kernel, bias,
                           (int)((b1 - b0) * w.out_pixels()), w.patch(), F, act);
    }
}

// reference: cpp/reference/bf16.hpp, bf16_conv2d_backward
// dz = dy act'(z) (float32);  dK[i, j, c, f] += sum bf16(patch) bf16(dz[.., f]),  dbias[f] += sum dz[.., f],
// dx = col2im(bf16(dz) . bf16(K)^T) (overwritten; null: not computed); dbias may be null
inline void bf16_conv2d_backward(float* dx, float* dkernel, float* dbias, const float* dy, const float* x,
                                 const float* kernel, const float* y, const float* z, const Window2D& w, int F,
                                 Activation act) {
    const size_t in_image = w.in_pixels() * w.C, out_image = w.out_pixels() * F, image_rows = w.out_pixels();
    if (F == 0 || w.out_pixels() == 0) {
        if (dx) std::fill(dx, dx + w.B * in_image, 0.0f);
        return;
    }
    const int group = bf16_conv_images_per_group(w), P = w.patch();
    std::vector<float> cols, xp, dz, dcols, dxp;
    for (int b0 = 0; b0 < w.B; b0 += group) {
        const int b1 = std::min(w.B, b0 + group);
        const size_t rows = (b1 - b0) * image_rows;
        dz.resize(rows * F);
        activation_backward<float>(dz.data(), dy + b0 * out_image, z + b0 * out_image, y + b0 * out_image, rows,
                                   (size_t)F, act);
        bf16_conv_patches(cols, xp, x, w, b0, b1);
        if (dx) dcols.resize(rows * P);
        bf16_dense_backward(dx ? dcols.data() : nullptr, dkernel, dbias, dz.data(), cols.data(), kernel, (int)rows, P,
                            F);
        if (!dx) continue;
        for (int b = b0; b < b1; ++b) {
            dxp.assign((size_t)w.padded_rows() * w.padded_cols() * w.C, 0.0f);
            col2im_add(dxp.data(), dcols.data() + (b - b0) * image_rows * P, w, 0, w.OH);
            crop_image(dx + b * in_image, dxp.data(), w);
        }
    }
}

// ---------------------------------------------------------------------------------- pooling
// visit(b, oh, ow, rows, cols) for every output pixel of images [b0, b1): the window offsets inside the image
template <class Visit> ATTNX_ALWAYS_INLINE void visit_windows(const Window2D& w, int b0, int b1, Visit&& visit) {
    for (int b = b0; b < b1; ++b)
        for (int oh = 0; oh < w.OH; ++oh) {
            const Span rows = inside(oh, w.SH, w.pad_top, w.KH, w.H);
            for (int ow = 0; ow < w.OW; ++ow) visit(b, oh, ow, rows, inside(ow, w.SW, w.pad_left, w.KW, w.W));
        }
}

// fn(b0, b1, lanes) over the images split across threads, each inside on_widest_lanes (lanes: a
// vector of its width; scalar channel loops vectorize to it too)
template <class T, class F> void for_images_lanes(const Window2D& w, F&& fn) {
    for_images(w, double(w.B) * w.out_pixels() * w.KH * w.KW * w.C, [&](int b0, int b1) {
        on_widest_lanes<T>([&](auto lanes) __attribute__((always_inline)) { fn(b0, b1, lanes); });
    });
}

// visit_windows over every image, split across threads
template <class T, class Visit> void for_windows(const Window2D& w, Visit&& visit) {
    for_images_lanes<T>(w, [&](int b0, int b1, auto) __attribute__((always_inline)) { visit_windows(w, b0, b1, visit); });
}

// Keeps GCC from merging the vector selects around it into one select on a combined condition, which
// it compiles to a scalar comparison per lane when a part of it tests for NaN
template <class V> ATTNX_ALWAYS_INLINE void barrier(V& v) { asm("" : "+v"(v)); }

// The lanes of v that are NaN (an integer test on the bits: see barrier)
template <class V> ATTNX_ALWAYS_INLINE auto nan_lanes(V v) {
    if constexpr (Lanes<V>::W == 1) {
        return v != v;
    } else {
        typename Lanes<V>::I bits;
        std::memcpy(&bits, &v, sizeof bits);
        return (bits & 0x7fffffff) > 0x7f800000;
    }
}

// v where v > best or v is NaN, else best: the running maximum in which the last NaN wins
template <class V> ATTNX_ALWAYS_INLINE V max_nan_wins(V best, V v) {
    best = v > best ? v : best;
    barrier(best);
    return nan_lanes(v) ? v : best;
}

// `unsent` in the lanes where v is the window's maximum best (equal, or both NaN), else 0
template <class V> ATTNX_ALWAYS_INLINE V maximum_lanes(V v, V best, V unsent) {
    V taken = v == best ? unsent : V{}, if_nan = nan_lanes(v) ? unsent : V{};
    barrier(taken), barrier(if_nan);
    return nan_lanes(best) ? if_nan : taken;
}

// reference: cpp/reference/conv.hpp, pool2d_forward
// y[b, oh, ow, c] = max over the window's pixels inside the image of x[b, ih, iw, c] (a NaN wins)
template <class T> void max_pool2d_forward(T* y, const T* x, const Window2D& w) {
    const int C = w.C;
    for_images_lanes<T>(w, [&](int b0, int b1, auto lanes) __attribute__((always_inline)) {
        using V = decltype(lanes);
        constexpr int W = Lanes<V>::W;
        visit_windows(w, b0, b1, [&](int b, int oh, int ow, Span rows, Span cols) __attribute__((always_inline)) {
            T* out = y + (((size_t)b * w.OH + oh) * w.OW + ow) * C;
            for (int c = 0; c < C; c += W) {
                const int m = std::min(W, C - c);
                V best = vload<V>(x + window_pixel(w, b, oh, ow, rows.lo, cols.lo) + c, m);
                for (int i = rows.lo; i < rows.hi; ++i)
                    for (int j = cols.lo; j < cols.hi; ++j) {
                        const V v = vload<V>(x + window_pixel(w, b, oh, ow, i, j) + c, m);
                        best = max_nan_wins(best, v);
                    }
                vstore(out + c, best, m);
            }
        });
    });
}

// reference: cpp/reference/conv.hpp, pool2d_backward
// dx[b, ih, iw, c] = sum of dy[b, oh, ow, c] over the windows whose maximum y[b, oh, oh, c] (the
// forward's output) x[b, ih, iw, c] is: the first pixel equal to it in window order, as
// max_pool2d_forward took it. Selects on channel vectors (tracking an argmax took a branch per value,
// mispredicted on random inputs). Windows that tile the image exactly write dx once; others add into
// a zeroed dx.
template <class T> void max_pool2d_backward(T* dx, const T* dy, const T* x, const T* y, const Window2D& w) {
    const int C = w.C;
    const bool tiles = w.SH == w.KH && w.SW == w.KW && w.pad_top == 0 && w.pad_left == 0 && w.OH * w.KH == w.H &&
                       w.OW * w.KW == w.W;
    if (!tiles) std::fill(dx, dx + (size_t)w.B * w.in_pixels() * C, T(0));
    for_images_lanes<T>(w, [&](int b0, int b1, auto lanes) __attribute__((always_inline)) {
        using V = decltype(lanes);
        constexpr int W = Lanes<V>::W;
        visit_windows(w, b0, b1, [&](int b, int oh, int ow, Span rows, Span cols) __attribute__((always_inline)) {
            const size_t o = (((size_t)b * w.OH + oh) * w.OW + ow) * C;
            for (int c = 0; c < C; c += W) {
                const int m = std::min(W, C - c);
                const V g = vload<V>(dy + o + c, m), best = vload<V>(y + o + c, m);
                V unsent = vbroadcast<V>(T(1));  // 1 until dy went to this channel's maximum
                for (int i = rows.lo; i < rows.hi; ++i)
                    for (int j = cols.lo; j < cols.hi; ++j) {
                        T* to = dx + window_pixel(w, b, oh, ow, i, j) + c;
                        const V v = vload<V>(x + window_pixel(w, b, oh, ow, i, j) + c, m);
                        const V taken = maximum_lanes(v, best, unsent);
                        const V share = taken != V{} ? g : V{};
                        vstore(to, tiles ? share : vload<V>(to, m) + share, m);
                        unsent = taken != V{} ? V{} : unsent;
                    }
            }
        });
    });
}

// reference: cpp/reference/conv.hpp, pool2d_forward
// y[b, oh, ow, c] = mean over the window's pixels inside the image of x[b, ih, iw, c]
template <class T> void avg_pool2d_forward(T* y, const T* x, const Window2D& w) {
    const int C = w.C;
    for_windows<T>(w, [&](int b, int oh, int ow, Span rows, Span cols) __attribute__((always_inline)) {
        T* out = y + (((size_t)b * w.OH + oh) * w.OW + ow) * C;
        std::fill(out, out + C, T(0));
        for (int i = rows.lo; i < rows.hi; ++i)
            for (int j = cols.lo; j < cols.hi; ++j) {
                const T* in = x + window_pixel(w, b, oh, ow, i, j);
                for (int c = 0; c < C; ++c) out[c] += in[c];
            }
        const T scale = T(1) / T((rows.hi - rows.lo) * (cols.hi - cols.lo));
        for (int c = 0; c < C; ++c) out[c] *= scale;
    });
}

// reference: cpp/reference/conv.hpp, pool2d_backward
// dx[b, ih, iw, c] = sum of dy[b, oh, ow, c] / (the window's pixel count) over the windows holding
// (ih, iw) (dx overwritten)
template <class T> void avg_pool2d_backward(T* dx, const T* dy, const Window2D& w) {
    const int C = w.C;
    std::fill(dx, dx + (size_t)w.B * w.in_pixels() * C, T(0));
    for_windows<T>(w, [&](int b, int oh, int ow, Span rows, Span cols) __attribute__((always_inline)) {
        const T* g = dy + (((size_t)b * w.OH + oh) * w.OW + ow) * C;
        const T scale = T(1) / T((rows.hi - rows.lo) * (cols.hi - cols.lo));
        for (int i = rows.lo; i < rows.hi; ++i)
            for (int j = cols.lo; j < cols.hi; ++j) {
                T* to = dx + window_pixel(w, b, oh, ow, i, j);
                for (int c = 0; c < C; ++c) to[c] += g[c] * scale;
            }
    });
}

}  // namespace attnx
