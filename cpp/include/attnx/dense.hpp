// Dense (fully connected) layer: y = act(x . W + b) over the last axis.
// x: (N, C) rows (leading axes flattened), W: (C, OC) as Keras stores it, b: (OC,).
#pragma once
#include <algorithm>
#include <cstdint>

#include "attnx/activations.hpp"
#include "attnx/gemm.hpp"
#include "attnx/packed.hpp"
#include "attnx/parallel.hpp"

namespace attnx {

// reference: cpp/reference/dense.hpp, dense_forward
// z[n, o] = b[o] + sum_c x[n, c] W[c, o]
template <class T>
void dense_forward(T* z, const T* x, const T* W, const T* b, int N, int C, int OC) {
    for (int n = 0; n < N; ++n) {
        T* zr = z + (size_t)n * OC;
        if (b) std::copy(b, b + OC, zr);
        else std::fill(zr, zr + OC, T(0));
    }
    matmul<T>(z, x, W, N, OC, C, false, false, T(1));
}

// reference: cpp/reference/dense.hpp, dense_forward
// y = act(z), z = x . W + b for N rows of x on W packed for the register tiles (W.K columns of x,
// W.N of z), in blocks of rows (each <= 1 MiB, so that the activation reads it while it is in cache)
// split across threads from kParallelProductMinWork on. y may alias z (relu then runs as z is stored).
template <class T>
void packed_dense_rows(T* y, T* z, const T* x, const PackedRight<T>& W, const T* b, int N, Activation act) {
    const int C = W.K, OC = W.N;
    const double work = double(N) * C * OC;
    const bool fused_relu = act == Activation::relu && y == z;
    const bool split = work >= kParallelProductMinWork;
    const size_t threads = split ? kernel_threads() : 1;
    const size_t per_thread = ((size_t)N + threads - 1) / threads;
    const int rows = (int)std::max<size_t>(16, std::min<size_t>((1 << 18) / std::max(OC, 1), per_thread));
    const size_t blocks = ((size_t)N + rows - 1) / rows;
    parallel_for(blocks, split ? work : 0.0, [&](size_t lo, size_t hi) {
        for (size_t block = lo; block < hi; ++block) {
            const size_t r0 = block * rows;
            const int r = std::min(rows, N - (int)r0);
            packed_rows<T>(z + r0 * OC, LeftRows<T>{x + r0 * C, (size_t)C, C, nullptr, 0, 0}, r, W, b,
                           fused_relu);
            if (!fused_relu) activation_forward<T>(y + r0 * OC, z + r0 * OC, (size_t)r, (size_t)OC, act);
        }
    });
}

// The rows [r, r + rest) of a step's product on one panel of Q vectors, rest < R, in one tile
// (packed.hpp's row_tile): every row shares each load of the panel. store(row, TileRow).
template <class V, int Q, int R, class T, class Store>
ATTNX_ALWAYS_INLINE void step_rows_tail(int rest, int r, const LeftRows<T>& left, const T* panel, size_t k_stride,
                                        Store& store) {
    if constexpr (R > 1)
        if (rest < R) return step_rows_tail<V, Q, R - 1>(rest, r, left, panel, k_stride, store);
    TileRow<V, Q> pre[R];
    row_tile<V, Q, R>(pre, left.from_row(r), panel, k_stride);
    for (int i = 0; i < R; ++i) store(r + i, pre[i]);
}

// The N rows of a step on one panel of Q vectors: tiles of the most rows the registers hold
// (AVX-512's 32: 6 rows of 3 vectors; 16 registers: 3), the rest in one smaller tile
template <class V, int Q, class T, class Store>
ATTNX_ALWAYS_INLINE void step_panel(int N, const LeftRows<T>& left, const T* panel, size_t k_stride, Store&& store) {
    constexpr int R = Lanes<V>::W == 16 ? 6 : 3;
    int r = 0;
    for (; r + R <= N; r += R) {
        TileRow<V, Q> pre[R];
        row_tile<V, Q, R>(pre, left.from_row(r), panel, k_stride);
        for (int i = 0; i < R; ++i) store(r + i, pre[i]);
    }
    if (r < N) step_rows_tail<V, Q, R - 1>(N - r, r, left, panel, k_stride, store);
}

// reference: cpp/reference/dense.hpp, dense_forward
// z[o] = b[o] + sum_c x[c] W[c, o] for one row and the columns [o_begin, o_end) of W (C rows, ldw
// apart), z and b indexed from o_begin: W streamed row after row, four rows at a time, into z's columns
// in blocks of 512 (2 KiB, in L1). When W's rows all sit alike in the cache lines (ldw a whole number of
// lines) but not at a line's start (a NumPy weight array may begin 16 or 32 bytes into one), the first
// block ends at the next line, so that the vectors of the others never straddle two lines (the product
// of a W 16 or 32 bytes off took 8-20% longer from L3 on Zen 5). Every column's sum runs in the same
// order whatever the blocks. Inline: its loops vectorize at the width of the on_widest_lanes copy that
// calls it (a recurrent step's one-row product, rnn.hpp, runs it per step on its own thread).
template <class T, int block = 512>
ATTNX_ALWAYS_INLINE void dense_row_columns(T* z, const T* x, const T* W, size_t ldw, const T* b, int C, int o_begin,
                                           int o_end) {
    constexpr size_t line = 64 / sizeof(T);  // values per cache line
    const size_t off_line = (reinterpret_cast<uintptr_t>(W + o_begin) / sizeof(T)) % line;
    const int first = off_line && ldw % line == 0 ? (int)(line - off_line) : block;
    for (int o0 = o_begin, width = 0; o0 < o_end; o0 += width) {
        width = std::min(o0 == o_begin ? first : block, o_end - o0);
        T* __restrict zb = z + (o0 - o_begin);
        const T* bb = b ? b + (o0 - o_begin) : nullptr;
        for (int o = 0; o < width; ++o) zb[o] = bb ? bb[o] : T(0);
        int c = 0;
        for (; c + 4 <= C; c += 4) {
            const T *w0 = W + (size_t)c * ldw + o0, *w1 = w0 + ldw, *w2 = w1 + ldw, *w3 = w2 + ldw;
            const T a0 = x[c], a1 = x[c + 1], a2 = x[c + 2], a3 = x[c + 3];
            for (int o = 0; o < width; ++o) zb[o] += a0 * w0[o] + a1 * w1[o] + a2 * w2[o] + a3 * w3[o];
        }
        for (; c < C; ++c) {
            const T* w0 = W + (size_t)c * ldw + o0;
            for (int o = 0; o < width; ++o) zb[o] += x[c] * w0[o];
        }
    }
}

// reference: cpp/reference/dense.hpp, dense_forward
// z[o] = b[o] + sum_c x[c] W[c, o] for one row (a greedy decoding step at batch 1): dense_row_columns
// over blocks of 512 columns split across threads. One row reads each weight once, so the product is
// the read of W: this reads W's rows whole (100-125 GB/s on Zen 5) where the tiles read 3 vectors of
// each row, OC apart (1.2-2.5x slower at one row; from two rows on the tiles' shared loads win).
template <class T> void dense_row_streamed(T* z, const T* x, const T* W, const T* b, int C, int OC) {
    constexpr int block = 512;
    const size_t blocks = (size_t)(OC + block - 1) / block;
    parallel_for(blocks, double(C) * OC, [&](size_t lo, size_t hi) {
        on_widest_lanes<T>([&](auto) __attribute__((always_inline)) {
            const int o0 = (int)lo * block, o1 = std::min(OC, (int)hi * block);
            dense_row_columns<T>(z + o0, x, W, (size_t)OC, b ? b + o0 : nullptr, C, o0, o1);
        });
    });
}

// z[:, o0:o1) = x W[:, o0:o1) + b[o0:o1) for N rows on the register tiles of packed.hpp, in panels of
// 3 vectors from o0 (o1 - o0 a whole number of vectors; z's rows OC apart): W's own rows in place (OC
// apart), or with `packed` (W packed once: packed.hpp's panels, o0 at one's start) a panel's rows one
// after another. The same tiles and sums either way, so the same bits. relu fused as the tiles are stored.
template <class T>
void rows_on_panels(T* z, const T* x, const T* W, const PackedRight<T>* packed, const T* b, int N, int C, int OC,
                    int o0, int o1, bool relu) {
    const LeftRows<T> left{x, (size_t)C, C, nullptr, 0, 0};
    on_widest_lanes<T>([&](auto lane) __attribute__((always_inline)) {
        using V = decltype(lane);
        constexpr int L = Lanes<V>::W, width = 3 * L;
        for (int n0 = o0; n0 < o1; n0 += width) {
            const int vectors = std::min(width, o1 - n0) / L;
            const T* panel = W + n0;
            size_t k_stride = (size_t)OC;
            if (packed) {  // panel n0 / width (a packed operand of fewer than 3 vectors is one panel, n0 = 0)
                const RightPanels<T> right = packed_panels(packed->panels.data(), C, OC, packed->Q * L, L);
                panel = right.data + (size_t)(n0 / width) * right.panel_stride;
                k_stride = n0 + width < OC ? right.k_stride : right.last_k_stride;
            }
            auto store = [&](int r, auto& pre) __attribute__((always_inline)) {
                for (int q = 0; q < pre.count; ++q) {
                    const int n = n0 + q * L;
                    if (b) pre.q[q] += vload<V>(b + n, L);
                    if (relu) pre.q[q] = pre.q[q] < T(0) ? V{} : pre.q[q];
                    vstore(z + (size_t)r * OC + n, pre.q[q], L);
                }
            };
            if (vectors == 3) step_panel<V, 3>(N, left, panel, k_stride, store);
            else if (vectors == 2) step_panel<V, 2>(N, left, panel, k_stride, store);
            else step_panel<V, 1>(N, left, panel, k_stride, store);
        }
    });
}

// Whether rows_on_panels can read W's columns [o0, o1) from `packed`: its panels those of the tiles
// (OC a whole number of vectors, else the tiles are not run), o0 at a panel's start and o1 at one's end
// or OC (a panel cut inside would be read with the narrowed last panel's stride)
template <class T> bool packed_panels_fit(const PackedRight<T>* packed, int OC, int o0, int o1) {
    const int lanes = tile_lanes<T>(), width = 3 * lanes;
    return packed && OC % lanes == 0 && o0 % width == 0 && (o1 == OC || (o1 - o0) % width == 0);
}

// reference: cpp/reference/dense.hpp, dense_forward
// z = act(x W + b) for a few rows (a decoding step's, a batch of one sentence), x (N, C), W (C, OC)
// row-major: the register tiles of packed.hpp read W's own rows in place (OC apart) instead of a
// packed copy, every row of a tile sharing each load. A few rows multiply each weight only a few
// times, so packing W per call (what BLAS does: 56% of a greedy step at batch 1 went to sgemm's copy
// of W) costs more than the product; a caller that multiplies by W many times may pass W packed once
// (`packed`: read by the tiles of more than one row, the same bits). Column panels split across threads
// when the caller is not already split. OC not a whole number of vectors (a tile would read past W's
// last row) goes to BLAS. act: relu fused, others applied after.
template <class T>
void dense_rows_in_place(T* z, const T* x, const T* W, const T* b, int N, int C, int OC, Activation act = Activation::linear,
                         const PackedRight<T>* packed = nullptr) {
    const int width = 3 * tile_lanes<T>();  // a panel of the tiles' vectors, as on_widest_lanes picks them
    const bool relu = act == Activation::relu;
    if (N == 1) {
        dense_row_streamed<T>(z, x, W, b, C, OC);
    } else if (OC % tile_lanes<T>()) {
        dense_forward<T>(z, x, W, b, N, C, OC);
    } else {
        if (!packed_panels_fit(packed, OC, 0, OC)) packed = nullptr;
        const int panels = (OC + width - 1) / width;
        parallel_for((size_t)panels, double(N) * C * OC, [&](size_t lo, size_t hi) {
            rows_on_panels<T>(z, x, W, packed, b, N, C, OC, (int)lo * width, std::min(OC, (int)hi * width), relu);
        });
        if (relu) return;
    }
    if (act != Activation::linear) activation_forward<T>(z, z, (size_t)N, (size_t)OC, act);
}

// reference: cpp/reference/dense.hpp, dense_forward
// The columns [o0, o1) of dense_rows_in_place's z = act(x W + b) (z and W OC apart), on the calling
// thread alone: one member's share of a product whose columns a team splits (decoder_step.hpp). One
// row streams W's rows (dense_row_columns), more rows run the tiles (on `packed` when it fits), or BLAS
// when o1 - o0 is not a whole number of vectors.
template <class T>
void dense_rows_in_place_columns(T* z, const T* x, const T* W, const T* b, int N, int C, int OC, int o0, int o1,
                                 Activation act = Activation::linear, const PackedRight<T>* packed = nullptr) {
    if (o0 >= o1) return;
    const bool relu = act == Activation::relu;
    bool fused = false;
    if (N == 1) {
        on_widest_lanes<T>([&](auto) __attribute__((always_inline)) {
            dense_row_columns<T>(z + o0, x, W, (size_t)OC, b ? b + o0 : nullptr, C, o0, o1);
        });
    } else if ((o1 - o0) % tile_lanes<T>() == 0) {
        rows_on_panels<T>(z, x, W, packed_panels_fit(packed, OC, o0, o1) ? packed : nullptr, b, N, C, OC, o0, o1, relu);
        fused = relu;
    } else {
        for (int n = 0; n < N; ++n) {
            T* zr = z + (size_t)n * OC;
            if (b) std::copy(b + o0, b + o1, zr + o0);
            else std::fill(zr + o0, zr + o1, T(0));
        }
        gemm<T>(false, false, N, o1 - o0, C, T(1), x, C, W + o0, OC, T(1), z + o0, OC);
    }
    if (act != Activation::linear && !fused)
        for (int n = 0; n < N; ++n) activation_forward<T>(z + (size_t)n * OC + o0, z + (size_t)n * OC + o0, 1, (size_t)(o1 - o0), act);
}

// reference: cpp/reference/dense.hpp, dense_forward
// y = act(z), z = x . W + b. Products of kPackedMinWork multiply-adds and more run on the register
// tiles with W packed once per call (packed_dense_rows): 360-450 GFLOP/s on 2 cores whether or not
// OpenBLAS is pinned to Haswell (OpenBLAS: 390-425 on its AVX-512 kernels, 215-230 pinned). Smaller
// ones go to OpenBLAS, which runs them on the calling thread with its small-matrix kernels (no
// packing). Neither wakes OpenBLAS' threads, which for a product this size took longer than the
// product (a CNN's last Dense, 64 x 2048 x 10, took 0.19 ms after the pooling layer before it,
// 0.03 ms alone). Fewer rows than packing W repays read W in place (dense_rows_in_place): below 64
// rows, or 256 when W fits in 256 KiB (one core's L2 share), measured 1.1-4x faster than packing
// on Zen 5 (a batch of one sentence, a decoding step); from there packing wins (0.8x at 512 rows of
// a 256 x 1024 W). y may alias z (gelu's backward needs z; every other activation's only y).
template <class T>
void dense_forward_rows(T* y, T* z, const T* x, const T* W, const T* b, int N, int C, int OC, Activation act) {
    if (double(N) * C * OC < kPackedMinWork) {
        dense_forward<T>(z, x, W, b, N, C, OC);
        activation_forward<T>(y, z, (size_t)N, (size_t)OC, act);
        return;
    }
    const bool few_rows = N < 64 || (N <= 256 && (size_t)C * OC * sizeof(T) <= (size_t(256) << 10));
    if (few_rows && OC % tile_lanes<T>() == 0) {  // (other widths: the packed tiles take any OC)
        dense_rows_in_place<T>(z, x, W, b, N, C, OC, y == z ? act : Activation::linear);
        if (y != z) activation_forward<T>(y, z, (size_t)N, (size_t)OC, act);
        return;
    }
    packed_dense_rows<T>(y, z, x, PackedRight<T>(W, C, OC, false), b, N, act);
}

// db[o] += sum_n dz[n, o] for dz (N, OC): blocks of 256 columns split across threads, each column's rows
// summed in order on the widest vectors (one thread's sums, bit for bit; on one thread the output
// bias's, 1536 x 8000, read 49 MB while the other core idled)
template <class T> void bias_gradient(T* db, const T* dz, int N, int OC) {
    constexpr int block = 256;
    parallel_for((size_t)(OC + block - 1) / block, double(N) * OC, [&](size_t lo, size_t hi) {
        on_widest_lanes<T>([&](auto) __attribute__((always_inline)) {
            const int o0 = (int)lo * block, o1 = std::min(OC, (int)hi * block);
            for (int n = 0; n < N; ++n) {
                const T* row = dz + (size_t)n * OC;
                for (int o = o0; o < o1; ++o) db[o] += row[o];
            }
        });
    });
}

// reference: cpp/reference/dense.hpp, dense_backward
// dx = dz . W^T (overwritten), dW += x^T . dz, db += sum_n dz[n, :]. dx may be null.
// The rows of dx and of dW are split across our threads (single-threaded BLAS each), as the
// forward's are: OpenBLAS' own threads, woken for these products, and ours, still spinning from the
// layer before, took the cores from each other (Luong's general score, fwd+bwd: 0.34 or 0.73 ms).
template <class T>
void dense_backward(T* dx, T* dW, T* db, const T* dz, const T* x, const T* W, int N, int C, int OC) {
    const size_t parts = kernel_threads();
    parallel_for(parts, 2.0 * N * C * OC, [&](size_t lo, size_t hi) {
        const int n0 = (int)(N * lo / parts), n1 = (int)(N * hi / parts);
        const int c0 = (int)(C * lo / parts), c1 = (int)(C * hi / parts);
        // dx[n0:n1] = dz[n0:n1] . W^T;  dW[c0:c1] += x[:, c0:c1]^T . dz
        if (dx)
            gemm<T>(false, true, n1 - n0, C, OC, T(1), dz + (size_t)n0 * OC, OC, W, OC, T(0), dx + (size_t)n0 * C, C);
        gemm<T>(true, false, c1 - c0, OC, N, T(1), x + c0, C, dz, OC, T(1), dW + (size_t)c0 * OC, OC);
    });
    if (db) bias_gradient<T>(db, dz, N, OC);
}

}  // namespace attnx
