// 2-D convolution and pooling over channels-last images (Keras' layout): x (B, H, W, C), kernel
// (KH, KW, C, F) as Keras stores it, outputs (B, OH, OW, F).
//
// Plan: the convolution is an im2col product. The rows of the output, r = (b * OH + oh) * OW + ow,
// are walked in blocks of a few hundred KiB of patches (one row of KH * KW * C values per output
// pixel, the kernel's (i, j, c) order, zero where the window leaves the image). Each block's
// patches meet the kernel, read as a (KH * KW * C, F) matrix and packed once per call, in the
// register tiles of packed.hpp, and the activation runs on the block while it is in cache (relu as
// the product stores it); backward multiplies dz by the kernel's transpose the same way and takes the
// kernel gradient, a reduction over the rows, on the same tiles as dK^T = dz^T . patches, the patches
// read in place as the right operand. The tiles beat OpenBLAS on bench_cnn's layers (3.8x for a
// 9 x 16 kernel, 1.2x for 144 x 32: OpenBLAS repacks both operands on every call).
// Images are split across the thread budget (parallel_for), so that the input gradient each thread
// scatters back (col2im) stays in its own images; each thread sums its kernel gradient apart and
// adds it under a lock. A 1x1 kernel with stride 1 multiplies the input itself.
// Pooling reads windows of the same geometry; padded positions are never part of a window (max
// ignores them, the average divides by the real pixels only), as in TensorFlow.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnx/activations.hpp"
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

// For the n output rows r = (b * OH + oh) * OW + ow from r0, in order (k = r - r0): clipped(k) when
// the window of row k leaves the image, then segment(k, x_offset, patch_offset, count) for each of
// its window rows inside the image: the count values at x[x_offset] inside the image are those at
// patch_offset in the patch (row k of im2col). The pixels of one output row run in an inner loop with
// no division (bookkeeping per pixel cost more than copying a patch whose window rows are 3 values).
template <class Clipped, class Segment>
ATTNX_ALWAYS_INLINE void walk_window_rows(const Window2D& w, size_t r0, int n, Clipped&& clipped, Segment&& segment) {
    const int C = w.C, KW = w.KW;
    const size_t row_values = (size_t)KW * C;
    size_t b = r0 / w.out_pixels();
    int oh = int(r0 / w.OW % w.OH), ow0 = int(r0 % w.OW);
    for (int k = 0; k < n;) {
        const int run = std::min(n - k, w.OW - ow0);  // output pixels left in this output row
        const Span rows = inside(oh, w.SH, w.pad_top, w.KH, w.H);
        // window row i of output pixel ow starts at x offset top + i * W * C + left (may be negative
        // outside the image: offsets, not pointers)
        const ptrdiff_t top = ((ptrdiff_t)(b * w.H) + oh * w.SH - w.pad_top) * w.W * C;
        for (int ow = ow0; ow < ow0 + run; ++ow, ++k) {
            const Span cols = inside(ow, w.SW, w.pad_left, KW, w.W);
            const ptrdiff_t left = (ptrdiff_t)(ow * w.SW - w.pad_left + cols.lo) * C;
            const size_t count = (size_t)(cols.hi - cols.lo) * C;
            if (rows.hi - rows.lo < w.KH || cols.hi - cols.lo < KW) clipped(k);
            for (int i = rows.lo; i < rows.hi; ++i)
                segment(k, (size_t)(top + (ptrdiff_t)i * w.W * C + left), i * row_values + (size_t)cols.lo * C, count);
        }
        ow0 += run;
        if (ow0 == w.OW) {
            ow0 = 0;
            if (++oh == w.OH) oh = 0, ++b;
        }
    }
}

// The offset in x of pixel (i, j) of output pixel (oh, ow)'s window in image b (inside the image)
inline size_t window_pixel(const Window2D& w, size_t b, int oh, int ow, int i, int j) {
    return ((b * w.H + (size_t)(oh * w.SH - w.pad_top + i)) * w.W + (size_t)(ow * w.SW - w.pad_left + j)) * w.C;
}

// cols[r - r0, (i * KW + j) * C + c] = x[b, oh * SH - pad_top + i, ow * SW - pad_left + j, c], 0 outside
// the image, for the n output rows r = (b * OH + oh) * OW + ow from r0: one copy per window row. The
// copies stay loops (GCC would call memmove for each window row: 3 values for a 3x3 kernel on one
// channel, where the call costs more than the copy; masked AVX-512 copies were slower too).
template <class T>
__attribute__((optimize("no-tree-loop-distribute-patterns"))) void im2col(T* cols, const T* x, const Window2D& w,
                                                                           size_t r0, int n) {
    const int P = w.patch();
    walk_window_rows(
        w, r0, n,
        [&](int k) __attribute__((always_inline)) {
            for (int e = 0; e < P; ++e) cols[(size_t)k * P + e] = T(0);
        },
        [&](int k, size_t from, size_t at, size_t count) __attribute__((always_inline)) {
            T* to = cols + (size_t)k * P + at;
            for (size_t e = 0; e < count; ++e) to[e] = x[from + e];
        });
}

// The transpose of im2col: dx[b, ih, iw, c] += dcols[r - r0, (i * KW + j) * C + c] over the same rows
template <class T> void col2im_add(T* dx, const T* dcols, const Window2D& w, size_t r0, int n) {
    const int P = w.patch();
    walk_window_rows(
        w, r0, n, [](int) {},
        [&](int k, size_t to, size_t at, size_t count) __attribute__((always_inline)) {
            const T* from = dcols + (size_t)k * P + at;
            for (size_t e = 0; e < count; ++e) dx[to + e] += from[e];
        });
}

// fn(b0, b1) over the images, split across the thread budget (`work`: multiply-adds)
template <class F> void for_images(const Window2D& w, double work, F&& fn) {
    parallel_for((size_t)w.B, work, [&](size_t b0, size_t b1) { fn((int)b0, (int)b1); });
}

// fn(r0, n) over the output rows of images [b0, b1) in blocks whose patches take about 256 KiB
template <class T, class F> void for_row_blocks(const Window2D& w, int b0, int b1, F&& fn) {
    const size_t rows = std::max<size_t>(64, (size_t(1) << 16) * 4 / sizeof(T) / std::max(w.patch(), 1)) / 16 * 16;
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
// in panels of Q vectors V; bias may be null. `relu`: out = max(out, 0) as it is stored (a NaN stays).
template <class V, int Q, class T>
ATTNX_ALWAYS_INLINE void packed_rows(T* out, const T* left, int rows, const PackedRight<T>& B, const T* bias,
                                     bool relu) {
    constexpr int W = Lanes<V>::W;
    const int N = B.N;
    panels_product<V, Q>(0, rows, LeftRows<T>{left, (size_t)B.K, B.K, nullptr, 0, 0},
                         packed_panels(B.panels.data(), B.K, N, Q * W, W), 0, N,
                         [&](int r, auto pre, int p) __attribute__((always_inline)) {
                             for (int q = 0; q < pre.count && (p * Q + q) * W < N; ++q) {
                                 const int n0 = (p * Q + q) * W, m = std::min(W, N - n0);
                                 if (bias) pre.q[q] += vload<V>(bias + n0, m);
                                 if (relu) pre.q[q] = pre.q[q] < T(0) ? V{} : pre.q[q];
                                 vstore(out + (size_t)r * N + n0, pre.q[q], m);
                             }
                         });
}

// packed_rows on the widest vectors this CPU runs (those B was packed for)
template <class T>
void packed_rows(T* out, const T* left, int rows, const PackedRight<T>& B, const T* bias, bool relu = false) {
    on_widest_lanes<T>([&](auto lanes) __attribute__((always_inline)) {
        using V = decltype(lanes);
        if (B.Q == 1) packed_rows<V, 1>(out, left, rows, B, bias, relu);
        else if (B.Q == 2) packed_rows<V, 2>(out, left, rows, B, bias, relu);
        else packed_rows<V, 3>(out, left, rows, B, bias, relu);
    });
}

// z[b, oh, ow, f] = bias[f] + sum_{i, j, c} x[b, oh * SH - pad_top + i, ow * SW - pad_left + j, c] K[i, j, c, f]
// y = act(z) (y may alias z: gelu's backward alone needs z). bias may be null. relu runs as the
// product stores z when y is z.
template <class T>
void conv2d_forward(T* y, T* z, const T* x, const T* kernel, const T* bias, const Window2D& w, int F, Activation act) {
    const int P = w.patch();
    if (F == 0) return;  // no output (and the patches of a kernel of no filters may be any size)
    const bool fused_relu = act == Activation::relu && y == z;
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
            packed_rows(z + r0 * F, patches, n, packed_kernel, bias, fused_relu);
            if (!fused_relu) activation_forward<T>(y + r0 * F, z + r0 * F, (size_t)n, (size_t)F, act);
        });
    });
}

// The widest vectors' lanes: the padding a matrix read in place as panels needs past its end
constexpr int kMaxLanes = 16;

// dKt[f, p] += sum_k dzt[f, k] cols[k, p] for a block of n rows: dzt (F, n) rows ldz apart, cols
// (n, P) read in place as panels of Q vectors (no packing: its rows are the panels' rows, P apart).
// A row's last vector may run past P into the next row (cols holds kMaxLanes values more at its end);
// those lanes are dropped.
template <class T> void kernel_gradient_rows(T* dKt, const T* dzt, size_t ldz, const T* cols, int n, int P, int F) {
    on_widest_lanes<T>([&](auto lanes) __attribute__((always_inline)) {
        using V = decltype(lanes);
        constexpr int W = Lanes<V>::W;
        auto product = [&](auto vectors) __attribute__((always_inline)) {
            constexpr int Q = decltype(vectors)::value;
            panels_product<V, Q>(0, F, LeftRows<T>{dzt, ldz, n, nullptr, 0, 0},
                                 RightPanels<T>{cols, (size_t)P, (size_t)Q * W, (size_t)P}, 0, P,
                                 [&](int f, auto pre, int p) __attribute__((always_inline)) {
                                     for (int q = 0; q < pre.count && (p * Q + q) * W < P; ++q) {
                                         T* to = dKt + (size_t)f * P + (p * Q + q) * W;
                                         const int m = std::min(W, P - (p * Q + q) * W);
                                         vstore(to, vload<V>(to, m) + pre.q[q], m);
                                     }
                                 });
        };
        const int Q = tile_vectors(P, W);
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

// Backward of conv2d_forward from dy and the forward's y and z: dz = dy * act'(z),
// dK[i, j, c, f] += sum_{b, oh, ow} patch[b, oh, ow][i, j, c] dz[b, oh, ow, f], dbias[f] += sum dz[..., f],
// dx = col2im(dz . K^T) (overwritten; null: not computed). dbias may be null.
// The kernel gradient is taken transposed, dK^T (F, P) = dz^T . patches, so that the patches are the
// right operand as im2col wrote them and only dz (F values a row against P) is transposed.
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
        // this thread's images' share of dK^T and dbias, added in at the end
        std::vector<T> dKt((size_t)F * P, T(0)), db(F, T(0)), cols, dcols, dz;
        Panels<T> dzt;
        // col2im adds into dx; a 1x1 kernel's product writes it whole
        if (dx && !w.identity_patches()) std::fill(dx + b0 * in_image, dx + b1 * in_image, T(0));
        for_row_blocks<T>(w, b0, b1, [&](size_t r0, int n) {
            dz.resize((size_t)n * F);
            activation_backward<T>(dz.data(), dy + r0 * F, z + r0 * F, y + r0 * F, (size_t)n, (size_t)F, act);
            add_column_sums(db.data(), dz.data(), n, F);
            cols.resize((size_t)n * P + kMaxLanes);
            // a 1x1 kernel's patches are x itself, copied for the padding the in-place read runs into
            if (w.identity_patches()) std::copy(x + r0 * P, x + (r0 + n) * P, cols.data());
            else im2col(cols.data(), x, w, r0, n);
            // dz^T (F, n), its rows padded to whole 4-lane blocks (the transpose runs on 4 x 4 blocks)
            pack_panels_t(dzt, dz.data(), (size_t)F, F, n, n, 4);
            kernel_gradient_rows(dKt.data(), dzt.data(), (size_t)last_panel_width(n, n, 4), cols.data(), n, P, F);
            if (!dx) return;
            if (w.identity_patches()) return packed_rows(dx + r0 * P, dz.data(), n, packed_kernel_t, (const T*)nullptr);
            dcols.resize((size_t)n * P);
            packed_rows(dcols.data(), dz.data(), n, packed_kernel_t, (const T*)nullptr);
            col2im_add(dx, dcols.data(), w, r0, n);
        });
        std::lock_guard<std::mutex> hold(sum_lock);
        for (int p = 0; p < P; ++p)
            for (int f = 0; f < F; ++f) dkernel[(size_t)p * F + f] += dKt[(size_t)f * P + p];
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
