// bfloat16 products with float32 accumulation: what the `mixed_bfloat16` policy multiplies with
// (ARCHITECTURE.md, "Mixed precision"). Operands stay float32 in memory (the master weights, the
// activations); each product rounds them to bf16 (round to nearest even) while packing them, and sums
// the products in float32. The rounding is the one function bf16_bits at every level, so every level
// multiplies the same bf16 values:
//   - AVX-512 with AVX512_BF16 (Zen 4/5, Sapphire Rapids): vdpbf16ps, 32 products per instruction,
//     twice the float32 FMA's 16;
//   - AVX-512 without it, AVX2 + FMA and baseline x86-64: the same arithmetic on float lanes: the
//     pair's odd product added first, then the even one, as vdpbf16ps' definition orders them. A
//     product of two bf16 values (8 significant bits each) is exact in float32, so a fused or a plain
//     multiply-add give the same sum, and the levels agree bit for bit except that vdpbf16ps treats
//     subnormal operands and results as zero.
//
// Packed layout: vdpbf16ps multiplies 32-bit lanes that each hold two bf16 values, consecutive in k
// (the even k in the low half). Both operands are packed as such pairs (uint32_t), K rounded up to
// even with a zero:
//   left  (M, K):  pairs[m * row_stride + kp * k_stride] = (A[m, 2kp], A[m, 2kp + 1])
//   right (K, N):  panels of `width` = Q vectors of W columns, each panel's K/2 pair rows one after
//                  another: panels[((n / width) * K2 + kp) * width + n % width] = (B[2kp, n], B[2kp+1, n])
// A transposed left operand is packed k-major (row_stride 1, k_stride M), so that both packings read
// their source rows contiguously.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "attnx/activations.hpp"
#include "attnx/packed.hpp"
#include "attnx/parallel.hpp"

namespace attnx {

// ----------------------------------------------------------------------------- rounding
// bf16_bits (below) on every lane of a vector of float bits U, or of one uint32_t
template <class U> ATTNX_ALWAYS_INLINE U bf16_bits_lanes(U bits) {
    const U rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16, quiet_nan = (bits >> 16) | 0x40u;
    return (bits & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded;
}

// reference: cpp/reference/bf16.hpp, round_to_bf16
// The bf16 value nearest x (ties to the even one) as its 16 bits: the float's top half after adding
// 0x7FFF plus the lowest kept bit; a NaN stays a (quiet) NaN of the same sign, +-inf stay, values past
// bf16's largest round to inf as IEEE rounding does.
ATTNX_ALWAYS_INLINE uint32_t bf16_bits(float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    return bf16_bits_lanes(bits);
}

// The float a bf16's bits stand for
ATTNX_ALWAYS_INLINE float bf16_value(uint32_t bits16) {
    const uint32_t bits = bits16 << 16;
    float x;
    std::memcpy(&x, &bits, sizeof x);
    return x;
}

// y[i] = x[i] rounded to bf16 (as a float) for i < n; y may alias x
inline void round_to_bf16(float* y, const float* x, size_t n) {
    on_widest_lanes<float>([&](auto) __attribute__((always_inline)) {
        for (size_t i = 0; i < n; ++i) y[i] = bf16_value(bf16_bits(x[i]));
    });
}

// ----------------------------------------------------------------------------- packing
// Half a vector of uint32 lanes, and the uint64 lanes of a whole one: what a row's pairs are made of
template <class U> struct PairLanes;
typedef uint32_t uint2 __attribute__((vector_size(8)));
typedef uint64_t uint64x2 __attribute__((vector_size(16)));
typedef uint64_t uint64x4 __attribute__((vector_size(32)));
typedef uint64_t uint64x8 __attribute__((vector_size(64)));
template <> struct PairLanes<uint4> { using Half = uint2; using Wide = uint64x2; };
template <> struct PairLanes<uint8> { using Half = uint4; using Wide = uint64x4; };
template <> struct PairLanes<uint16> { using Half = uint8; using Wide = uint64x8; };

// pairs[r * row_stride + kp] = (A[r, 2kp], A[r, 2kp + 1]) for rows of A (rows, K), rows lda apart; a zero
// high half past an odd K. Two vectors of floats make one of pairs: as uint64 lanes the rounded even
// value sits in bits 0..15 and the odd one in bits 32..47, which lane | lane >> 16 brings to 16..31.
inline void pack_bf16_rows(uint32_t* pairs, size_t row_stride, const float* A, size_t lda, int rows, int K) {
    const int K2 = (K + 1) / 2, whole = K / 2;
    on_widest_lanes<float>([&](auto lanes) __attribute__((always_inline)) {
        using V = decltype(lanes);
        using U = typename Lanes<V>::U;
        using Half = typename PairLanes<U>::Half;
        using Wide = typename PairLanes<U>::Wide;
        constexpr int W = Lanes<V>::W;
        for (int r = 0; r < rows; ++r) {
            const float* a = A + (size_t)r * lda;
            uint32_t* out = pairs + (size_t)r * row_stride;
            int kp = 0;
            for (; kp + W / 2 <= whole; kp += W / 2) {
                U bits;
                std::memcpy(&bits, a + 2 * kp, sizeof bits);
                Wide wide;
                const U rounded = bf16_bits_lanes(bits);
                std::memcpy(&wide, &rounded, sizeof wide);
                const Half half = __builtin_convertvector(wide | wide >> 16, Half);
                std::memcpy(out + kp, &half, sizeof half);
            }
            for (; kp < whole; ++kp) out[kp] = bf16_bits(a[2 * kp]) | bf16_bits(a[2 * kp + 1]) << 16;
            if (whole < K2) out[whole] = bf16_bits(a[K - 1]);
        }
    });
}

// pairs[kp * k_stride + c] = (At[2kp, c], At[2kp + 1, c]) for the columns c < cols of At (K, cols),
// rows ldat apart (the pairs of At^T's rows, read along At's rows); zeros from cols to pad_cols
inline void pack_bf16_columns(uint32_t* pairs, size_t k_stride, const float* At, size_t ldat, int K, int cols,
                              int pad_cols) {
    const int K2 = (K + 1) / 2;
    on_widest_lanes<float>([&](auto lanes) __attribute__((always_inline)) {
        using U = typename Lanes<decltype(lanes)>::U;
        constexpr int W = Lanes<decltype(lanes)>::W;
        for (int kp = 0; kp < K2; ++kp) {
            const float* even = At + (size_t)(2 * kp) * ldat;
            const float* odd = 2 * kp + 1 < K ? even + ldat : nullptr;
            uint32_t* out = pairs + (size_t)kp * k_stride;
            int c = 0;
            for (; c + W <= cols; c += W) {
                U e, o = {};
                std::memcpy(&e, even + c, sizeof e);
                if (odd) std::memcpy(&o, odd + c, sizeof o);
                const U pair = bf16_bits_lanes(e) | bf16_bits_lanes(o) << 16;
                std::memcpy(out + c, &pair, sizeof pair);
            }
            for (; c < cols; ++c) out[c] = bf16_bits(even[c]) | (odd ? bf16_bits(odd[c]) << 16 : 0u);
            std::fill(out + cols, out + pad_cols, 0u);
        }
    });
}

// A panel of `width` columns from Bt (cols, K), rows ldbt apart: panel[kp * width + j] = (Bt[j, 2kp],
// Bt[j, 2kp + 1]) for j < cols (zeros past them stay as they were). The writes run along the panel's
// rows; the reads walk `cols` rows of Bt, whose lines stay in L1 across eight pairs.
inline void pack_bf16_panel_t(uint32_t* panel, int width, const float* Bt, size_t ldbt, int cols, int K) {
    const int K2 = (K + 1) / 2, whole = K / 2;
    for (int kp = 0; kp < K2; ++kp) {
        uint32_t* out = panel + (size_t)kp * width;
        if (kp < whole)
            for (int j = 0; j < cols; ++j) {
                const float* b = Bt + (size_t)j * ldbt + 2 * kp;
                out[j] = bf16_bits(b[0]) | bf16_bits(b[1]) << 16;
            }
        else
            for (int j = 0; j < cols; ++j) out[j] = bf16_bits(Bt[(size_t)j * ldbt + K - 1]);
    }
}

// ----------------------------------------------------------------------------- tiles
// The tile shapes per level: R rows x Q vectors of W lanes accumulate in registers. vdpbf16ps needs
// no more registers than an FMA (24 accumulators + 4 panel vectors + 1 broadcast of AVX-512's 32); the
// emulation splits each panel vector into its even and odd halves (two registers per vector).
struct Bf16Tiles {
    bool native;  // vdpbf16ps
    int W, Q, R;
    int width() const { return W * Q; }
};

inline bool cpu_has_avx512_bf16() {
    static const bool has = __builtin_cpu_supports("avx512bf16");
    return has;
}

// Tests only: false runs the AVX-512 level on float lanes even where vdpbf16ps exists, so that the
// emulation of that level is tested on a CPU that has it (_core._bf16_allow_dot_instruction)
inline std::atomic<bool>& bf16_dot_instruction_allowed() {
    static std::atomic<bool> allowed{true};
    return allowed;
}

inline Bf16Tiles bf16_tiles() {
    const SimdLevel level = simd_level();
    if (level == SimdLevel::avx512)
        return cpu_has_avx512_bf16() && bf16_dot_instruction_allowed() ? Bf16Tiles{true, 16, 4, 6}
                                                                       : Bf16Tiles{false, 16, 2, 6};
    return {false, level == SimdLevel::avx2 ? 8 : 4, 2, 4};
}

// C[r, 0..cols) (+)= sum_kp pair products of left rows r < R (pairs a[r * ars + kp * aks]) with the
// panel's pair rows (kp * k_stride + q * 16 + lane), kp < K2, on vdpbf16ps
template <int Q, int R>
__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx512bf16,avx2,fma"))) void bf16_tile_dot(
    float* C, size_t ldc, int cols, const uint32_t* a, size_t ars, size_t aks, const uint32_t* panel, size_t k_stride,
    int K2, bool accumulate) {
    __mmask16 mask[Q];
    for (int q = 0; q < Q; ++q) {
        const int m = std::clamp(cols - q * 16, 0, 16);
        mask[q] = (__mmask16)((1u << m) - 1);
    }
    __m512 acc[R][Q];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int q = 0; q < Q; ++q)
            acc[r][q] = accumulate ? _mm512_maskz_loadu_ps(mask[q], C + (size_t)r * ldc + q * 16) : _mm512_setzero_ps();
    for (int kp = 0; kp < K2; ++kp) {
        __m512bh b[Q];
#pragma GCC unroll 4
        for (int q = 0; q < Q; ++q) b[q] = (__m512bh)_mm512_loadu_si512(panel + (size_t)kp * k_stride + q * 16);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
            const __m512bh pair = (__m512bh)_mm512_set1_epi32((int)a[r * ars + kp * aks]);
#pragma GCC unroll 4
            for (int q = 0; q < Q; ++q) acc[r][q] = _mm512_dpbf16_ps(acc[r][q], pair, b[q]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int q = 0; q < Q; ++q) _mm512_mask_storeu_ps(C + (size_t)r * ldc + q * 16, mask[q], acc[r][q]);
}

// The same tile on float lanes V: acc += odd * odd, then acc += even * even, per pair
template <class V, int Q, int R>
ATTNX_ALWAYS_INLINE void bf16_tile_lanes(float* C, size_t ldc, int cols, const uint32_t* a, size_t ars, size_t aks,
                                         const uint32_t* panel, size_t k_stride, int K2, bool accumulate) {
    using U = typename Lanes<V>::U;
    constexpr int W = Lanes<V>::W;
    V acc[R][Q];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int q = 0; q < Q; ++q)
            acc[r][q] = accumulate ? vload<V>(C + (size_t)r * ldc + q * W, std::clamp(cols - q * W, 0, W)) : V{};
    for (int kp = 0; kp < K2; ++kp) {
        V even[Q], odd[Q];
#pragma GCC unroll 4
        for (int q = 0; q < Q; ++q) {
            U bits, lo, hi;
            std::memcpy(&bits, panel + (size_t)kp * k_stride + q * W, sizeof bits);
            lo = bits << 16;
            hi = bits & 0xFFFF0000u;
            std::memcpy(&even[q], &lo, sizeof lo);
            std::memcpy(&odd[q], &hi, sizeof hi);
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
            const uint32_t pair = a[r * ars + kp * aks];
            const V a_even = vbroadcast<V>(bf16_value(pair & 0xFFFFu)), a_odd = vbroadcast<V>(bf16_value(pair >> 16));
#pragma GCC unroll 4
            for (int q = 0; q < Q; ++q) {
                acc[r][q] += a_odd * odd[q];
                acc[r][q] += a_even * even[q];
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int q = 0; q < Q; ++q)
            if (q * W < cols) vstore(C + (size_t)r * ldc + q * W, acc[r][q], std::min(cols - q * W, W));
}

// Pairs of K per block of the product (256: a native panel's block is 64 KiB, the left rows' block
// kBf16RowBlock x 1 KiB, both in L2 while the tiles pass over them)
constexpr int kBf16PairBlock = 256, kBf16RowBlock = 120;

// The tiled loop of bf16_gemm over rows [m0, m1): per block of K pairs, per block of rows, per panel,
// tiles of R rows then of one; tile<rows>(C, cols, a, panel, K2, accumulate) multiplies one tile
template <int R, class Tile>
ATTNX_ALWAYS_INLINE void bf16_tiled_rows(float* C, size_t ldc, int m0, int m1, int N, int width, const uint32_t* a_pairs,
                                         size_t ars, size_t aks, const uint32_t* panels, int K2, bool accumulate,
                                         Tile&& tile) {
    const int panel_count = (N + width - 1) / width;
    for (int kb = 0; kb < K2; kb += kBf16PairBlock) {
        const int kc = std::min(kBf16PairBlock, K2 - kb);
        const bool acc = accumulate || kb > 0;
        for (int mb = m0; mb < m1; mb += kBf16RowBlock) {
            const int mb1 = std::min(m1, mb + kBf16RowBlock);
            for (int p = 0; p < panel_count; ++p) {
                const int n0 = p * width, cols = std::min(width, N - n0);
                const uint32_t* panel = panels + ((size_t)p * K2 + kb) * width;
                int m = mb;
                for (; m + R <= mb1; m += R)
                    tile(std::integral_constant<int, R>{}, C + (size_t)m * ldc + n0, cols,
                         a_pairs + (size_t)m * ars + (size_t)kb * aks, panel, kc, acc);
                for (; m < mb1; ++m)
                    tile(std::integral_constant<int, 1>{}, C + (size_t)m * ldc + n0, cols,
                         a_pairs + (size_t)m * ars + (size_t)kb * aks, panel, kc, acc);
            }
        }
    }
}

// reference: cpp/reference/bf16.hpp, bf16_gemm
// C[m, n] = sum_k bf16(op(A)[m, k]) bf16(op(B)[k, n])   (+ C[m, n] when accumulate), sums in float32
// op(A) (M, K): A (M, K) with rows lda apart, or A^T of A (K, M) when trans_a; op(B) (K, N): B (K, N)
// with rows ldb apart, or B^T of B (N, K) when trans_b; C's rows ldc apart. Both operands are packed
// as bf16 pairs once per call (layout above); the rows of C are split across the thread budget.
inline void bf16_gemm(float* C, size_t ldc, const float* A, size_t lda, bool trans_a, const float* B, size_t ldb,
                      bool trans_b, int M, int N, int K, bool accumulate) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        if (!accumulate)
            for (int m = 0; m < M; ++m) std::fill(C + (size_t)m * ldc, C + (size_t)m * ldc + N, 0.0f);
        return;
    }
    const Bf16Tiles tiles = bf16_tiles();
    const int K2 = (K + 1) / 2, width = tiles.width(), panel_count = (N + width - 1) / width;
    const double work = double(M) * N * K;
    std::vector<uint32_t> a_pairs((size_t)M * K2);
    const size_t ars = trans_a ? 1 : (size_t)K2, aks = trans_a ? (size_t)M : 1;
    Panels<uint32_t> b_pairs((size_t)panel_count * K2 * width);  // zeros past N stay (trans_b packs rows only)
    // packing: the left operand's rows (or columns) and the panels, split across the threads
    const size_t parts = kernel_threads();
    parallel_for(parts, work / 8, [&](size_t lo, size_t hi) {
        const int r0 = (int)(M * lo / parts), r1 = (int)(M * hi / parts);
        if (trans_a) pack_bf16_columns(a_pairs.data() + r0, (size_t)M, A + r0, lda, K, r1 - r0, r1 - r0);
        else pack_bf16_rows(a_pairs.data() + (size_t)r0 * K2, (size_t)K2, A + (size_t)r0 * lda, lda, r1 - r0, K);
        for (int p = (int)(panel_count * lo / parts); p < (int)(panel_count * hi / parts); ++p) {
            const int n0 = p * width, cols = std::min(width, N - n0);
            uint32_t* panel = b_pairs.data() + (size_t)p * K2 * width;
            if (trans_b) pack_bf16_panel_t(panel, width, B + (size_t)n0 * ldb, ldb, cols, K);
            else pack_bf16_columns(panel, (size_t)width, B + n0, ldb, K, cols, width);
        }
    });
    // the product: rows in blocks of R, split across the threads
    const int R = tiles.R, row_tiles = (M + R - 1) / R;
    parallel_for((size_t)row_tiles, work, [&](size_t lo, size_t hi) {
        const int m0 = (int)lo * R, m1 = std::min(M, (int)hi * R);
        if (tiles.native) {
            bf16_tiled_rows<6>(C, ldc, m0, m1, N, width, a_pairs.data(), ars, aks, b_pairs.data(), K2, accumulate,
                               [&](auto rows, float* c, int cols, const uint32_t* a, const uint32_t* panel, int kc,
                                   bool acc) { bf16_tile_dot<4, decltype(rows)::value>(c, ldc, cols, a, ars, aks, panel, (size_t)width, kc, acc); });
            return;
        }
        on_widest_lanes<float>([&](auto lanes) __attribute__((always_inline)) {
            using V = decltype(lanes);
            constexpr int TR = Lanes<V>::W == 16 ? 6 : 4;
            bf16_tiled_rows<TR>(C, ldc, m0, m1, N, width, a_pairs.data(), ars, aks, b_pairs.data(), K2, accumulate,
                                [&](auto rows, float* c, int cols, const uint32_t* a, const uint32_t* panel, int kc,
                                    bool acc) __attribute__((always_inline)) {
                                    bf16_tile_lanes<V, 2, decltype(rows)::value>(c, ldc, cols, a, ars, aks, panel, (size_t)width, kc,
                                                                                   acc);
                                });
        });
    });
}

// ----------------------------------------------------------------------------- step products
// The products of a time loop (rnn.hpp's h_{t-1} U forward, dgates U^T backward): a few rows per step
// against a right operand packed once per sequence in packed.hpp's panels, whose rows are paired
// along k here (pair_panels); each step pairs its left rows (pack_bf16_rows). The same tiles as
// bf16_gemm, their sums handed to the time loop's cell in registers.

// The panels pack_panels / pack_panels_t wrote for B (K, N), each panel's K rows paired into (K + 1) / 2
// rows of bf16 pairs (the last panel narrowed as there): the layout packed_panels(pairs, (K + 1) / 2,
// N, width, lanes) reads
inline void pair_panels(Panels<uint32_t>& pairs, const float* packed, int K, int N, int width, int lanes) {
    const int panels = (N + width - 1) / width, last_width = last_panel_width(N, width, lanes), K2 = (K + 1) / 2;
    pairs.resize(((size_t)std::max(panels - 1, 0) * width + last_width) * K2);
    for (int p = 0; p < panels; ++p) {
        const int pw = p + 1 == panels ? last_width : width;
        pack_bf16_columns(pairs.data() + (size_t)p * K2 * width, (size_t)pw, packed + (size_t)p * K * width, (size_t)pw,
                          K, pw, pw);
    }
}

// For every block c < blocks (pair rows at panel0 + c * block_stride, k_stride apart, Q vectors of V
// each) and every row b of [b0, b1) (K2 pairs at a + (b - b0) * lda):
//   pre.q[q] = sum_kp pair products of row b with the block's vector q;  then cell(b, pre, c)
// vdpbf16ps tiles of 6 rows where `native` (bf16_tiles; V is then 16 floats), else bf16_tile_lanes
// (4 rows on AVX-512, 2 on narrower lanes, where the even and odd halves take twice the registers)
template <class V, int Q, class Cell>
ATTNX_ALWAYS_INLINE void bf16_step_product(bool native, int b0, int b1, const uint32_t* a, size_t lda, int K2,
                                           const uint32_t* panel0, size_t k_stride, size_t block_stride, int blocks,
                                           Cell&& cell) {
    constexpr int W = Lanes<V>::W, width = Q * W;
    alignas(64) float sums[6 * width];
    auto tile = [&](auto rows, int b, const uint32_t* panel, int c) __attribute__((always_inline)) {
        constexpr int R = decltype(rows)::value;
        const uint32_t* left = a + (size_t)(b - b0) * lda;
        bool done = false;
        if constexpr (W == 16)
            if (native) bf16_tile_dot<Q, R>(sums, width, width, left, lda, 1, panel, k_stride, K2, false), done = true;
        if (!done) bf16_tile_lanes<V, Q, R>(sums, width, width, left, lda, 1, panel, k_stride, K2, false);
        for (int r = 0; r < R; ++r) {
            TileRow<V, Q> pre;
            for (int q = 0; q < Q; ++q) pre.q[q] = vload<V>(sums + r * width + q * W, W);
            cell(b + r, pre, c);
        }
    };
    constexpr int lane_rows = W == 16 ? 4 : 2;
    for (int c = 0; c < blocks; ++c) {
        const uint32_t* panel = panel0 + (size_t)c * block_stride;
        int b = b0;
        if (native)
            for (; b + 6 <= b1; b += 6) tile(std::integral_constant<int, 6>{}, b, panel, c);
        for (; b + lane_rows <= b1; b += lane_rows) tile(std::integral_constant<int, lane_rows>{}, b, panel, c);
        for (; b < b1; ++b) tile(std::integral_constant<int, 1>{}, b, panel, c);
    }
}

// panels_product (packed.hpp) in bf16: right from pair row kp0 on, N columns in panels of Q vectors,
// the narrowed last panel in tiles of the vectors it holds; cell(b, pre, p)
template <class V, int Q, class Cell>
ATTNX_ALWAYS_INLINE void bf16_panels_product(bool native, int b0, int b1, const uint32_t* a, size_t lda, int K2,
                                             const RightPanels<uint32_t>& right, int kp0, int N, Cell&& cell) {
    constexpr int W = Lanes<V>::W, width = Q * W;
    const int whole = N / width, rest = (N - whole * width + W - 1) / W;
    bf16_step_product<V, Q>(native, b0, b1, a, lda, K2, right.data + (size_t)kp0 * right.k_stride, right.k_stride,
                            right.panel_stride, whole, cell);
    if (!rest) return;
    const uint32_t* last = right.data + (size_t)whole * right.panel_stride + (size_t)kp0 * right.last_k_stride;
    auto last_panel = [&](auto vectors) __attribute__((always_inline)) {
        // always_inline: under LTO a clone of this lambda lost the caller's SIMD target (a wheel build error)
        bf16_step_product<V, decltype(vectors)::value>(
            native, b0, b1, a, lda, K2, last, right.last_k_stride, 0, 1,
            [&](int b, auto pre, int) __attribute__((always_inline)) { cell(b, pre, whole); });
    };
    if (rest == 1) last_panel(std::integral_constant<int, 1>{});
    else if constexpr (Q >= 2) {
        if (rest == 2) last_panel(std::integral_constant<int, 2>{});
        else if constexpr (Q >= 3) last_panel(std::integral_constant<int, 3>{});
    }
}

// The left rows of a step product: rows (b1 - b0 of them, lda apart) of K values as bf16 pairs in this
// thread's buffer, (K + 1) / 2 per row
inline const uint32_t* bf16_step_left(const float* rows, size_t lda, int count, int K) {
    thread_local std::vector<uint32_t> pairs;
    const int K2 = (K + 1) / 2;
    pairs.resize((size_t)count * K2);
    pack_bf16_rows(pairs.data(), (size_t)K2, rows, lda, count, K);
    return pairs.data();
}

// ----------------------------------------------------------------------------- Dense
// reference: cpp/reference/bf16.hpp, bf16_dense_forward
// y = act(z), z[n, o] = b[o] + sum_c bf16(x[n, c]) bf16(W[c, o]) for x (N, C), W (C, OC); y may alias z
// (except for gelu, whose backward needs z)
inline void bf16_dense_forward(float* y, float* z, const float* x, const float* W, const float* b, int N, int C, int OC,
                               Activation act) {
    bf16_gemm(z, (size_t)OC, x, (size_t)C, false, W, (size_t)OC, false, N, OC, C, false);
    if (b)
        on_widest_lanes<float>([&](auto) __attribute__((always_inline)) {
            for (int n = 0; n < N; ++n)
                for (int o = 0; o < OC; ++o) z[(size_t)n * OC + o] += b[o];
        });
    activation_forward<float>(y, z, (size_t)N, (size_t)OC, act);
}

// reference: cpp/reference/bf16.hpp, bf16_dense_backward
// dx = bf16(dz) . bf16(W)^T (overwritten; dx may be null), dW += bf16(x)^T . bf16(dz), db += sum_n dz[n, :]
// (float32: a reduction)
inline void bf16_dense_backward(float* dx, float* dW, float* db, const float* dz, const float* x, const float* W, int N,
                                int C, int OC) {
    if (dx) bf16_gemm(dx, (size_t)C, dz, (size_t)OC, false, W, (size_t)OC, true, N, C, OC, false);
    bf16_gemm(dW, (size_t)OC, x, (size_t)C, true, dz, (size_t)OC, false, C, OC, N, true);
    if (db)
        on_widest_lanes<float>([&](auto) __attribute__((always_inline)) {
            for (int n = 0; n < N; ++n)
                for (int o = 0; o < OC; ++o) db[o] += dz[(size_t)n * OC + o];
        });
}

}  // namespace attnx
