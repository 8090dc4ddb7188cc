// Register-tiled products on a packed right operand: what the recurrent time loops and the fused
// attention core multiply with. BLAS packs both operands on every call, which at these sizes (a few
// hundred columns, K of 32 to 512, called once per time step or per attention head) costs as much
// as the product itself; here the right operand is packed once and R left rows x Q vectors of it
// accumulate in registers (R * Q <= 12 of AVX2's 16 registers, <= 24 of AVX-512's 32).
//
// Panel layout: a right operand B (K, N) in panels of `width` columns (Q vectors of W lanes), each
// panel's K rows one after another, zero past N:
//   packed[((n / width) * K + k) * width + n % width] = B[k, n]
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

// B (K, N), rows ldb apart, packed in panels of `width` columns (layout above)
template <class T> void pack_panels(Panels<T>& packed, const T* B, size_t ldb, int K, int N, int width) {
    const int panels = (N + width - 1) / width;
    packed.assign((size_t)panels * K * width, T(0));
    for (int p = 0; p < panels; ++p)
        for (int k = 0; k < K; ++k) {
            const T* row = B + (size_t)k * ldb + (size_t)p * width;
            std::copy(row, row + std::min(width, N - p * width), packed.data() + ((size_t)p * K + k) * width);
        }
}

// B = Bt^T packed the same way, from Bt (N, K) with rows ldbt apart
template <class T> void pack_panels_t(Panels<T>& packed, const T* Bt, size_t ldbt, int K, int N, int width) {
    const int panels = (N + width - 1) / width;
    packed.resize((size_t)panels * K * width);
    for (int p = 0; p < panels; ++p) {
        const int real = std::min(width, N - p * width);
        const T* rows = Bt + (size_t)p * width * ldbt;
        T* panel = packed.data() + (size_t)p * K * width;
        // floats: 4 x 4 blocks transposed in registers (the scalar copy cost 9% of the attention core)
        int j0 = 0;
        if constexpr (std::is_same_v<T, float>)
            for (; j0 + 4 <= real && width % 4 == 0; j0 += 4) {
                int k0 = 0;
                for (; k0 + 4 <= K; k0 += 4) {
                    float4 r[4];
                    for (int i = 0; i < 4; ++i) r[i] = vload<float4>(rows + (size_t)(j0 + i) * ldbt + k0, 4);
                    const float4 t0 = __builtin_shuffle(r[0], r[1], int4{0, 4, 1, 5});
                    const float4 t1 = __builtin_shuffle(r[0], r[1], int4{2, 6, 3, 7});
                    const float4 t2 = __builtin_shuffle(r[2], r[3], int4{0, 4, 1, 5});
                    const float4 t3 = __builtin_shuffle(r[2], r[3], int4{2, 6, 3, 7});
                    vstore(panel + (size_t)(k0 + 0) * width + j0, __builtin_shuffle(t0, t2, int4{0, 1, 4, 5}), 4);
                    vstore(panel + (size_t)(k0 + 1) * width + j0, __builtin_shuffle(t0, t2, int4{2, 3, 6, 7}), 4);
                    vstore(panel + (size_t)(k0 + 2) * width + j0, __builtin_shuffle(t1, t3, int4{0, 1, 4, 5}), 4);
                    vstore(panel + (size_t)(k0 + 3) * width + j0, __builtin_shuffle(t1, t3, int4{2, 3, 6, 7}), 4);
                }
                for (; k0 < K; ++k0)
                    for (int j = j0; j < j0 + 4; ++j) panel[(size_t)k0 * width + j] = rows[(size_t)j * ldbt + k0];
            }
        // the rest: writes in order, the reads walk the panel's rows of Bt, which stay in L1
        for (int k = 0; k < K; ++k) {
            T* out = panel + (size_t)k * width;
            for (int j = j0; j < real; ++j) out[j] = rows[(size_t)j * ldbt + k];
            std::fill(out + real, out + width, T(0));
        }
    }
}

// Q vectors of one tile row (GCC keeps a small struct of vectors in registers, an array it spills)
template <class V, int Q> struct TileRow {
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

// The left operand of a packed product: row r at a + r * lda (K values), followed by row r of x at
// x + r * ldx (C values; C = 0 unless the input projection is fused)
template <class T> struct LeftRows {
    const T* a;
    size_t lda;
    int K;
    const T* x;
    size_t ldx;
    int C;
    LeftRows from_row(int r) const { return {a + (size_t)r * lda, lda, K, x ? x + (size_t)r * ldx : x, ldx, C}; }
};

// pre[r].q[q] = sum_k [A | X][r, k] panel[k * k_stride + q * W .. + W) for R rows and Q vectors
template <class V, int Q, int R, class T>
ATTNX_ALWAYS_INLINE void row_tile(TileRow<V, Q> (&pre)[R], const LeftRows<T>& left, const T* panel, size_t k_stride) {
    constexpr int W = Lanes<V>::W;
    V acc[R][Q] = {};  // local until the end: GCC then keeps it in registers
    for (int part = 0; part < 2; ++part) {
        const T* M = part ? left.x : left.a;
        const size_t ld = part ? left.ldx : left.lda;
        const int count = part ? left.C : left.K;
        const T* rows = part ? panel + (size_t)left.K * k_stride : panel;
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
// K + C rows of Q vectors, k_stride apart) and every row b of [b0, b1) (left row b - b0):
//   pre.q[q] = left[b - b0, 0..K+C) . panel_c[0..K+C)[q]
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

}  // namespace attnx
