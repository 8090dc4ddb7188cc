// bfloat16 products with float32 accumulation: what the `mixed_bfloat16` policy multiplies with
// (ARCHITECTURE.md, "Mixed precision"). Operands stay float32 in memory (the master weights, the
// activations); each product rounds them to bf16 (round to nearest even) while packing them, and sums
// the products in float32. The rounding is the one function bf16_bits at every level (where AVX512_BF16
// exists, its conversion instruction gives the same bits: bf16_convert_32), so every level multiplies
// the same bf16 values:
//   - AVX-512 with AVX512_BF16 (Zen 4/5, Sapphire Rapids): vdpbf16ps, 32 products per instruction,
//     twice the float32 FMA's 16;
//   - AMX (Sapphire Rapids and later) for the products over whole matrices (bf16_gemm_pairs) and the
//     time loops' step products: tdpbf16ps, 16 x 16 x 32 products per instruction (section AMX
//     below); its sums are float32 too, but added in the hardware's own order, so they differ from
//     the other levels' in the last bits;
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
#include "attnx/amx.hpp"
#include "attnx/dense.hpp"
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

// bf16_bits on 32 floats (lo's 16, then hi's) as 32 bf16 in order, on AVX512_BF16's vcvtne2ps2bf16: it
// rounds as bf16_bits (nearest even, a NaN quieted) but flushes subnormal inputs to zero, so vectors
// holding one round on integer lanes instead. (Packing with the instruction: 16 pairs per conversion,
// not the 8 of ~10 integer operations each that bf16_bits_lanes takes.)
#define ATTNX_BF16_CONVERT __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx512bf16,avx2,fma")))
ATTNX_BF16_CONVERT ATTNX_ALWAYS_INLINE __m512i bf16_convert_32(__m512 lo, __m512 hi) {
    constexpr int kSubnormal = 0x20;  // vfpclassps' class
    if (__builtin_expect((_mm512_fpclass_ps_mask(lo, kSubnormal) | _mm512_fpclass_ps_mask(hi, kSubnormal)) == 0, 1))
        return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    const __m512i low = (__m512i)bf16_bits_lanes((uint16)lo), high = (__m512i)bf16_bits_lanes((uint16)hi);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(low)), _mm512_cvtepi32_epi16(high), 1);
}
inline __mmask16 first_lanes(int n) { return (__mmask16)((1u << std::clamp(n, 0, 16)) - 1); }

// Whether the packers convert on bf16_convert_32: where the products run on vdpbf16ps (bf16_tiles), as
// AVX512_BF16 brings both (tests that switch the instruction off test the integer packing too)
inline bool bf16_packs_converting() { return bf16_tiles().native; }

// pack_bf16_rows (below) on bf16_convert_32: 16 pairs of a row per conversion, the tail under lane masks
ATTNX_BF16_CONVERT inline void pack_bf16_rows_converting(uint32_t* pairs, size_t row_stride, const float* A,
                                                        size_t lda, int rows, int K) {
    for (int r = 0; r < rows; ++r) {
        const float* a = A + (size_t)r * lda;
        uint32_t* out = pairs + (size_t)r * row_stride;
        for (int k = 0; k < K; k += 32) {
            const int n = K - k;
            const __m512 lo = _mm512_maskz_loadu_ps(first_lanes(n), a + k),
                         hi = _mm512_maskz_loadu_ps(first_lanes(n - 16), a + k + 16);
            _mm512_mask_storeu_epi32(out + k / 2, first_lanes((n + 1) / 2), bf16_convert_32(lo, hi));
        }
    }
}

// pack_bf16_columns (below) on bf16_convert_32: 16 columns of an even and an odd row per conversion,
// whose two halves vpermw interleaves into pairs
ATTNX_BF16_CONVERT inline void pack_bf16_columns_converting(uint32_t* pairs, size_t k_stride, const float* At,
                                                           size_t ldat, int K, int cols, int pad_cols,
                                                           float* column_sums) {
    alignas(64) static constexpr uint16_t kInterleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                             8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i interleave = _mm512_load_si512(kInterleave);
    for (int kp = 0; kp < (K + 1) / 2; ++kp) {
        const float* even = At + (size_t)(2 * kp) * ldat;
        const float* odd = 2 * kp + 1 < K ? even + ldat : nullptr;
        uint32_t* out = pairs + (size_t)kp * k_stride;
        for (int c = 0; c < cols; c += 16) {
            const __mmask16 lanes = first_lanes(cols - c);
            const __m512 e = _mm512_maskz_loadu_ps(lanes, even + c),
                         o = odd ? _mm512_maskz_loadu_ps(lanes, odd + c) : _mm512_setzero_ps();
            _mm512_mask_storeu_epi32(out + c, lanes, _mm512_permutexvar_epi16(interleave, bf16_convert_32(e, o)));
            if (column_sums) {  // the even row's values added, then the odd one's: the rows in order
                const __m512 sums = _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, column_sums + c), e);
                _mm512_mask_storeu_ps(column_sums + c, lanes, odd ? _mm512_add_ps(sums, o) : sums);
            }
        }
        std::fill(out + cols, out + pad_cols, 0u);
    }
}

// pairs[r * row_stride + kp] = (A[r, 2kp], A[r, 2kp + 1]) for rows of A (rows, K), rows lda apart; a zero
// high half past an odd K. Two vectors of floats make one of pairs: as uint64 lanes the rounded even
// value sits in bits 0..15 and the odd one in bits 32..47, which lane | lane >> 16 brings to 16..31.
inline void pack_bf16_rows(uint32_t* pairs, size_t row_stride, const float* A, size_t lda, int rows, int K) {
    if (bf16_packs_converting()) return pack_bf16_rows_converting(pairs, row_stride, A, lda, rows, K);
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
// rows ldat apart (the pairs of At^T's rows, read along At's rows); zeros from cols to pad_cols. On
// float lanes V, inside a caller compiled for them (pack_bf16_columns dispatches).
template <class V>
ATTNX_ALWAYS_INLINE void pack_bf16_columns_on(uint32_t* pairs, size_t k_stride, const float* At, size_t ldat, int K,
                                              int cols, int pad_cols, float* column_sums) {
    using U = typename Lanes<V>::U;
    constexpr int W = Lanes<V>::W;
    const int K2 = (K + 1) / 2;
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
        for (c = 0; column_sums && c < cols; ++c) column_sums[c] = odd ? column_sums[c] + even[c] + odd[c]
                                                                       : column_sums[c] + even[c];
    }
}
// column_sums (null for none): column_sums[c] += At[k, c] over the rows k in order, in float32 (a Dense's bias
// gradient, summed as its dy is paired for dW = x^T dy)
inline void pack_bf16_columns(uint32_t* pairs, size_t k_stride, const float* At, size_t ldat, int K, int cols,
                              int pad_cols, float* column_sums = nullptr) {
    if (bf16_packs_converting())
        return pack_bf16_columns_converting(pairs, k_stride, At, ldat, K, cols, pad_cols, column_sums);
    on_widest_lanes<float>([&](auto lanes) __attribute__((always_inline)) {
        pack_bf16_columns_on<decltype(lanes)>(pairs, k_stride, At, ldat, K, cols, pad_cols, column_sums);
    });
}

// dst[c * dst_stride + r] = src[r * src_stride + c] for r < rows, c < cols (<= 16 each): a block of pairs
// turned over in L1, where the packers that read along one dimension and write along the other meet
inline void transpose_pairs(uint32_t* dst, size_t dst_stride, const uint32_t* src, size_t src_stride, int rows,
                            int cols) {
    for (int c = 0; c < cols; ++c)
        for (int r = 0; r < rows; ++r) dst[(size_t)c * dst_stride + r] = src[(size_t)r * src_stride + c];
}

// A panel of `width` columns from Bt (cols, K), rows ldbt apart: panel[kp * width + j] = (Bt[j, 2kp],
// Bt[j, 2kp + 1]) for j < cols (zeros past them stay as they were). Blocks of 16 rows of Bt x 16 pairs
// are paired along Bt's rows (pack_bf16_rows, on vectors) and turned over into the panel's rows.
inline void pack_bf16_panel_t(uint32_t* panel, int width, const float* Bt, size_t ldbt, int cols, int K) {
    const int K2 = (K + 1) / 2;
    alignas(64) uint32_t block[16 * 16];
    for (int j0 = 0; j0 < cols; j0 += 16)
        for (int kp0 = 0; kp0 < K2; kp0 += 16) {
            const int rows = std::min(16, cols - j0), pairs = std::min(16, K2 - kp0);
            pack_bf16_rows(block, 16, Bt + (size_t)j0 * ldbt + 2 * kp0, ldbt, rows, std::min(32, K - 2 * kp0));
            transpose_pairs(panel + (size_t)kp0 * width + j0, (size_t)width, block, 16, rows, pairs);
        }
}

// C[r, 0..cols) = start[r * start_ld + 0..cols) + sum_kp pair products of left rows r < R (pairs
// a[r * ars + kp * aks]) with the panel's pair rows (kp * k_stride + q * 16 + lane), kp < K2, on
// vdpbf16ps. start: C itself (start_ld = ldc) to accumulate, a bias (start_ld = 0), or null for zeros.
template <int Q, int R>
__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx512bf16,avx2,fma"))) void bf16_tile_dot(
    float* C, size_t ldc, int cols, const uint32_t* a, size_t ars, size_t aks, const uint32_t* panel, size_t k_stride,
    int K2, const float* start, size_t start_ld) {
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
            acc[r][q] = start ? _mm512_maskz_loadu_ps(mask[q], start + (size_t)r * start_ld + q * 16) : _mm512_setzero_ps();
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
                                         const uint32_t* panel, size_t k_stride, int K2, const float* start,
                                         size_t start_ld) {
    using U = typename Lanes<V>::U;
    constexpr int W = Lanes<V>::W;
    V acc[R][Q];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int q = 0; q < Q; ++q)
            acc[r][q] = start ? vload<V>(start + (size_t)r * start_ld + q * W, std::clamp(cols - q * W, 0, W)) : V{};
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

// A product's operands as bf16 pairs (layout above): the left's pair kp of row m at a[m * ars + kp * aks],
// the right in panels of bf16_tiles().width() columns, K2 pair rows each
struct Bf16Operands {
    const uint32_t* a;
    size_t ars, aks;
    const uint32_t* panels;
    int K2;
};

// The tiled loop of bf16_gemm_pairs over rows [m0, m1): per block of K pairs, per block of rows, per
// panel, tiles of R rows then of one; tile<rows>(C, cols, a, panel, kc, start, start_ld) multiplies one
// tile from its start (C to accumulate, else the bias or zeros: bf16_tile_dot)
template <int R, class Tile>
ATTNX_ALWAYS_INLINE void bf16_tiled_rows(float* C, size_t ldc, int m0, int m1, int N, int width,
                                         const Bf16Operands& ops, bool accumulate, const float* bias, Tile&& tile) {
    const int panel_count = (N + width - 1) / width, K2 = ops.K2;
    for (int kb = 0; kb < K2; kb += kBf16PairBlock) {
        const int kc = std::min(kBf16PairBlock, K2 - kb);
        const bool acc = accumulate || kb > 0;
        for (int mb = m0; mb < m1; mb += kBf16RowBlock) {
            const int mb1 = std::min(m1, mb + kBf16RowBlock);
            for (int p = 0; p < panel_count; ++p) {
                const int n0 = p * width, cols = std::min(width, N - n0);
                const uint32_t* panel = ops.panels + ((size_t)p * K2 + kb) * width;
                auto at = [&](auto rows, int m) __attribute__((always_inline)) {
                    float* c = C + (size_t)m * ldc + n0;
                    tile(rows, c, cols, ops.a + (size_t)m * ops.ars + (size_t)kb * ops.aks, panel, kc,
                         acc ? c : bias ? bias + n0 : nullptr, acc ? ldc : 0);
                };
                int m = mb;
                for (; m + R <= mb1; m += R) at(std::integral_constant<int, R>{}, m);
                for (; m < mb1; ++m) at(std::integral_constant<int, 1>{}, m);
            }
        }
    }
}

// ----------------------------------------------------------------------------- AMX
// bf16_gemm_pairs on AMX tiles (amx.hpp): blocks of C of 32 x 32 (tiles 0-3: four 16 x 16 float32
// sums) += A (tiles 4-5: 16 rows x 16 pairs each) . B (tiles 6-7: 16 pair rows x 16 columns each), K in
// steps of 16 pairs. B tiles are read from the panels in place (a panel's pair rows are B's tile rows,
// `width` apart); a panel's last K2 % 16 pair rows from a zero-padded copy (what follows a panel need
// not be finite). A tiles from a copy of the left operand as rows of a whole number of tiles of pairs,
// zeros past K2 and M (AmxLeftRows). tdpbf16ps sums in float32 (subnormals as zero, as vdpbf16ps) but
// not in vdpbf16ps' order: the sums agree with the other levels to float32 accumulation's error, not
// bit for bit.
constexpr int kAmxPairs = 16, kAmxRows = 16;
#define ATTNX_AMX_BF16 __attribute__((target("amx-tile,amx-bf16,avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))

// Where a tile of sums starts from (its rows `stride` bytes apart): rows x cols of start (rows start_ld
// apart; start_ld 0 repeats one row, a bias, read with stride 0) in place when they fill the tile,
// else copied into edge with zeros past them; null for zeros (no start)
struct AmxTileSource {
    const void* data;
    size_t stride;
};
inline AmxTileSource amx_sums_source(const float* start, size_t start_ld, int rows, int cols, float* edge) {
    if (!start) return {nullptr, 0};
    if (cols == 16 && (rows == kAmxRows || !start_ld)) return {start, start_ld * sizeof(float)};  // (a bias: any rows)
    for (int r = 0; r < kAmxRows; ++r)
        for (int c = 0; c < 16; ++c) edge[r * 16 + c] = r < rows && c < cols ? start[r * start_ld + c] : 0.0f;
    return {edge, 16 * sizeof(float)};
}

// rows x cols of C = the sums a tile stored into edge (a tile that fills C stores in place instead)
inline void amx_copy_sums(float* C, size_t ldc, int rows, int cols, const float* edge) {
    for (int r = 0; r < rows; ++r) std::memcpy(C + (size_t)r * ldc, edge + r * 16, (size_t)cols * sizeof(float));
}

// (the tile intrinsics name their tile in the instruction's text: a literal, not a template argument)
#define ATTNX_AMX_LOAD_SUMS(tile, start, rows, cols)                                   \
    do {                                                                               \
        const AmxTileSource source = amx_sums_source(start, start_ld, rows, cols, edge); \
        ATTNX_AMX_MEMORY_BARRIER();                                                    \
        if (source.data) _tile_loadd(tile, source.data, source.stride);                \
        else _tile_zero(tile);                                                         \
    } while (0)
#define ATTNX_AMX_STORE_SUMS(tile, c, rows, cols)                  \
    do {                                                           \
        if ((rows) == kAmxRows && (cols) == 16) {                  \
            _tile_stored(tile, c, ldc * sizeof(float));            \
        } else {                                                   \
            _tile_stored(tile, edge, 16 * sizeof(float));          \
            ATTNX_AMX_MEMORY_BARRIER();                            \
            amx_copy_sums(c, ldc, rows, cols, edge);               \
        }                                                          \
    } while (0)

// C[0, rows) x [0, cols) (rows <= 16 RT, cols <= 32) = start + a . b:
//   C[r, n] = start[r, n] + sum_{kp < K2p} pair products of a[r * a_stride + kp] and b[kp * k_stride + n]
// where b is the panel for kp < whole, and tail (K2p - whole pair rows, k_stride apart) past it.
// start: C itself (start_ld = ldc) to accumulate, a bias (start_ld = 0), or null for zeros.
template <int RT>
ATTNX_AMX_BF16 void amx_bf16_block(float* C, size_t ldc, int rows, int cols, const uint32_t* a, size_t a_stride,
                                   int K2p, const uint32_t* panel, size_t k_stride, int whole, const uint32_t* tail,
                                   const float* start, size_t start_ld) {
    alignas(64) float edge[kAmxRows * 16];
    const int rows0 = std::min(rows, kAmxRows), rows1 = rows - rows0, cols0 = std::min(cols, 16),
              cols1 = std::max(cols - 16, 0);
    const float* start1 = start ? start + (size_t)kAmxRows * start_ld : nullptr;  // the second row tile's
    ATTNX_AMX_LOAD_SUMS(0, start, rows0, cols0);
    ATTNX_AMX_LOAD_SUMS(1, start ? start + 16 : nullptr, rows0, cols1);
    if constexpr (RT == 2) {
        ATTNX_AMX_LOAD_SUMS(2, start1, rows1, cols0);
        ATTNX_AMX_LOAD_SUMS(3, start1 ? start1 + 16 : nullptr, rows1, cols1);
    }
    const size_t a_bytes = a_stride * sizeof(uint32_t), b_bytes = k_stride * sizeof(uint32_t);
    ATTNX_AMX_MEMORY_BARRIER();  // the packed operands are written before the call
    for (int kp = 0; kp < K2p; kp += kAmxPairs) {
        const uint32_t* b = kp < whole ? panel + (size_t)kp * k_stride : tail;
        _tile_loadd(4, a + kp, a_bytes);
        _tile_loadd(6, b, b_bytes);
        _tile_loadd(7, b + 16, b_bytes);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        if constexpr (RT == 2) {
            _tile_loadd(5, a + kAmxRows * a_stride + kp, a_bytes);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    ATTNX_AMX_MEMORY_BARRIER();  // (C's whole tiles: the caller reads them after the call)
    ATTNX_AMX_STORE_SUMS(0, C, rows0, cols0);
    ATTNX_AMX_STORE_SUMS(1, C + 16, rows0, cols1);
    if constexpr (RT == 2) {
        ATTNX_AMX_STORE_SUMS(2, C + kAmxRows * ldc, rows1, cols0);
        ATTNX_AMX_STORE_SUMS(3, C + kAmxRows * ldc + 16, rows1, cols1);
    }
    ATTNX_AMX_MEMORY_BARRIER();  // what the whole tiles stored into C
}
#undef ATTNX_AMX_LOAD_SUMS
#undef ATTNX_AMX_STORE_SUMS

// The left operand as A tiles read it: Mp = M rounded up to 16 rows of K2p = K2 rounded up to 16 pairs,
// zeros past K2 and M, rows `stride` apart (not a multiple of 4 KiB, which would put a tile's 16 rows
// in one L1 set)
struct AmxLeftRows {
    uint32_t* data;
    size_t stride;
    int K2p;
};
inline int amx_pairs_padded(int K2) { return (K2 + kAmxPairs - 1) / kAmxPairs * kAmxPairs; }
inline size_t amx_row_stride(int K2p) { return (size_t)K2p + (K2p % 1024 == 0 ? kAmxPairs : 0); }

// Zeros past K2 pairs in rows [r0, r1) of left, and in the whole rows from M on
inline void amx_zero_left_padding(const AmxLeftRows& left, int K2, int M, int r0, int r1) {
    for (int m = r0; m < r1; ++m) {
        uint32_t* row = left.data + (size_t)m * left.stride;
        std::fill(row + (m < M ? K2 : 0), row + left.stride, 0u);
    }
}

// Rows [r0, r1) (multiples of 16, r1 up to Mp) of left from ops' left operand of M rows: in place along
// a row (aks 1), or turned over in blocks of 16 x 16 pairs from a k-major one
inline void amx_copy_left_rows(const AmxLeftRows& left, const Bf16Operands& ops, int M, int r0, int r1) {
    const int K2 = ops.K2, m1 = std::min(r1, M);
    for (int mb = r0; mb < m1; mb += kAmxRows) {
        const int rows = std::min(kAmxRows, m1 - mb);
        for (int kb = 0; kb < K2; kb += kAmxPairs) {
            const int pairs = std::min(kAmxPairs, K2 - kb);
            uint32_t* to = left.data + (size_t)mb * left.stride + kb;
            const uint32_t* from = ops.a + (size_t)mb * ops.ars + (size_t)kb * ops.aks;
            if (ops.aks == 1)
                for (int r = 0; r < rows; ++r)
                    std::memcpy(to + (size_t)r * left.stride, from + (size_t)r * ops.ars, pairs * sizeof(uint32_t));
            else
                transpose_pairs(to, left.stride, from, ops.aks, pairs, rows);
        }
    }
    amx_zero_left_padding(left, K2, M, r0, r1);
}

// Rows [r0, r1) (multiples of 16, r1 up to Mp) of left from op(A) (M, K) of floats, paired in place: A's
// rows (lda apart) along them, or A^T's (A (K, M), trans_a) paired along A's rows in blocks of 16 x 16
// pairs (pack_bf16_columns) turned over into left's rows
inline void pack_amx_left_rows(const AmxLeftRows& left, const float* A, size_t lda, bool trans_a, int M, int K, int r0,
                               int r1) {
    const int K2 = (K + 1) / 2, m1 = std::min(r1, M);
    if (!trans_a && r0 < m1) pack_bf16_rows(left.data + (size_t)r0 * left.stride, left.stride, A + (size_t)r0 * lda, lda, m1 - r0, K);
    // (64 of A's columns at a time: a pack call per 16 was mostly call)
    constexpr int kStrip = 4 * kAmxRows;
    alignas(64) uint32_t block[kAmxPairs * kStrip];
    for (int mb = r0; trans_a && mb < m1; mb += kStrip) {
        const int strip = std::min(kStrip, m1 - mb);
        for (int kb = 0; kb < K2; kb += kAmxPairs) {
            const int pairs = std::min(kAmxPairs, K2 - kb);
            pack_bf16_columns(block, kStrip, A + (size_t)(2 * kb) * lda + mb, lda, std::min(2 * kAmxPairs, K - 2 * kb),
                              strip, strip);
            for (int m = 0; m < strip; m += kAmxRows)
                transpose_pairs(left.data + (size_t)(mb + m) * left.stride + kb, left.stride, block + m, kStrip, pairs,
                                std::min(kAmxRows, strip - m));
        }
    }
    amx_zero_left_padding(left, K2, M, r0, r1);
}

// C = start + left . panels on AMX tiles: panels of `width` columns (a multiple of 32), K2 pair rows each;
// threads split the blocks of 32 rows (or the panels, when there are fewer blocks than threads); a
// thread's row blocks each pass over a group of ~1 MiB of panels, which stays in L2, while the block's
// rows stay in L1 and C's rows are written along, not across
inline void amx_gemm_pairs(float* C, size_t ldc, const AmxLeftRows& left, const uint32_t* panels, int width, int K2,
                           int M, int N, bool accumulate, const float* bias) {
    const int K2p = left.K2p, whole = K2 / kAmxPairs * kAmxPairs, panel_count = (N + width - 1) / width;
    const size_t panel_size = (size_t)K2 * width;
    // each panel's pair rows past `whole`, zero-padded to 16 (this thread's buffer, read by the workers)
    thread_local Panels<uint32_t> tails;  // (on cache lines, as every tile load's rows)
    if (whole < K2) {
        tails.assign((size_t)panel_count * kAmxPairs * width, 0u);
        for (int p = 0; p < panel_count; ++p)
            std::memcpy(tails.data() + (size_t)p * kAmxPairs * width, panels + p * panel_size + (size_t)whole * width,
                        (size_t)(K2 - whole) * width * sizeof(uint32_t));
    }
    const uint32_t* tail0 = tails.data();
    const int row_blocks = (M + 2 * kAmxRows - 1) / (2 * kAmxRows);
    const int group = std::max(1, (int)((1 << 20) / (panel_size * sizeof(uint32_t) + 1)));
    const size_t parts = kernel_threads();
    const bool split_rows = row_blocks >= (int)parts;
    parallel_for(split_rows ? (size_t)row_blocks : (size_t)panel_count, 2.0 * M * N * K2 * 2 / 16, [&](size_t lo, size_t hi) {
        const AmxTileScope tiles;
        const int p0 = split_rows ? 0 : (int)lo, p1 = split_rows ? panel_count : (int)hi;
        const int m_begin = split_rows ? (int)lo * 2 * kAmxRows : 0,
                  m_end = split_rows ? std::min(M, (int)hi * 2 * kAmxRows) : M;
        for (int g = p0; g < p1; g += group)
            for (int m = m_begin; m < m_end; m += 2 * kAmxRows) {
                const int rows = std::min(2 * kAmxRows, m_end - m);
                const uint32_t* a = left.data + (size_t)m * left.stride;
                for (int p = g; p < std::min(p1, g + group); ++p)
                    for (int half = 0; half < width && p * width + half < N; half += 32) {
                        const int n0 = p * width + half, cols = std::min(32, N - n0);
                        const uint32_t* panel = panels + p * panel_size + half;
                        const uint32_t* tail = tail0 + (size_t)p * kAmxPairs * width + half;
                        float* c = C + (size_t)m * ldc + n0;
                        const float* start = accumulate ? c : bias ? bias + n0 : nullptr;
                        const size_t start_ld = accumulate ? ldc : 0;
                        if (rows > kAmxRows)
                            amx_bf16_block<2>(c, ldc, rows, cols, a, left.stride, K2p, panel, (size_t)width, whole, tail,
                                              start, start_ld);
                        else
                            amx_bf16_block<1>(c, ldc, rows, cols, a, left.stride, K2p, panel, (size_t)width, whole, tail,
                                              start, start_ld);
                    }
            }
    });
}

// C[m, n] = bias[n] + sum_kp pair products of the left's row m with the right's column n (+ C[m, n]
// instead of the bias when accumulate; bias may be null), sums in float32, on operands paired by
// pack_bf16_left / pack_bf16_right; the rows of C split across the thread budget
inline void bf16_gemm_pairs(float* C, size_t ldc, const Bf16Operands& ops, int M, int N, bool accumulate,
                            const float* bias = nullptr) {
    if (M <= 0 || N <= 0) return;
    const Bf16Tiles tiles = bf16_tiles();
    if (amx_bf16_active()) {
        // the left rows copied as A tiles read them (this thread's buffer, written by every thread)
        const int K2p = amx_pairs_padded(ops.K2), Mp = (M + kAmxRows - 1) / kAmxRows * kAmxRows;
        thread_local Panels<uint32_t> rows;
        rows.resize((size_t)Mp * amx_row_stride(K2p));
        const AmxLeftRows left{rows.data(), amx_row_stride(K2p), K2p};
        const size_t parts = kernel_threads(), blocks = (size_t)Mp / kAmxRows;
        parallel_for(parts, double(Mp) * K2p, [&](size_t lo, size_t hi) {
            amx_copy_left_rows(left, ops, M, (int)(blocks * lo / parts) * kAmxRows, (int)(blocks * hi / parts) * kAmxRows);
        });
        return amx_gemm_pairs(C, ldc, left, ops.panels, tiles.width(), ops.K2, M, N, accumulate, bias);
    }
    const int width = tiles.width(), R = tiles.R, row_tiles = (M + R - 1) / R;
    const double work = 2.0 * M * N * ops.K2;
    parallel_for((size_t)row_tiles, work, [&](size_t lo, size_t hi) {
        const int m0 = (int)lo * R, m1 = std::min(M, (int)hi * R);
        if (tiles.native) {
            bf16_tiled_rows<6>(C, ldc, m0, m1, N, width, ops, accumulate, bias,
                               [&](auto rows, float* c, int cols, const uint32_t* a, const uint32_t* panel, int kc,
                                   const float* start, size_t start_ld) {
                                   bf16_tile_dot<4, decltype(rows)::value>(c, ldc, cols, a, ops.ars, ops.aks, panel,
                                                                           (size_t)width, kc, start, start_ld);
                               });
            return;
        }
        on_widest_lanes<float>([&](auto lanes) __attribute__((always_inline)) {
            using V = decltype(lanes);
            constexpr int TR = Lanes<V>::W == 16 ? 6 : 4;
            bf16_tiled_rows<TR>(C, ldc, m0, m1, N, width, ops, accumulate, bias,
                                [&](auto rows, float* c, int cols, const uint32_t* a, const uint32_t* panel, int kc,
                                    const float* start, size_t start_ld) __attribute__((always_inline)) {
                                    bf16_tile_lanes<V, 2, decltype(rows)::value>(c, ldc, cols, a, ops.ars, ops.aks,
                                                                                 panel, (size_t)width, kc, start,
                                                                                 start_ld);
                                });
        });
    });
}

// Rows [r0, r1) of op(A) (M, K) paired in bf16_gemm's left layout: row m's pairs at m * (K + 1) / 2,
// or with trans_a (A (K, M) read along its rows) pair kp of every row at kp * M
inline void pack_bf16_left(uint32_t* a_pairs, const float* A, size_t lda, bool trans_a, int M, int K, int r0, int r1) {
    if (trans_a) pack_bf16_columns(a_pairs + r0, (size_t)M, A + r0, lda, K, r1 - r0, r1 - r0);
    else pack_bf16_rows(a_pairs + (size_t)r0 * ((K + 1) / 2), (size_t)(K + 1) / 2, A + (size_t)r0 * lda, lda, r1 - r0, K);
}

// Panels [p0, p1) of op(B) (K, N) (B, or B^T of B (N, K) when trans_b) in panels of `width` columns,
// zeros past N; column_sums (B only, null for none): their columns' sums over k added in (pack_bf16_columns)
inline void pack_bf16_right(uint32_t* panels, int width, const float* B, size_t ldb, bool trans_b, int K, int N, int p0,
                            int p1, float* column_sums = nullptr) {
    const int K2 = (K + 1) / 2;
    for (int p = p0; p < p1; ++p) {
        const int n0 = p * width, cols = std::min(width, N - n0);
        uint32_t* panel = panels + (size_t)p * K2 * width;
        if (!trans_b) continue;  // below, along B's rows
        pack_bf16_panel_t(panel, width, B + (size_t)n0 * ldb, ldb, cols, K);
        if (cols < width)
            for (int kp = 0; kp < K2; ++kp) std::fill(panel + (size_t)kp * width + cols, panel + (size_t)(kp + 1) * width, 0u);
    }
    if (trans_b) return;
    // 32 rows of B at a time into every panel, while they are in cache: a panel at a time would read
    // each of B's K rows once per panel, a page apart
    for (int k0 = 0; k0 < K; k0 += 32)
        for (int p = p0; p < p1; ++p) {
            const int n0 = p * width, cols = std::min(width, N - n0);
            pack_bf16_columns(panels + (size_t)p * K2 * width + (size_t)(k0 / 2) * width, (size_t)width,
                              B + (size_t)k0 * ldb + n0, ldb, std::min(32, K - k0), cols, width,
                              column_sums ? column_sums + n0 : nullptr);
        }
}

// op(A) (M, K) paired for bf16 products with one or more right operands (bf16_left_product), in this
// thread's buffer (kept between calls: a fresh buffer of megabytes is as many page faults, the packers
// writing every pair): under AMX straight into the rows A tiles read, else in bf16_gemm_pairs' layout. A
// thread's left lives until its next bf16_left.
struct Bf16Left {
    const float* A;
    size_t lda;
    bool trans_a;
    int M, K;
    uint32_t* pairs;
    AmxLeftRows amx;  // data null off AMX
};
inline Bf16Left bf16_left(const float* A, size_t lda, bool trans_a, int M, int K) {
    // (the workers reach this thread's buffer through the returned pointers: a thread_local named in a
    // parallel_for lambda would be the worker's own)
    thread_local Panels<uint32_t> buffer;
    const int K2 = (K + 1) / 2;
    if (!amx_bf16_active()) {
        buffer.resize((size_t)M * K2);
        return {A, lda, trans_a, M, K, buffer.data(), {nullptr, 0, 0}};
    }
    const int K2p = amx_pairs_padded(K2), blocks = (M + kAmxRows - 1) / kAmxRows;
    buffer.resize((size_t)blocks * kAmxRows * amx_row_stride(K2p));
    return {A, lda, trans_a, M, K, buffer.data(), {buffer.data(), amx_row_stride(K2p), K2p}};
}

// Part [lo, hi) of `parts` of the left's rows paired: a thread's share, inside parallel_for(parts)
inline void pack_bf16_left_part(const Bf16Left& left, size_t lo, size_t hi, size_t parts) {
    if (!left.amx.data)
        return pack_bf16_left(left.pairs, left.A, left.lda, left.trans_a, left.M, left.K, (int)(left.M * lo / parts),
                              (int)(left.M * hi / parts));
    const size_t blocks = (size_t)(left.M + kAmxRows - 1) / kAmxRows;
    pack_amx_left_rows(left.amx, left.A, left.lda, left.trans_a, left.M, left.K, (int)(blocks * lo / parts) * kAmxRows,
                       (int)(blocks * hi / parts) * kAmxRows);
}

// C = left . the panels of op(B) (K, N) that pack_bf16_right wrote (+ C when accumulate, else + bias when given)
inline void bf16_left_product(float* C, size_t ldc, const Bf16Left& left, const uint32_t* panels, int N, bool accumulate,
                              const float* bias) {
    const int K2 = (left.K + 1) / 2;
    if (left.amx.data)
        return amx_gemm_pairs(C, ldc, left.amx, panels, bf16_tiles().width(), K2, left.M, N, accumulate, bias);
    const size_t ars = left.trans_a ? 1 : (size_t)K2, aks = left.trans_a ? (size_t)left.M : 1;
    bf16_gemm_pairs(C, ldc, {left.pairs, ars, aks, panels, K2}, left.M, N, accumulate, bias);
}

// The most right operands one bf16_gemm_rights call of the dense blocks takes (a query, key and value, a gate)
constexpr int kMaxDenseBlocks = 4;

// One right operand of bf16_gemm_rights and where its product goes: C = op(A) . op(B) (+ C when accumulate,
// else + bias when given); op(B) (K, N) is B (K, N), rows ldb apart, or B^T of B (N, K) when trans_b.
// column_sums (not with trans_b; null for none): column_sums[n] += sum_k B[k, n] in float32, k in order,
// as B is paired (a Dense's bias gradient beside its kernel's)
struct Bf16Right {
    const float* B;
    size_t ldb;
    bool trans_b;
    int N;
    float* C;
    size_t ldc;
    bool accumulate;
    const float* bias;
    float* column_sums = nullptr;
};

// reference: cpp/reference/bf16.hpp, bf16_gemm (for each right operand)
// The products of one left operand op(A) (M, K) (A (M, K) with rows lda apart, or A^T of A (K, M) when
// trans_a) with `count` right operands (a layer's projections of one input): every operand paired once per
// call, the left for all of them, in one parallel pass (this thread's buffers), then a product per right.
inline void bf16_gemm_rights(const float* A, size_t lda, bool trans_a, int M, int K, const Bf16Right* rights,
                             int count) {
    if (M <= 0) {  // no product, but the column sums
        for (int r = 0; r < count; ++r)
            for (int k = 0; rights[r].column_sums && k < K; ++k)
                for (int n = 0; n < rights[r].N; ++n) rights[r].column_sums[n] += rights[r].B[(size_t)k * rights[r].ldb + n];
        return;
    }
    if (K <= 0) {
        for (int r = 0; r < count; ++r) {
            const Bf16Right& right = rights[r];
            for (int m = 0; !right.accumulate && m < M; ++m)
                for (int n = 0; n < right.N; ++n) right.C[(size_t)m * right.ldc + n] = right.bias ? right.bias[n] : 0.0f;
        }
        return;
    }
    const int K2 = (K + 1) / 2, width = bf16_tiles().width();
    thread_local Panels<uint32_t> right_buffer;  // every right's panels, one after the other
    thread_local std::vector<size_t> first_panel;
    first_panel.assign(count + 1, 0);
    for (int r = 0; r < count; ++r) first_panel[r + 1] = first_panel[r] + (std::max(rights[r].N, 0) + width - 1) / width;
    right_buffer.resize(first_panel[count] * K2 * width);
    uint32_t* panels = right_buffer.data();
    const size_t* first = first_panel.data();
    const Bf16Left left = bf16_left(A, lda, trans_a, M, K);
    const size_t parts = kernel_threads();
    double work = 0;
    for (int r = 0; r < count; ++r) work += double(M) * std::max(rights[r].N, 0) * K / 8;
    parallel_for(parts, work, [&](size_t lo, size_t hi) {
        pack_bf16_left_part(left, lo, hi, parts);
        for (int r = 0; r < count; ++r) {
            const Bf16Right& right = rights[r];
            const size_t panel_count = first[r + 1] - first[r];
            pack_bf16_right(panels + first[r] * K2 * width, width, right.B, right.ldb, right.trans_b, K, right.N,
                            (int)(panel_count * lo / parts), (int)(panel_count * hi / parts), right.column_sums);
        }
    });
    for (int r = 0; r < count; ++r)
        if (rights[r].N > 0)
            bf16_left_product(rights[r].C, rights[r].ldc, left, panels + first[r] * K2 * width, rights[r].N,
                              rights[r].accumulate, rights[r].bias);
}

// reference: cpp/reference/bf16.hpp, bf16_gemm
// C[m, n] = sum_k bf16(op(A)[m, k]) bf16(op(B)[k, n])   (+ C[m, n] when accumulate, else + bias[n] when
// given), sums in float32. op(A) (M, K): A (M, K) with rows lda apart, or A^T of A (K, M) when trans_a;
// op(B) (K, N): B (K, N) with rows ldb apart, or B^T of B (N, K) when trans_b; C's rows ldc apart.
inline void bf16_gemm(float* C, size_t ldc, const float* A, size_t lda, bool trans_a, const float* B, size_t ldb,
                      bool trans_b, int M, int N, int K, bool accumulate, const float* bias = nullptr) {
    if (N <= 0) return;
    const Bf16Right right{B, ldb, trans_b, N, C, ldc, accumulate, bias};
    bf16_gemm_rights(A, lda, trans_a, M, K, &right, 1);
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

// f(integral_constant<int, rows>) for rows in [1, R]
template <int R, class F> ATTNX_ALWAYS_INLINE void with_tile_rows(int rows, F&& f) {
    if constexpr (R > 1)
        if (rows < R) return with_tile_rows<R - 1>(rows, f);
    f(std::integral_constant<int, R>{});
}

// One AMX tile of a step product: sums (16 x 16 Q, rows 16 Q apart) = left (16 rows of K2p pairs, zeros
// past the real ones) . the panel's pair rows (k_stride apart, Q tiles of 16 columns), K2p a multiple of
// 16; the rows past `whole` (K2p's last 16 when the panel has fewer) come from tail, a zero-padded copy
// with rows 16 Q apart (the panel may end there, and what follows it need not be finite)
template <int Q>
ATTNX_AMX_BF16 void amx_step_tile(float* sums, const uint32_t* left, int K2p, const uint32_t* panel, size_t k_stride,
                                  int whole, const uint32_t* tail) {
    static_assert(Q >= 1 && Q <= 4, "tiles 0-3 hold the sums, 4 the left rows, 5-7 the panel's");
    const size_t a_bytes = (size_t)K2p * sizeof(uint32_t);
    _tile_zero(0);
    if constexpr (Q > 1) _tile_zero(1);
    if constexpr (Q > 2) _tile_zero(2);
    if constexpr (Q > 3) _tile_zero(3);
    ATTNX_AMX_MEMORY_BARRIER();
    for (int kp = 0; kp < K2p; kp += kAmxPairs) {
        const uint32_t* b = kp < whole ? panel + (size_t)kp * k_stride : tail;
        const size_t b_bytes = (kp < whole ? k_stride : (size_t)Q * 16) * sizeof(uint32_t);
        _tile_loadd(4, left + kp, a_bytes);
        _tile_loadd(5, b, b_bytes);
        _tile_dpbf16ps(0, 4, 5);
        if constexpr (Q > 1) {
            _tile_loadd(6, b + 16, b_bytes);
            _tile_dpbf16ps(1, 4, 6);
        }
        if constexpr (Q > 2) {
            _tile_loadd(7, b + 32, b_bytes);
            _tile_dpbf16ps(2, 4, 7);
        }
        if constexpr (Q > 3) {
            _tile_loadd(5, b + 48, b_bytes);
            _tile_dpbf16ps(3, 4, 5);
        }
    }
    const size_t c_bytes = (size_t)Q * 16 * sizeof(float);
    _tile_stored(0, sums, c_bytes);
    if constexpr (Q > 1) _tile_stored(1, sums + 16, c_bytes);
    if constexpr (Q > 2) _tile_stored(2, sums + 32, c_bytes);
    if constexpr (Q > 3) _tile_stored(3, sums + 48, c_bytes);
    ATTNX_AMX_MEMORY_BARRIER();
}

// Whether the step products of a kernel paired for vdpbf16ps (`native`, bf16_tiles) run on AMX tiles
inline bool bf16_steps_on_amx(bool native) { return native && amx_bf16_active(); }

// bf16_step_product (below) on AMX tiles (Q vectors of 16 lanes per block): per block and tile of 16 rows
// the sums, handed to cell row by row. The rows are bf16_step_left's under AMX: K2p pairs apart, zeros
// past K2, and whole tiles of them readable (the rows past b1 give sums no cell reads).
template <class V, int Q, class Cell>
ATTNX_ALWAYS_INLINE void amx_step_product(int b0, int b1, const uint32_t* a, int K2, const uint32_t* panel0,
                                          size_t k_stride, size_t block_stride, int blocks, Cell&& cell) {
    constexpr int width = Q * 16;
    const int n = b1 - b0, row_tiles = (n + kAmxRows - 1) / kAmxRows, K2p = amx_pairs_padded(K2),
              whole = K2 / kAmxPairs * kAmxPairs;
    alignas(64) float sums[kAmxRows * width];
    // each block's pair rows past `whole`, over zeros that stay for every block
    alignas(64) uint32_t tail[kAmxPairs * width];
    if (whole < K2) std::fill(tail, tail + kAmxPairs * width, 0u);
    const AmxTileScope tiles;
    for (int c = 0; c < blocks; ++c) {
        const uint32_t* panel = panel0 + (size_t)c * block_stride;
        for (int kp = whole; kp < K2; ++kp)
            std::memcpy(tail + (size_t)(kp - whole) * width, panel + (size_t)kp * k_stride, width * sizeof(uint32_t));
        for (int t = 0; t < row_tiles; ++t) {
            amx_step_tile<Q>(sums, a + (size_t)t * kAmxRows * K2p, K2p, panel, k_stride, whole, tail);
            const int rows = std::min(kAmxRows, n - t * kAmxRows);
            for (int r = 0; r < rows; ++r) {
                TileRow<V, Q> pre;
                for (int q = 0; q < Q; ++q) pre.q[q] = vload<V>(sums + r * width + q * 16, 16);
                cell(b0 + t * kAmxRows + r, pre, c);
            }
        }
    }
}

// For every block c < blocks (pair rows at panel0 + c * block_stride, k_stride apart, Q vectors of V
// each) and every row b of [b0, b1) (K2 pairs at a + (b - b0) * lda):
//   pre.q[q] = sum_kp pair products of row b with the block's vector q;  then cell(b, pre, c)
// vdpbf16ps tiles of up to 6 rows where `native` (bf16_tiles; V is then 16 floats), else bf16_tile_lanes
// (up to 4 rows on AVX-512, 2 on narrower lanes, where the even and odd halves take twice the
// registers). The rows go in the fewest tiles of near-equal size: 32 rows as 6 6 5 5 5 5, not five of
// 6 and two of one, whose Q chains each wait on the instruction's latency (a 6-row tile's Q R do not).
template <class V, int Q, class Cell>
ATTNX_ALWAYS_INLINE void bf16_step_product(bool native, int b0, int b1, const uint32_t* a, size_t lda, int K2,
                                           const uint32_t* panel0, size_t k_stride, size_t block_stride, int blocks,
                                           Cell&& cell) {
    constexpr int W = Lanes<V>::W, width = Q * W, lane_rows = W == 16 ? 4 : 2;
    alignas(64) float sums[6 * width];
    auto tile = [&](auto rows, int b, const uint32_t* panel, int c) __attribute__((always_inline)) {
        constexpr int R = decltype(rows)::value;
        const uint32_t* left = a + (size_t)(b - b0) * lda;
        bool done = false;
        if constexpr (W == 16)
            if (native) bf16_tile_dot<Q, R>(sums, width, width, left, lda, 1, panel, k_stride, K2, nullptr, 0), done = true;
        if constexpr (R <= lane_rows)
            if (!done) bf16_tile_lanes<V, Q, R>(sums, width, width, left, lda, 1, panel, k_stride, K2, nullptr, 0);
        for (int r = 0; r < R; ++r) {
            TileRow<V, Q> pre;
            for (int q = 0; q < Q; ++q) pre.q[q] = vload<V>(sums + r * width + q * W, W);
            cell(b + r, pre, c);
        }
    };
    if constexpr (W == 16)
        if (bf16_steps_on_amx(native))
            return amx_step_product<V, Q>(b0, b1, a, K2, panel0, k_stride, block_stride, blocks, cell);
    const int n = b1 - b0, most = W == 16 && native ? 6 : lane_rows, tiles = (n + most - 1) / most;
    for (int c = 0; c < blocks; ++c) {
        const uint32_t* panel = panel0 + (size_t)c * block_stride;
        for (int i = 0, b = b0; i < tiles; ++i) {
            const int rows = n / tiles + (i < n % tiles);
            auto run = [&](auto r) __attribute__((always_inline)) { tile(r, b, panel, c); };
            bool done = false;
            if constexpr (W == 16)
                if (native) with_tile_rows<6>(rows, run), done = true;
            if (!done) with_tile_rows<lane_rows>(rows, run);
            b += rows;
        }
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

// How far apart bf16_step_left puts its rows of K2 pairs: as A tiles read them under AMX (K2 rounded up
// to whole tiles, zeros past K2), else K2
inline size_t bf16_step_stride(int K2) { return amx_bf16_active() ? (size_t)amx_pairs_padded(K2) : (size_t)K2; }

// The left rows of a step product: count rows of left.K values (lda apart) followed by left.C of
// left.x (the fused input, ldx apart; C = 0 without) as bf16 pairs of the K + C values in this
// thread's buffer, K2 = (K + C + 1) / 2 per row (an odd K pairs its last value with x's first), rows
// bf16_step_stride(K2) apart; under AMX zeros past K2 and up to a whole tile of rows
inline const uint32_t* bf16_step_left(const LeftRows<float>& left, int count) {
    // (on cache lines: an A tile's rows that straddle two lines load at a fraction of the rate)
    thread_local Panels<uint32_t> pairs;
    const int K = left.K, C = left.C, K2 = (K + C + 1) / 2;
    const size_t stride = bf16_step_stride(K2);
    const int rows = stride == (size_t)K2 ? count : (count + kAmxRows - 1) / kAmxRows * kAmxRows;
    pairs.resize((size_t)rows * stride);
    pack_bf16_rows(pairs.data(), stride, left.a, left.lda, count, K - K % 2);
    for (int r = 0; r < rows; ++r)
        std::fill(pairs.data() + (size_t)r * stride + (r < count ? K2 : 0), pairs.data() + (size_t)(r + 1) * stride, 0u);
    if (C == 0) {
        if (K % 2) pack_bf16_rows(pairs.data() + K / 2, stride, left.a + K - 1, left.lda, count, 1);
        return pairs.data();
    }
    for (int r = 0; K % 2 && r < count; ++r)
        pairs[(size_t)r * stride + K / 2] = bf16_bits(left.a[(size_t)r * left.lda + K - 1]) | bf16_bits(left.x[(size_t)r * left.ldx]) << 16;
    const int skip = K % 2;  // x's values already paired
    pack_bf16_rows(pairs.data() + (K + 1) / 2, stride, left.x + skip, left.ldx, count, C - skip);
    return pairs.data();
}
inline const uint32_t* bf16_step_left(const float* rows, size_t lda, int count, int K) {
    return bf16_step_left(LeftRows<float>{rows, lda, K, nullptr, 0, 0}, count);
}

// ----------------------------------------------------------------------------- Dense
// One block of columns of a dense layer whose blocks share the input x (N, C) (a self-attention's query,
// key and value projections, each its own array): kernel W (C, OC), bias b (OC) or null; forward its output y
// (N, OC), backward its output gradient dy, dW and db (accumulated; db may be null)
struct Bf16DenseBlock {
    const float* W;
    const float* b;
    int OC;
    float* y;
    const float* dy;
    float* dW;
    float* db;
};

// reference: cpp/reference/bf16.hpp, bf16_dense_forward (each block, linear)
// y_j[n, o] = b_j[o] + sum_c bf16(x[n, c]) bf16(W_j[c, o]) for the blocks j: x paired once for all of them
inline void bf16_dense_blocks_forward(const float* x, int N, int C, const Bf16DenseBlock* blocks, int count) {
    Bf16Right rights[kMaxDenseBlocks];
    for (int j = 0; j < count; ++j)
        rights[j] = {blocks[j].W, (size_t)blocks[j].OC, false, blocks[j].OC, blocks[j].y, (size_t)blocks[j].OC, false,
                     blocks[j].b};
    bf16_gemm_rights(x, (size_t)C, false, N, C, rights, count);
}

// reference: cpp/reference/bf16.hpp, bf16_dense_forward
// y = act(z), z[n, o] = b[o] + sum_c bf16(x[n, c]) bf16(W[c, o]) for x (N, C), W (C, OC); y may alias z
// (except for gelu, whose backward needs z)
inline void bf16_dense_forward(float* y, float* z, const float* x, const float* W, const float* b, int N, int C, int OC,
                               Activation act) {
    const Bf16DenseBlock block{W, b, OC, z, nullptr, nullptr, nullptr};
    bf16_dense_blocks_forward(x, N, C, &block, 1);
    if (act == Activation::linear && y == z) return;
    parallel_for((size_t)N, double(N) * OC, [&](size_t lo, size_t hi) {
        activation_forward<float>(y + lo * OC, z + lo * OC, hi - lo, (size_t)OC, act);
    });
}

// dz = dy * act'(z) (activation_backward, y the forward's output), rows split across threads (a linear
// layer's dz is dy itself: the copy of the output projection's 1536 x 8000 gradient ran on one core)
inline void bf16_activation_backward(float* dz, const float* dy, const float* z, const float* y, int N, int OC,
                                     Activation act) {
    parallel_for((size_t)N, double(N) * OC, [&](size_t lo, size_t hi) {
        activation_backward<float>(dz + lo * OC, dy + lo * OC, z + lo * OC, y + lo * OC, hi - lo, (size_t)OC, act);
    });
}

// reference: cpp/reference/bf16.hpp, bf16_dense_backward (each block; dx their sum)
// Backward of bf16_dense_blocks_forward: dx = sum_j bf16(dy_j) . bf16(W_j)^T (overwritten; dx may be null),
// dW_j += bf16(x)^T . bf16(dy_j) (x paired once for all of them), db_j += sum_n dy_j[n, :] (float32, the rows
// in order, as bias_gradient: summed while dy_j is paired for dW_j, not in a pass of its own)
inline void bf16_dense_blocks_backward(float* dx, const float* x, int N, int C, const Bf16DenseBlock* blocks,
                                       int count) {
    for (int j = 0; dx && j < count; ++j)
        bf16_gemm(dx, (size_t)C, blocks[j].dy, (size_t)blocks[j].OC, false, blocks[j].W, (size_t)blocks[j].OC, true, N,
                  C, blocks[j].OC, j > 0);
    Bf16Right rights[kMaxDenseBlocks];
    for (int j = 0; j < count; ++j)
        rights[j] = {blocks[j].dy, (size_t)blocks[j].OC, false, blocks[j].OC, blocks[j].dW, (size_t)blocks[j].OC, true,
                     nullptr, blocks[j].db};
    bf16_gemm_rights(x, (size_t)C, true, C, N, rights, count);
}

// reference: cpp/reference/bf16.hpp, bf16_dense_backward
// dx = bf16(dz) . bf16(W)^T (overwritten; dx may be null), dW += bf16(x)^T . bf16(dz), db += sum_n dz[n, :]
inline void bf16_dense_backward(float* dx, float* dW, float* db, const float* dz, const float* x, const float* W, int N,
                                int C, int OC) {
    const Bf16DenseBlock block{W, nullptr, OC, nullptr, dz, dW, db};
    bf16_dense_blocks_backward(dx, x, N, C, &block, 1);
}

}  // namespace attnx
