// 2-D convolution and pooling over channels-last images (Keras' layout): x (B, H, W, C), kernel
// (KH, KW, C, F) as Keras stores it, outputs (B, OH, OW, F).
//
// Plan: the convolution is an im2col product. The rows of the output, r = (b * OH + oh) * OW + ow,
// are walked in blocks of a few hundred KiB of patches (one row of KH * KW * C values per output
// pixel, the kernel's (i, j, c) order, zero where the window leaves the image). Each block's
// patches meet the kernel, read as a (KH * KW * C, F) matrix and packed once per call, in the
// register tiles of packed.hpp, and the activation runs on the block while it is in cache; backward
// multiplies dz by the kernel's transpose the same way and takes the kernel gradient, a reduction
// over the rows, from OpenBLAS (dense_backward). The tiles beat OpenBLAS on bench_cnn's layers
// (3.8x for a 9 x 16 kernel, 1.2x for 144 x 32: OpenBLAS repacks both operands on every call).
// Images are split across the thread budget (parallel_for), so that the input gradient each thread
// scatters back (col2im) stays in its own images; each thread sums its kernel gradient apart and
// adds it under a lock. A 1x1 kernel with stride 1 multiplies the input itself.
// Pooling reads windows of the same geometry; padded positions are never part of a window (max
// ignores them, the average divides by the real pixels only), as in TensorFlow.
#pragma once
#include <algorithm>
#include <cstddef>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnx/activations.hpp"
#include "attnx/dense.hpp"
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
    // the patches are the input itself
    bool identity_patches() const { return KH == 1 && KW == 1 && SH == 1 && SW == 1; }
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

// visit(k, b, oh, ow, rows, cols) for the n output rows r = (b * OH + oh) * OW + ow from r0, in order
// (k = r - r0), with the window offsets inside the image; no division per row (three cost more than
// a row's copy)
template <class Visit> ATTNX_ALWAYS_INLINE void walk_rows(const Window2D& w, size_t r0, int n, Visit&& visit) {
    size_t b = r0 / w.out_pixels();
    int oh = int(r0 / w.OW % w.OH), ow = int(r0 % w.OW);
    Span rows = inside(oh, w.SH, w.pad_top, w.KH, w.H);
    for (int k = 0; k < n; ++k) {
        visit(k, b, oh, ow, rows, inside(ow, w.SW, w.pad_left, w.KW, w.W));
        if (++ow < w.OW) continue;
        ow = 0;
        if (++oh == w.OH) oh = 0, ++b;
        rows = inside(oh, w.SH, w.pad_top, w.KH, w.H);
    }
}

// The offset in x of pixel (i, j) of output pixel (oh, ow)'s window in image b (inside the image)
inline size_t window_pixel(const Window2D& w, size_t b, int oh, int ow, int i, int j) {
    return ((b * w.H + (size_t)(oh * w.SH - w.pad_top + i)) * w.W + (size_t)(ow * w.SW - w.pad_left + j)) * w.C;
}

// cols[r - r0, (i * KW + j) * C + c] = x[b, oh * SH - pad_top + i, ow * SW - pad_left + j, c], 0 outside
// the image, for the n output rows r = (b * OH + oh) * OW + ow from r0. The copies stay loops (GCC
// would call memmove for each window row: 3 values for a 3x3 kernel on one channel, where the
// calls cost more than the copy)
template <class T>
__attribute__((optimize("no-tree-loop-distribute-patterns"))) void im2col(T* cols, const T* x, const Window2D& w,
                                                                           size_t r0, int n) {
    const int C = w.C, P = w.patch();
    walk_rows(w, r0, n, [&](int k, size_t b, int oh, int ow, Span rows, Span cols_) __attribute__((always_inline)) {
        T* out = cols + (size_t)k * P;
        if (rows.hi - rows.lo < w.KH || cols_.hi - cols_.lo < w.KW)
            for (int e = 0; e < P; ++e) out[e] = T(0);
        const size_t count = (size_t)(cols_.hi - cols_.lo) * C;
        for (int i = rows.lo; i < rows.hi; ++i) {
            const T* in = x + window_pixel(w, b, oh, ow, i, cols_.lo);
            T* to = out + ((size_t)i * w.KW + cols_.lo) * C;
            for (size_t e = 0; e < count; ++e) to[e] = in[e];
        }
    });
}

// The transpose of im2col: dx[b, ih, iw, c] += dcols[r - r0, (i * KW + j) * C + c] over the same rows
template <class T> void col2im_add(T* dx, const T* dcols, const Window2D& w, size_t r0, int n) {
    const int C = w.C, P = w.patch();
    walk_rows(w, r0, n, [&](int k, size_t b, int oh, int ow, Span rows, Span cols_) __attribute__((always_inline)) {
        const size_t count = (size_t)(cols_.hi - cols_.lo) * C;
        for (int i = rows.lo; i < rows.hi; ++i) {
            T* to = dx + window_pixel(w, b, oh, ow, i, cols_.lo);
            const T* from = dcols + (size_t)k * P + ((size_t)i * w.KW + cols_.lo) * C;
            for (size_t e = 0; e < count; ++e) to[e] += from[e];
        }
    });
}

// fn(b0, b1) over the images, split across the thread budget (`work`: multiply-adds)
template <class F> void for_images(const Window2D& w, double work, F&& fn) {
    parallel_for((size_t)w.B, work, [&](size_t b0, size_t b1) { fn((int)b0, (int)b1); });
}

// fn(r0, n) over the output rows of images [b0, b1) in blocks whose patches take about 256 KiB
template <class T, class F> void for_row_blocks(const Window2D& w, int b0, int b1, F&& fn) {
    const size_t rows = std::max<size_t>(64, (size_t(1) << 16) * 4 / sizeof(T) / std::max(w.patch(), 1));
    const size_t end = (size_t)b1 * w.out_pixels();
    for (size_t r0 = (size_t)b0 * w.out_pixels(); r0 < end; r0 += rows) fn(r0, (int)std::min(rows, end - r0));
}

// ---------------------------------------------------------------------------------- Conv2D
// Vectors per panel of a packed right operand of N columns for vectors of `lanes`
inline int tile_vectors(int N, int lanes) { return std::clamp((N + lanes - 1) / lanes, 1, 3); }

// A right operand B (K, N) packed for packed_rows: `transposed` packs it from B^T (N, K)
template <class T> struct PackedRight {
    Panels<T> panels;
    int K, N, Q;
    PackedRight(const T* B, int K_, int N_, bool transposed, int lanes = tile_lanes<T>())
        : K(K_), N(N_), Q(tile_vectors(N_, lanes)) {
        if (transposed) pack_panels_t(panels, B, (size_t)K, K, N, Q * lanes, lanes);
        else pack_panels(panels, B, (size_t)N, K, N, Q * lanes, lanes);
    }
};

// out[r, n] = bias[n] + sum_k left[r, k] B[k, n] for the `rows` rows of left (K values each), B packed
// in panels of Q vectors V; bias may be null
template <class V, int Q, class T>
ATTNX_ALWAYS_INLINE void packed_rows(T* out, const T* left, int rows, const PackedRight<T>& B, const T* bias) {
    constexpr int W = Lanes<V>::W;
    const int N = B.N;
    panels_product<V, Q>(0, rows, LeftRows<T>{left, (size_t)B.K, B.K, nullptr, 0, 0},
                         packed_panels(B.panels.data(), B.K, N, Q * W, W), 0, N,
                         [&](int r, auto pre, int p) __attribute__((always_inline)) {
                             for (int q = 0; q < pre.count && (p * Q + q) * W < N; ++q) {
                                 const int n0 = (p * Q + q) * W, m = std::min(W, N - n0);
                                 if (bias) pre.q[q] += vload<V>(bias + n0, m);
                                 vstore(out + (size_t)r * N + n0, pre.q[q], m);
                             }
                         });
}

// packed_rows on the widest vectors this CPU runs (those B was packed for)
template <class T> void packed_rows(T* out, const T* left, int rows, const PackedRight<T>& B, const T* bias) {
    on_widest_lanes<T>([&](auto lanes) __attribute__((always_inline)) {
        using V = decltype(lanes);
        if (B.Q == 1) packed_rows<V, 1>(out, left, rows, B, bias);
        else if (B.Q == 2) packed_rows<V, 2>(out, left, rows, B, bias);
        else packed_rows<V, 3>(out, left, rows, B, bias);
    });
}

// z[b, oh, ow, f] = bias[f] + sum_{i, j, c} x[b, oh * SH - pad_top + i, ow * SW - pad_left + j, c] K[i, j, c, f]
// y = act(z) (y may alias z: gelu's backward alone needs z). bias may be null.
template <class T>
void conv2d_forward(T* y, T* z, const T* x, const T* kernel, const T* bias, const Window2D& w, int F, Activation act) {
    const int P = w.patch();
    if (F == 0) return;  // no output (and the patches of a kernel of no filters may be any size)
    const PackedRight<T> packed_kernel(kernel, P, F, false);
    for_images(w, double(w.B) * w.out_pixels() * P * F, [&](int b0, int b1) {
        std::vector<T> cols;
        for_row_blocks<T>(w, b0, b1, [&](size_t r0, int n) {
            const T* patches = x + r0 * P;
            if (!w.identity_patches()) {
                cols.resize((size_t)n * P);
                im2col(cols.data(), x, w, r0, n);
                patches = cols.data();
            }
            packed_rows(z + r0 * F, patches, n, packed_kernel, bias);
            activation_forward<T>(y + r0 * F, z + r0 * F, (size_t)n, (size_t)F, act);
        });
    });
}

// Backward of conv2d_forward from dy and the forward's y and z: dz = dy * act'(z),
// dK[i, j, c, f] += sum_{b, oh, ow} patch[b, oh, ow][i, j, c] dz[b, oh, ow, f], dbias[f] += sum dz[..., f],
// dx = col2im(dz . K^T) (overwritten; null: not computed). dbias may be null.
template <class T>
void conv2d_backward(T* dx, T* dkernel, T* dbias, const T* dy, const T* x, const T* kernel, const T* y, const T* z,
                     const Window2D& w, int F, Activation act) {
    const int P = w.patch();
    const size_t in_image = w.in_pixels() * w.C;
    if (F == 0) {  // no output: no gradient, and no patches to read
        if (dx) std::fill(dx, dx + w.B * in_image, T(0));
        return;
    }
    // K^T (F, P), for dpatches = dz . K^T
    const PackedRight<T> packed_kernel_t(kernel, F, P, true);
    std::mutex sum_lock;
    for_images(w, double(w.B) * w.out_pixels() * P * F * (dx ? 2 : 1), [&](int b0, int b1) {
        // this thread's images' share of the kernel and bias gradients, added in at the end
        const bool alone = b0 == 0 && b1 == w.B;
        std::vector<T> sums(alone ? 0 : (size_t)(P + 1) * F, T(0)), cols, dcols, dz;
        T* dK = alone ? dkernel : sums.data();
        T* db = alone ? dbias : dbias ? sums.data() + (size_t)P * F : nullptr;
        if (dx) std::fill(dx + b0 * in_image, dx + b1 * in_image, T(0));
        for_row_blocks<T>(w, b0, b1, [&](size_t r0, int n) {
            dz.resize((size_t)n * F);
            activation_backward<T>(dz.data(), dy + r0 * F, z + r0 * F, y + r0 * F, (size_t)n, (size_t)F, act);
            const T* patches = x + r0 * P;
            if (!w.identity_patches()) {
                cols.resize((size_t)n * P);
                im2col(cols.data(), x, w, r0, n);
                patches = cols.data();
            }
            dense_backward<T>(nullptr, dK, db, dz.data(), patches, kernel, n, P, F);
            if (!dx) return;
            if (w.identity_patches()) return packed_rows(dx + r0 * P, dz.data(), n, packed_kernel_t, (const T*)nullptr);
            dcols.resize((size_t)n * P);
            packed_rows(dcols.data(), dz.data(), n, packed_kernel_t, (const T*)nullptr);
            col2im_add(dx, dcols.data(), w, r0, n);
        });
        if (alone) return;
        std::lock_guard<std::mutex> hold(sum_lock);
        for (size_t e = 0; e < (size_t)P * F; ++e) dkernel[e] += dK[e];
        if (dbias)
            for (int f = 0; f < F; ++f) dbias[f] += db[f];
    });
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

// fn(b0, b1) over the images split across threads, each inside on_widest_lanes (the channel loops
// then vectorize to each level's width)
template <class T, class F> void for_images_lanes(const Window2D& w, F&& fn) {
    for_images(w, double(w.B) * w.out_pixels() * w.KH * w.KW * w.C, [&](int b0, int b1) {
        on_widest_lanes<T>([&](auto) __attribute__((always_inline)) { fn(b0, b1); });
    });
}

// visit_windows over every image, split across threads
template <class T, class Visit> void for_windows(const Window2D& w, Visit&& visit) {
    for_images_lanes<T>(w, [&](int b0, int b1) __attribute__((always_inline)) { visit_windows(w, b0, b1, visit); });
}

// out[c] = max over the pixels inside the image of output pixel (oh, ow)'s window of x[b, ih, iw, c]
// (a NaN wins)
template <class T>
ATTNX_ALWAYS_INLINE void window_max(T* out, const T* x, const Window2D& w, size_t b, int oh, int ow, Span rows,
                                    Span cols) {
    const T* first = x + window_pixel(w, b, oh, ow, rows.lo, cols.lo);
    std::copy(first, first + w.C, out);
    for (int i = rows.lo; i < rows.hi; ++i)
        for (int j = cols.lo; j < cols.hi; ++j) {
            const T* in = x + window_pixel(w, b, oh, ow, i, j);
            for (int c = 0; c < w.C; ++c) out[c] = in[c] > out[c] || in[c] != in[c] ? in[c] : out[c];
        }
}

// y[b, oh, ow, c] = max over the window's pixels inside the image of x[b, ih, iw, c] (a NaN wins)
template <class T> void max_pool2d_forward(T* y, const T* x, const Window2D& w) {
    for_windows<T>(w, [&](int b, int oh, int ow, Span rows, Span cols) __attribute__((always_inline)) {
        window_max(y + (((size_t)b * w.OH + oh) * w.OW + ow) * w.C, x, w, b, oh, ow, rows, cols);
    });
}

// dx[b, ih, iw, c] = sum of dy[b, oh, ow, c] over the windows whose maximum x[b, ih, iw, c] is: the
// first maximum in window order, as max_pool2d_forward took it (dx overwritten). Each window's maximum
// first, then dy to the first pixel equal to it: selects on the channel vectors where tracking the
// argmax took a branch per value (mispredicted on random inputs, 15x slower).
template <class T> void max_pool2d_backward(T* dx, const T* dy, const T* x, const Window2D& w) {
    const int C = w.C;
    std::fill(dx, dx + (size_t)w.B * w.in_pixels() * C, T(0));
    for_images_lanes<T>(w, [&](int b0, int b1) __attribute__((always_inline)) {
        std::vector<T> best(C), unsent(C);  // per channel: the window's maximum, 1 until dy went to it
        visit_windows(w, b0, b1, [&](int b, int oh, int ow, Span rows, Span cols) __attribute__((always_inline)) {
            window_max(best.data(), x, w, b, oh, ow, rows, cols);
            std::fill(unsent.begin(), unsent.end(), T(1));
            const T* g = dy + (((size_t)b * w.OH + oh) * w.OW + ow) * C;
            for (int i = rows.lo; i < rows.hi; ++i)
                for (int j = cols.lo; j < cols.hi; ++j) {
                    const size_t p = window_pixel(w, b, oh, ow, i, j);
                    for (int c = 0; c < C; ++c) {
                        const T v = x[p + c], m = best[c];
                        const bool hit = unsent[c] != T(0) && (v == m || (v != v && m != m));
                        dx[p + c] += hit ? g[c] : T(0);
                        unsent[c] = hit ? T(0) : unsent[c];
                    }
                }
        });
    });
}

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
