// Register-tiled products on a packed right operand: what the recurrent time loops, the fused
// attention core, the decoders' steps, convolutions and Dense layers multiply with. BLAS packs both
// operands on every call, which at these sizes (a few hundred columns, K of 32 to 512, called once
// per time step or per attention head) costs as much as the product itself, and its threads fight
// ours for the cores; here the right operand is packed once and R left rows x Q vectors of it
// accumulate in registers (R * Q <= 12 of AVX2's 16 registers, <= 24 of AVX-512's 32).
//
// Panel layout: a right operand B (K, N) in panels of `width` columns (Q vectors of W lanes), each
// panel's K rows one after another, zero past N:
//   packed[((n / width) * K + k) * width + n % width] = B[k, n]
// except that the last panel is only as wide as the whole vectors its columns need (RightPanels).
// The loops run on vectors V (Lanes<V>: float4, float8, float16 or double); callers compile them for
// AVX-512, AVX2 + FMA and baseline x86-64 and pick at run time (on_widest_lanes), so wheels stay
// portable.
#pragma once
#include <algorithm>
#include <cstddef>
#include <new>
#include <type_traits>
#include <vector>

#include "attnx/activations.hpp"

namespace attnx {

// Lanes of the vectors the tiled loops for T run on here (what their operands must be packed for)
template <class T> int tile_lanes() {
    if constexpr (std::is_same_v<T, double>) return 1;
    else {
        const SimdLevel level = simd_level();  // read once: the tests may change the cap between calls
        return level == SimdLevel::avx512 ? 16 : level == SimdLevel::avx2 ? 8 : 4;
    }
}

// Storage on 64-byte (cache line) boundaries: then no vector of a packed panel straddles two lines
// (an AVX-512 load that does costs two loads; the tiles are bound by their loads there)
template <class T> struct CacheLineAllocator {
    using value_type = T;
    CacheLineAllocator() = default;
    template <class U> CacheLineAllocator(const CacheLineAllocator<U>&) {}
    T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
    void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
    template <class U> bool operator==(const CacheLineAllocator<U>&) const { return true; }
    template <class U> bool operator!=(const CacheLineAllocator<U>&) const { return false; }
};
// A packed right operand
template <class T> using Panels = std::vector<T, CacheLineAllocator<T>>;

// A right operand (K, N) in panels of `width` columns: panel p's row k at data + p * panel_stride +
// k * k_stride. A packed operand's last panel holds only the vectors (of `lanes`) its columns need,
// its rows last_k_stride apart: at N = 100 on 16 lanes in panels of 48, 112 columns instead of 144.
template <class T> struct RightPanels {
    const T* data;
    size_t k_stride, panel_stride, last_k_stride;
};

// Columns of the last panel of N columns in panels of `width`, rounded up to whole vectors of `lanes`
inline int last_panel_width(int N, int width, int lanes) {
    if (N <= 0) return 0;
    const int real = N - (N - 1) / width * width;
    return (real + lanes - 1) / lanes * lanes;
}

// The panels pack_panels / pack_panels_t write for B (K, N)
template <class T> RightPanels<T> packed_panels(const T* packed, int K, int N, int width, int lanes) {
    return {packed, (size_t)width, (size_t)K * width, (size_t)last_panel_width(N, width, lanes)};
}

// B (K, N), rows ldb apart, packed in panels of `width` columns (layout above), the last one narrowed
// to whole vectors of `lanes`
template <class T> void pack_panels(Panels<T>& packed, const T* B, size_t ldb, int K, int N, int width, int lanes) {
    const int panels = (N + width - 1) / width, last_width = last_panel_width(N, width, lanes);
    packed.assign(((size_t)std::max(panels - 1, 0) * width + last_width) * K, T(0));
    for (int p = 0; p < panels; ++p) {
        const int pw = p + 1 == panels ? last_width : width;
        for (int k = 0; k < K; ++k) {
            const T* row = B + (size_t)k * ldb + (size_t)p * width;
            std::copy(row, row + std::min(width, N - p * width), packed.data() + (size_t)p * K * width + (size_t)k * pw);
        }
    }
}

// B = Bt^T packed the same way, from Bt (N, K) with rows ldbt apart
template <class T> void pack_panels_t(Panels<T>& packed, const T* Bt, size_t ldbt, int K, int N, int width, int lanes) {
    const int panels = (N + width - 1) / width, last_width = last_panel_width(N, width, lanes);
    packed.resize(((size_t)std::max(panels - 1, 0) * width + last_width) * K);
    for (int p = 0; p < panels; ++p) {
        const int real = std::min(width, N - p * width), pw = p + 1 == panels ? last_width : width;
        const T* rows = Bt + (size_t)p * width * ldbt;
        T* panel = packed.data() + (size_t)p * K * width;
        // floats: 4 x 4 blocks transposed in registers (the scalar copy cost 9% of the attention core)
        int j0 = 0;
        if constexpr (std::is_same_v<T, float>)
            for (; j0 + 4 <= real && pw % 4 == 0; j0 += 4) {
                int k0 = 0;
                for (; k0 + 4 <= K; k0 += 4) {
                    float4 r[4];
                    for (int i = 0; i < 4; ++i) r[i] = vload<float4>(rows + (size_t)(j0 + i) * ldbt + k0, 4);
                    const float4 t0 = __builtin_shuffle(r[0], r[1], int4{0, 4, 1, 5});
                    const float4 t1 = __builtin_shuffle(r[0], r[1], int4{2, 6, 3, 7});
                    const float4 t2 = __builtin_shuffle(r[2], r[3], int4{0, 4, 1, 5});
                    const float4 t3 = __builtin_shuffle(r[2], r[3], int4{2, 6, 3, 7});
                    vstore(panel + (size_t)(k0 + 0) * pw + j0, __builtin_shuffle(t0, t2, int4{0, 1, 4, 5}), 4);
                    vstore(panel + (size_t)(k0 + 1) * pw + j0, __builtin_shuffle(t0, t2, int4{2, 3, 6, 7}), 4);
                    vstore(panel + (size_t)(k0 + 2) * pw + j0, __builtin_shuffle(t1, t3, int4{0, 1, 4, 5}), 4);
                    vstore(panel + (size_t)(k0 + 3) * pw + j0, __builtin_shuffle(t1, t3, int4{2, 3, 6, 7}), 4);
                }
                for (; k0 < K; ++k0)
                    for (int j = j0; j < j0 + 4; ++j) panel[(size_t)k0 * pw + j] = rows[(size_t)j * ldbt + k0];
            }
        // the rest: writes in order, the reads walk the panel's rows of Bt, which stay in L1
        for (int k = 0; k < K; ++k) {
            T* out = panel + (size_t)k * pw;
            for (int j = j0; j < real; ++j) out[j] = rows[(size_t)j * ldbt + k];
            std::fill(out + real, out + pw, T(0));
        }
    }
}

// Q vectors of one tile row (GCC keeps a small struct of vectors in registers, an array it spills)
template <class V, int Q> struct TileRow {
    static constexpr int count = Q;
    V q[Q];
};

template <class V, class T = typename Lanes<V>::T> ATTNX_ALWAYS_INLINE V vbroadcast(T s) {
    if constexpr (Lanes<V>::W == 1) {
        return s;
    } else {
        typedef int Lane0 __attribute__((vector_size(sizeof(V))));
        return __builtin_shuffle(V{s}, Lane0{});  // one vbroadcastss (s + V{} is an add: -0 + 0 = +0)
    }
}

// The left operand of a packed product: row r is `segments` runs of K values, run s at
// a + r * lda + s * segment_stride (one run unless a convolution reads its windows in place: a run
// per window row), followed by row r of x at x + r * ldx (C values; C = 0 unless the input
// projection is fused)
template <class T> struct LeftRows {
    const T* a;
    size_t lda;
    int K;
    const T* x;
    size_t ldx;
    int C;
    int segments = 1;
    size_t segment_stride = 0;
    LeftRows from_row(int r) const {
        return {a + (size_t)r * lda, lda, K, x ? x + (size_t)r * ldx : x, ldx, C, segments, segment_stride};
    }
};

// pre[r].q[q] = sum_k [A | X][r, k] panel[k * k_stride + q * W .. + W) for R rows and Q vectors
// One row (R = 1; a decoding step at batch 1) would chain its Q accumulators through every k and wait
// on the multiply-add's latency (4 cycles for 2 per cycle): its k run in S interleaved chains, which
// sum at the end, S Q >= 8 where the registers allow.
template <class V, int Q, int R, class T>
ATTNX_ALWAYS_INLINE void row_tile(TileRow<V, Q> (&pre)[R], const LeftRows<T>& left, const T* panel, size_t k_stride) {
    constexpr int W = Lanes<V>::W;
    if constexpr (R == 1 && W > 1) {
        constexpr int S = Q >= 4 ? 2 : Q == 3 ? 3 : 4;
        V acc[S][Q] = {};
        for (int part = 0; part <= left.segments; ++part) {
            const bool of_x = part == left.segments;
            const T* M = of_x ? left.x : left.a + (size_t)part * left.segment_stride;
            const int count = of_x ? left.C : left.K;
            const T* rows = panel + (size_t)part * left.K * k_stride;
            int k = 0;
            for (; k + S <= count; k += S)
#pragma GCC unroll 4
                for (int s = 0; s < S; ++s) {
                    const V a = vbroadcast<V>(M[k + s]);
#pragma GCC unroll 4
                    for (int q = 0; q < Q; ++q)
                        acc[s][q] += a * vload<V>(rows + (size_t)(k + s) * k_stride + (size_t)q * W, W);
                }
            for (; k < count; ++k) {
                const V a = vbroadcast<V>(M[k]);
#pragma GCC unroll 4
                for (int q = 0; q < Q; ++q) acc[0][q] += a * vload<V>(rows + (size_t)k * k_stride + (size_t)q * W, W);
            }
        }
        for (int q = 0; q < Q; ++q) {
            V sum = acc[0][q];
            for (int s = 1; s < S; ++s) sum += acc[s][q];
            pre[0].q[q] = sum;
        }
        return;
    }
    V acc[R][Q] = {};  // local until the end: GCC then keeps it in registers
    // the runs of a, then x
    for (int part = 0; part <= left.segments; ++part) {
        const bool of_x = part == left.segments;
        const T* M = of_x ? left.x : left.a + (size_t)part * left.segment_stride;
        const size_t ld = of_x ? left.ldx : left.lda;
        const int count = of_x ? left.C : left.K;
        const T* rows = panel + (size_t)part * left.K * k_stride;
        for (int k = 0; k < count; ++k) {
            V u[Q];
#pragma GCC unroll 4
            for (int q = 0; q < Q; ++q) {
                V v = vload<V>(rows + (size_t)k * k_stride + (size_t)q * W, W);
                // AVX-512: in a register, where GCC would fold the load into each of the R
                // multiply-adds, R loads instead of one (the tiles then wait on loads, not on the
                // FMA units). AVX2's 16 registers hold the accumulators but not u as well: there
                // the folded loads are the better code.
                if constexpr (W == 16) asm("" : "+v"(v));
                u[q] = v;
            }
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) {
                const V a = vbroadcast<V>(M[(size_t)r * ld + k]);
#pragma GCC unroll 4
                for (int q = 0; q < Q; ++q) acc[r][q] += a * u[q];
            }
        }
    }
    for (int r = 0; r < R; ++r)
        for (int q = 0; q < Q; ++q) pre[r].q[q] = acc[r][q];
}

// A small product on a packed right operand: for every block c < blocks (panel0 + c * block_stride,
// segments * K + C rows of Q vectors, k_stride apart) and every row b of [b0, b1) (left row b - b0):
//   pre.q[q] = left[b - b0, 0..segments*K+C) . panel_c[0..segments*K+C)[q]
// then cell(b, pre, c). R rows share each load of the panel (R = 3 measured fastest for Q = 3 and
// 4 on Zen 3: up to 12 accumulators in AVX2's 16 registers; AVX-512's 32 hold twice the rows).
template <class V, int Q, class T, class Cell>
ATTNX_ALWAYS_INLINE void packed_product(int b0, int b1, const LeftRows<T>& left, const T* panel0, size_t k_stride,
                                 size_t block_stride, int blocks, Cell&& cell) {
    constexpr int R = (Q >= 3 ? 3 : 4) * (Lanes<V>::W == 16 ? 2 : 1);
    for (int c = 0; c < blocks; ++c) {
        const T* panel = panel0 + (size_t)c * block_stride;
        int b = b0;
        for (; b + R <= b1; b += R) {
            TileRow<V, Q> pre[R];
            row_tile<V, Q, R>(pre, left.from_row(b - b0), panel, k_stride);
            for (int r = 0; r < R; ++r) cell(b + r, pre[r], c);
        }
        for (; b + 2 <= b1; b += 2) {  // the rows left over: pairs share the loads too
            TileRow<V, Q> pre[2];
            row_tile<V, Q, 2>(pre, left.from_row(b - b0), panel, k_stride);
            cell(b, pre[0], c), cell(b + 1, pre[1], c);
        }
        for (; b < b1; ++b) {
            TileRow<V, Q> pre[1];
            row_tile<V, Q, 1>(pre, left.from_row(b - b0), panel, k_stride);
            cell(b, pre[0], c);
        }
    }
}

// The last panel of panels_product in tiles of the `vectors` it holds (at most Q): cell(b, pre, p)
template <class V, int Q, class T, class Cell>
ATTNX_ALWAYS_INLINE void last_panel_product(int vectors, int b0, int b1, const LeftRows<T>& left, const T* panel,
                                            size_t k_stride, int p, Cell& cell) {
    if constexpr (Q > 1)
        if (vectors < Q) return last_panel_product<V, Q - 1>(vectors, b0, b1, left, panel, k_stride, p, cell);
    packed_product<V, Q>(b0, b1, left, panel, k_stride, 0, 1,
                         [&](int b, TileRow<V, Q> pre, int) __attribute__((always_inline)) { cell(b, pre, p); });
}

// A product on a right operand in panels of Q vectors (RightPanels), from its row k0 on
// (segments * K + C rows of left), N columns: for every panel p and row b of [b0, b1), cell(b, pre, p) with pre's
// pre.count vectors the columns p * Q * W + [0, pre.count * W). Whole panels run in tiles of Q
// vectors, a packed operand's narrowed last panel in tiles of the vectors it holds.
template <class V, int Q, class T, class Cell>
ATTNX_ALWAYS_INLINE void panels_product(int b0, int b1, const LeftRows<T>& left, const RightPanels<T>& right, int k0,
                                        int N, Cell&& cell) {
    constexpr int W = Lanes<V>::W, width = Q * W;
    const int whole = N / width, rest = (N - whole * width + W - 1) / W;  // the vectors past the whole panels
    packed_product<V, Q>(b0, b1, left, right.data + (size_t)k0 * right.k_stride, right.k_stride, right.panel_stride,
                         whole, cell);
    if (rest)
        last_panel_product<V, Q>(rest, b0, b1, left,
                                 right.data + (size_t)whole * right.panel_stride + (size_t)k0 * right.last_k_stride,
                                 right.last_k_stride, whole, cell);
}

// Vectors per panel of a packed right operand of N columns for vectors of `lanes`
inline int tile_vectors(int N, int lanes) { return std::clamp((N + lanes - 1) / lanes, 1, 3); }

// A right operand B (K, N) packed once for packed_rows, for products whose left operand changes from
// call to call (a convolution's images, a decoder's steps): `transposed` packs it from B^T (N, K)
template <class T> struct PackedRight {
    Panels<T> panels;
    int K = 0, N = 0, Q = 1;
    PackedRight() = default;
    PackedRight(const T* B, int K_, int N_, bool transposed, int lanes = tile_lanes<T>()) {
        pack(B, K_, N_, transposed, lanes);
    }
    // B packed into these panels (their storage reused: no page faults when it has the room)
    void pack(const T* B, int K_, int N_, bool transposed, int lanes = tile_lanes<T>()) {
        K = K_, N = N_, Q = tile_vectors(N_, lanes);
        if (transposed) pack_panels_t(panels, B, (size_t)K, K, N, Q * lanes, lanes);
        else pack_panels(panels, B, (size_t)N, K, N, Q * lanes, lanes);
    }
};

// out[r, n] = bias[n] + sum_k left[r, k] B[k, n] for `rows` rows of left (B.K values each), B packed in
// panels of Q vectors V; bias may be null. `relu`: out = max(out, 0) as it is stored (a NaN stays).
// `accumulate`: out[r, n] += instead of =.
template <class V, int Q, class T>
ATTNX_ALWAYS_INLINE void packed_rows(T* out, const LeftRows<T>& left, int rows, const PackedRight<T>& B, const T* bias,
                                     bool relu, bool accumulate) {
    constexpr int W = Lanes<V>::W;
    const int N = B.N;
    panels_product<V, Q>(0, rows, left, packed_panels(B.panels.data(), B.K, N, Q * W, W), 0, N,
                         [&](int r, auto pre, int p) __attribute__((always_inline)) {
                             for (int q = 0; q < pre.count && (p * Q + q) * W < N; ++q) {
                                 const int n0 = (p * Q + q) * W, m = std::min(W, N - n0);
                                 if (bias) pre.q[q] += vload<V>(bias + n0, m);
                                 if (accumulate) pre.q[q] += vload<V>(out + (size_t)r * N + n0, m);
                                 if (relu) pre.q[q] = pre.q[q] < T(0) ? V{} : pre.q[q];
                                 vstore(out + (size_t)r * N + n0, pre.q[q], m);
                             }
                         });
}

// packed_rows on the widest vectors this CPU runs (those B was packed for)
template <class T>
void packed_rows(T* out, const LeftRows<T>& left, int rows, const PackedRight<T>& B, const T* bias,
                 bool relu = false, bool accumulate = false) {
    on_widest_lanes<T>([&](auto lanes) __attribute__((always_inline)) {
        using V = decltype(lanes);
        if (B.Q == 1) packed_rows<V, 1>(out, left, rows, B, bias, relu, accumulate);
        else if (B.Q == 2) packed_rows<V, 2>(out, left, rows, B, bias, relu, accumulate);
        else packed_rows<V, 3>(out, left, rows, B, bias, relu, accumulate);
    });
}

}  // namespace attnx
