// int8 inference (Model.quantize("int8")): products of per-row quantized activations with per-column
// quantized weights, accumulated exactly in int32; everything around the products (scales, biases,
// gate math, the recurrent state) stays float32.
//
//   weights  W (K, N):  sw[n] = max_k |W[k, n]| / 127,  qw[k, n] = round(W[k, n] / sw[n])   (Python, once)
//   inputs   x (R, K):  sx[r] = max_k |x[r, k]| / 127,  qx[r, k] = round(x[r, k] / sx[r])   (here, per call)
//   product  acc[r, n] = sum_k qx[r, k] qw[k, n]              (int32, exact: |acc| <= K 127^2)
//            out[r, n] = acc[r, n] * (sx[r] sw[n]) + bias[n]
//   coarse rows (one large value the output does not use leaves the others at |qx| <= 1): a second pass,
//            e[r, k] = x[r, k] - sx[r] qx[r, k],  se[r] = max_k |e[r, k]| / 127,  qe = round(e / se)
//            out[r, n] += (sum_k qe[r, k] qw[k, n]) * (se[r] sw[n])      (see Int8Activations)
//
// Layout: qw packed once, when the layer's weights are set (Int8Kernel), four k per 32-bit lane,
// whole rows of 16 columns:
//   packed[((k / 4) * Np + n) * 4 + k % 4] = qw[k, n]   (zero past K and N; Np = N rounded up to 16;
//                                                        rows of zeros up to Kt = K rounded up to 64)
// so that one 32-bit broadcast of qx[r, k..k+4) meets 4 k of W (or 8, 16) columns in one vector, and
// 16 quad-rows of 16 columns are an AMX B tile. Products of 16 rows or more (8 where K > 64:
// int8_amx_pays) run on AMX tiles where the CPU has AMX-INT8 (int8_product_amx: tdpbssd, s8 x s8); the others in register
// tiles (R rows x Q vectors of int32 accumulators) on three instruction sets, picked like the
// float kernels (simd_level()):
//   AVX-512 + VNNI  vpdpbusd: acc += u8 . s8 over 4 bytes per lane; the activations enter as
//                   u8 = qx + 128 and 128 * colsum[n] is taken off at the end
//   AVX2            vpsignb / vpabsb / vpmaddubsw / vpmaddwd: |qx| . (sign(qx) qw) in int16 pairs
//                   (|.| <= 2 * 127^2 < 2^15: never saturates), then pairs summed into int32
//   baseline        the same sums in plain integer code
// All four give the same int32 accumulators (the sums are exact); int8_product_reference is the
// plain loop the C++ tests hold them to.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "attnx/activations.hpp"
#include "attnx/amx.hpp"
#include "attnx/packed.hpp"
#include "attnx/parallel.hpp"
#include "attnx/rnn.hpp"

namespace attnx {

constexpr int kInt8Max = 127;
constexpr int kCoarseLanes = 16;  // the lanes of a row's reductions (reduce_16_lanes), at every SIMD level

// Rounded up to a multiple of m
inline int round_up(int n, int m) { return (n + m - 1) / m * m; }

// ----------------------------------------------------------------------------- activations
// q[0, W) = v's W lanes (whole numbers in [-127, 127]) as bytes
typedef int8_t int8x4 __attribute__((vector_size(4)));
typedef int8_t int8x8 __attribute__((vector_size(8)));
typedef int8_t int8x16 __attribute__((vector_size(16)));
ATTNX_ALWAYS_INLINE void store_int8(int8_t* q, float4 v) {
    const int8x4 b = __builtin_convertvector(__builtin_convertvector(v, int4), int8x4);
    std::memcpy(q, &b, sizeof b);
}
ATTNX_ALWAYS_INLINE void store_int8(int8_t* q, float8 v) {  // in SSE2 halves: a direct conversion went lane by lane
    typedef short short8 __attribute__((vector_size(16)));
    const int4 lo = __builtin_ia32_cvttps2dq(__builtin_shufflevector(v, v, 0, 1, 2, 3));
    const int4 hi = __builtin_ia32_cvttps2dq(__builtin_shufflevector(v, v, 4, 5, 6, 7));
    const short8 words = __builtin_ia32_packssdw128(lo, hi);
    const int8x16 b = (int8x16)__builtin_ia32_packsswb128(words, words);
    std::memcpy(q, &b, 8);
}
ATTNX_ALWAYS_INLINE void store_int8(int8_t* q, float16 v) {
    const int8x16 b = __builtin_convertvector(__builtin_convertvector(v, int16), int8x16);
    std::memcpy(q, &b, sizeof b);
}

// reduce_16_lanes' operations, on floats or vectors. Always inlined: a lambda's call left out of line
// (at -O0, the sanitizer build) would take a vector in the baseline's ABI from an AVX-512 caller and
// read garbage
struct LaneMax {
    template <class T> ATTNX_ALWAYS_INLINE T operator()(T a, T b) const { return a > b ? a : b; }
};
struct LaneSum {
    template <class T> ATTNX_ALWAYS_INLINE T operator()(T a, T b) const { return a + b; }
};

// reduce_16_lanes' last steps: four lanes (j + 8 and j + 4 joined), j with j + 2, then j + 1
template <class V, class Op> ATTNX_ALWAYS_INLINE float reduce_16_lanes(const V*, Op op, float4 four) {
    return op(op(four[0], four[2]), op(four[1], four[3]));
}

// The 16 lanes held by L = 16 / W vectors (lane j in parts[j / W]) reduced by op in one fixed tree,
// lane j with j + 8, then j + 4, j + 2 and j + 1, in vector halves: the same float at every SIMD level
template <class V, class Op> ATTNX_ALWAYS_INLINE float reduce_16_lanes(const V* parts, Op op) {
    constexpr int W = Lanes<V>::W;
    static_assert(kCoarseLanes % W == 0, "16 lanes are whole vectors");
    if constexpr (W == 16) {
        const float8 lo = __builtin_shufflevector(parts[0], parts[0], 0, 1, 2, 3, 4, 5, 6, 7);
        const float8 hi = __builtin_shufflevector(parts[0], parts[0], 8, 9, 10, 11, 12, 13, 14, 15);
        const float8 eight = op(lo, hi);
        return reduce_16_lanes<float4>(nullptr, op, op(__builtin_shufflevector(eight, eight, 0, 1, 2, 3),
                                                       __builtin_shufflevector(eight, eight, 4, 5, 6, 7)));
    } else if constexpr (W == 8) {
        const float8 eight = op(parts[0], parts[1]);
        return reduce_16_lanes<float4>(nullptr, op, op(__builtin_shufflevector(eight, eight, 0, 1, 2, 3),
                                                       __builtin_shufflevector(eight, eight, 4, 5, 6, 7)));
    } else if constexpr (W == 4) {
        return reduce_16_lanes<float4>(nullptr, op, op(op(parts[0], parts[2]), op(parts[1], parts[3])));
    } else {
        float a[kCoarseLanes];
        for (int j = 0; j < kCoarseLanes; ++j) a[j] = parts[j];
        for (int half = kCoarseLanes / 2; half >= 1; half /= 2)
            for (int j = 0; j < half; ++j) a[j] = op(a[j], a[j + half]);
        return a[0];
    }
}

// max_k |x[k]| of one row (K values)
template <class V> ATTNX_ALWAYS_INLINE float row_abs_max(const float* x, int K) {
    using I = typename Lanes<V>::I;
    constexpr int W = Lanes<V>::W;
    V m = V{};
    for (int k = 0; k < K; k += W) {
        const V a = (V)((I)vload<V>(x + k, std::min(W, K - k)) & (I{} + 0x7fffffff));  // |x|: the sign bit off
        m = a > m ? a : m;
    }
    if constexpr (W == 1) return m;
    else {
        V parts[kCoarseLanes / W];  // m, and zeros (|x| >= 0) in the other lanes
        for (int l = 0; l < kCoarseLanes / W; ++l) parts[l] = l ? V{} : m;
        return reduce_16_lanes<V>(parts, LaneMax{});
    }
}

// v (already x * 127 / max|x|) rounded half to even, within [-127, 127]. The rounding adds and takes
// off 1.5 * 2^23 (exact for |v| <= 127), after an opaque copy so that no level fuses it with the
// multiply: every level quantizes to the same bytes.
template <class V> ATTNX_ALWAYS_INLINE V round_int8(V v) {
    constexpr int W = Lanes<V>::W;
    if constexpr (W == 16) asm("" : "+v"(v));
    else if constexpr (W > 1) asm("" : "+x"(v));
    const V magic = vbroadcast<V>(12582912.f);
    V rounded = (v + magic) - magic;
    rounded = rounded > vbroadcast<V>(127.f) ? vbroadcast<V>(127.f) : rounded;
    return rounded < vbroadcast<V>(-127.f) ? vbroadcast<V>(-127.f) : rounded;
}

// q[0, n) = the first n lanes of rounded (whole numbers in [-127, 127]) as bytes
template <class V> ATTNX_ALWAYS_INLINE void store_int8_lanes(int8_t* q, V rounded, int n) {
    if constexpr (Lanes<V>::W > 1) {
        if (n == Lanes<V>::W) return store_int8(q, rounded);  // a whole vector's bytes at once (vpmovdb / packs)
    }
    for (int j = 0; j < n; ++j) q[j] = (int8_t)(int)lane(rounded, j);
}

// qx (rows, Kp; zero past K) and sx (rows) of x (rows, K, rows ldx apart), per row:
//   sx[r] = max_k |x[r, k]| / 127,  qx[r, k] = round_half_even(x[r, k] * (127 / max_k |x[r, k]|))
// A zero row has sx = 0 and qx = 0.
template <class V>
ATTNX_ALWAYS_INLINE void quantize_rows_on(int8_t* qx, size_t ldq, float* sx, const float* x, size_t ldx, int rows,
                                          int K, int Kp) {
    constexpr int W = Lanes<V>::W;
    for (int r = 0; r < rows; ++r) {
        const float* xr = x + (size_t)r * ldx;
        const float mx = row_abs_max<V>(xr, K);
        sx[r] = mx / float(kInt8Max);
        const V inv = vbroadcast<V>(mx > 0.f ? float(kInt8Max) / mx : 0.f);
        int8_t* q = qx + (size_t)r * ldq;
        for (int k = 0; k < K; k += W) {
            const int n = std::min(W, K - k);
            store_int8_lanes(q + k, round_int8(vload<V>(xr + k, n) * inv), n);
        }
        std::fill(q + K, q + Kp, int8_t(0));
    }
}

inline void quantize_rows(int8_t* qx, size_t ldq, float* sx, const float* x, size_t ldx, int rows, int K, int Kp) {
    on_widest_lanes<float>([&](auto lanes) __attribute__((always_inline)) {
        quantize_rows_on<decltype(lanes)>(qx, ldq, sx, x, ldx, rows, K, Kp);
    });
}

// ----------------------------------------------------------------------------- coarse rows
// One large value in a row (an outlier feature) makes sx = max|x| / 127 so large that the row's other
// values round to 0 or +-1. When the output does not use that feature, the product loses what it
// does use: per-row symmetric int8 alone has no bound relative to the output then. A row is coarse
// when its rounding error, weighted by how much each feature can reach the output (kw[k] =
// max_n |qw[k, n]|), exceeds 1/16 of its weighted magnitude:
//   sum_k |e[k]| kw[k] > sum_k |x[k]| kw[k] / 16,    e = x - sx qx   (|e| <= sx / 2)
// Such a row is quantized a second time, its residual e: its values are then within se / 2 =
// max|e| / 254 <= max|x| / 64516 of x. Ordinary rows (normal, Laplace, sparse or saturated values, an
// outlier the output uses) have a weighted error near 1% and take one pass.
constexpr float kCoarseRatio = 16.f;

// kw[k] = max_n |qw[k, n]| of qw (K, N; rows ldw apart): how much feature k can reach the output
inline void int8_feature_weights(float* kw, const int8_t* qw, size_t ldw, int K, int N) {
    for (int k = 0; k < K; ++k) {
        int m = 0;
        for (int n = 0; n < N; ++n) m = std::max(m, std::abs((int)qw[(size_t)k * ldw + n]));
        kw[k] = (float)m;
    }
}

// One row x (K values) quantized to q (zero from K to Kp), its scale returned in s, and whether it is
// coarse for features weighing kw (by its residual e = x - s q, not stored: a coarse row's second
// pass, Int8Activations::quantize_on, recomputes it), in one pass after the max. The
// coarse sums run in 16 fixed lanes (feature k in lane k % 16, each lane in order, the lanes added in
// reduce_16_lanes' tree): the same decision at every SIMD level, whose vectors (16, 2 x 8 or 4 x 4
// lanes) hold those lanes.
template <class V>
ATTNX_ALWAYS_INLINE bool quantize_row_coarse(int8_t* __restrict q, float& s, const float* __restrict x,
                                             const float* __restrict kw, int K, int Kp) {
    using I = typename Lanes<V>::I;
    constexpr int W = Lanes<V>::W, L = kCoarseLanes / W;
    static_assert(kCoarseLanes % W == 0, "the coarse lanes are whole vectors");
    const float mx = row_abs_max<V>(x, K);
    s = mx / float(kInt8Max);
    const V inv = vbroadcast<V>(mx > 0.f ? float(kInt8Max) / mx : 0.f), sv = vbroadcast<V>(s);
    const I abs_mask = I{} + 0x7fffffff;
    V error[L] = {}, magnitude[L] = {};
    for (int k = 0, l = 0; k < K; k += W, l = (l + 1) % L) {
        const int n = std::min(W, K - k);
        const V xv = vload<V>(x + k, n), w = vload<V>(kw + k, n);  // zero past K: adds nothing to the sums
        const V rounded = round_int8(xv * inv);
        store_int8_lanes(q + k, rounded, n);
        const V ev = xv - sv * rounded;
        error[l] += (V)((I)ev & abs_mask) * w;
        magnitude[l] += (V)((I)xv & abs_mask) * w;
    }
    std::fill(q + K, q + Kp, int8_t(0));
    return reduce_16_lanes<V>(error, LaneSum{}) * kCoarseRatio > reduce_16_lanes<V>(magnitude, LaneSum{});
}

// ----------------------------------------------------------------------------- packed weights
// qw (K, N; rows ldw apart) packed as the layout above, with colsum[n] = sum_k qw[k, n] and the
// feature weights
struct Int8Packed {
    std::vector<int8_t, CacheLineAllocator<int8_t>> data;
    std::vector<int32_t> colsum;
    std::vector<float> feature_weight;  // int8_feature_weights: what decides a coarse input row
    int K = 0, N = 0, Kp = 0, Np = 0;
    int Kt = 0;  // K rounded up to 64 (an AMX tile's depth): data holds zeros from Kp to Kt, which the tiles read
};

inline void pack_int8(Int8Packed& p, const int8_t* qw, size_t ldw, int K, int N) {
    p.K = K, p.N = N, p.Kp = round_up(K, 4), p.Np = round_up(N, 16), p.Kt = round_up(K, 64);
    p.data.assign((size_t)p.Kt * p.Np, int8_t(0));
    p.colsum.assign((size_t)p.Np, 0);
    for (int k = 0; k < K; ++k)
        for (int n = 0; n < N; ++n) {
            const int8_t w = qw[(size_t)k * ldw + n];
            p.data[((size_t)(k / 4) * p.Np + n) * 4 + k % 4] = w;
            p.colsum[n] += w;
        }
    p.feature_weight.resize(K);
    int8_feature_weights(p.feature_weight.data(), qw, ldw, K, N);
}

// A quantized kernel qw (K, N) with its per-column scale sw (N), packed once (when the layer's weights
// are set: the bindings' pack_int8, cached by attnx.quantization) and read by every call. `head` holds
// the columns [0, split), `tail` the columns [split, N) (a classic GRU's candidate columns, multiplied
// by r * h_{t-1} after the other gates); split = N leaves `tail` empty.
struct Int8Kernel {
    Int8Packed head, tail;
    std::vector<float> scale;
    int K = 0, N = 0, split = 0;
};

inline void pack_int8_kernel(Int8Kernel& w, const int8_t* qw, const float* sw, int K, int N, int split) {
    w.K = K, w.N = N, w.split = split;
    w.scale.assign(sw, sw + N);
    pack_int8(w.head, qw, (size_t)N, K, split);
    if (split < N) pack_int8(w.tail, qw + split, (size_t)N, K, N - split);
}

// ----------------------------------------------------------------------------- tiles
typedef char char16 __attribute__((vector_size(16)));
typedef char char32 __attribute__((vector_size(32)));
typedef short short16 __attribute__((vector_size(32)));

// One instruction set's int8 multiply-add: lanes W of int32 (4 bytes of k each), R rows per tile.
// prepare(a4) turns qx[r, k..k+4) (as one int32) into what madd multiplies; finish corrects the
// accumulators of columns from `colsum` on.
struct Int8Baseline {
    using V = int4;
    static constexpr int W = 4, R = 2;
    struct A { int8_t b[4]; };
    ATTNX_ALWAYS_INLINE static A prepare(int32_t a4) { A a; std::memcpy(a.b, &a4, 4); return a; }
    ATTNX_ALWAYS_INLINE static V madd(V acc, const A& a, V w) {
        int8_t wb[16];
        std::memcpy(wb, &w, 16);
        for (int j = 0; j < 4; ++j)
            for (int i = 0; i < 4; ++i) acc[j] += (int32_t)a.b[i] * wb[4 * j + i];
        return acc;
    }
    ATTNX_ALWAYS_INLINE static V finish(V acc, const int32_t*) { return acc; }
};

#define ATTNX_INT8_AVX2 __attribute__((target("avx2,fma")))
#define ATTNX_INT8_VNNI __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx512vnni,avx2,fma")))

struct Int8Avx2 {
    using V = int8;  // eight int32
    static constexpr int W = 8, R = 2;
    struct A { char32 abs, sign; };
    ATTNX_ALWAYS_INLINE static A prepare(int32_t a4) {
        // one vpbroadcastd (a vector listing a4 eight times compiles to eight masked inserts, and
        // made the tiles several times slower than the instructions' rate)
        typedef int int4v __attribute__((vector_size(16)));
        const V b = (V)__builtin_ia32_pbroadcastd256(int4v{a4, 0, 0, 0});
        return {__builtin_ia32_pabsb256((char32)b), (char32)b};
    }
    // |a| . (sign(a) w): u8 x s8 in int16 pairs, then the pairs of those into int32
    ATTNX_ALWAYS_INLINE static V madd(V acc, const A& a, V w) {
        const short16 pairs = __builtin_ia32_pmaddubsw256(a.abs, __builtin_ia32_psignb256((char32)w, a.sign));
        const short16 ones = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
        return acc + (V)__builtin_ia32_pmaddwd256(pairs, ones);
    }
    ATTNX_ALWAYS_INLINE static V finish(V acc, const int32_t*) { return acc; }
};

struct Int8Vnni {
    using V = int16;  // sixteen int32
    static constexpr int W = 16, R = 4;
    using A = V;
    // qx + 128 as u8 (flipping the sign bit)
    ATTNX_ALWAYS_INLINE static A prepare(int32_t a4) {
        return (V)__builtin_ia32_pbroadcastd512_gpr_mask(a4 ^ (int32_t)0x80808080u, V{}, 0xFFFF);  // as Int8Avx2's
    }
    ATTNX_ALWAYS_INLINE static V madd(V acc, const A& a, V w) { return (V)__builtin_ia32_vpdpbusd_v16si(acc, a, w); }
    // sum (qx + 128) qw - 128 colsum
    ATTNX_ALWAYS_INLINE static V finish(V acc, const int32_t* colsum) {
        V c;
        std::memcpy(&c, colsum, sizeof c);
        return acc - (c << 7);
    }
};

// acc[r, n .. n + Q W) for R rows of qx (rows lda apart): Kb blocks of 4 k
template <class Ops, int R, int Q>
ATTNX_ALWAYS_INLINE void int8_tile(int32_t* acc, size_t ldc, const int8_t* qx, size_t lda, const Int8Packed& B,
                                   int n) {
    using V = typename Ops::V;
    constexpr int W = Ops::W;
    V s[R][Q] = {};
    const int Kb = B.Kp / 4;
    const int8_t* w0 = B.data.data() + (size_t)n * 4;
    for (int kb = 0; kb < Kb; ++kb) {
        V w[Q];
        // whole aligned vectors (Np a multiple of 16, the data cache-line aligned); a memcpy of 32 bytes
        // compiled to a copy through the stack on the AVX2 level
        typedef V VAlias __attribute__((may_alias));
        for (int q = 0; q < Q; ++q) w[q] = *(const VAlias*)(w0 + ((size_t)kb * B.Np + (size_t)q * W) * 4);
        for (int r = 0; r < R; ++r) {
            int32_t a4;
            std::memcpy(&a4, qx + (size_t)r * lda + (size_t)kb * 4, 4);
            const auto a = Ops::prepare(a4);
            for (int q = 0; q < Q; ++q) s[r][q] = Ops::madd(s[r][q], a, w[q]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int q = 0; q < Q; ++q) {
            const V v = Ops::finish(s[r][q], B.colsum.data() + n + q * W);
            std::memcpy(acc + (size_t)r * ldc + n + q * W, &v, sizeof(V));
        }
}

// acc[r, n] = sum_k qx[r, k] qw[k, n] for `rows` rows of qx (B.Kp values, rows lda apart) and the
// columns [n0, n1) of B (n0 a multiple of 16), written in whole vectors: acc's rows (ldc apart) must
// hold B.Np columns
template <class Ops>
ATTNX_ALWAYS_INLINE void int8_product_on(int32_t* acc, size_t ldc, const int8_t* qx, size_t lda, int rows,
                                         const Int8Packed& B, int n0, int n1) {
    // up to Qmax vectors of columns per tile (VNNI: 4 x 5 accumulators, 5 weight vectors and the broadcast
    // in 32 registers), the column groups as even as the vectors allow: an LSTM(100)'s 25 vectors run
    // as 5 tiles of 5, not 6 of 4 and one of a single vector (a quarter of the multiply-adds per row read)
    constexpr int W = Ops::W, R = Ops::R, Qmax = W == 16 ? 5 : 4;
    const int whole = rows - rows % R;
    auto run = [&](auto q_count, int n) __attribute__((always_inline)) {
        constexpr int Q = decltype(q_count)::value;
        for (int r = 0; r < whole; r += R)
            int8_tile<Ops, R, Q>(acc + (size_t)r * ldc, ldc, qx + (size_t)r * lda, lda, B, n);
    };
    const int vectors = (n1 - n0 + W - 1) / W, groups = (vectors + Qmax - 1) / Qmax;
    const int per_group = groups ? (vectors + groups - 1) / groups : 0;
    for (int n = n0; n < n1 && whole; n += per_group * W) {
        switch (std::min(per_group, (n1 - n + W - 1) / W)) {
            case 1: run(std::integral_constant<int, 1>{}, n); break;
            case 2: run(std::integral_constant<int, 2>{}, n); break;
            case 3: run(std::integral_constant<int, 3>{}, n); break;
            case 4: run(std::integral_constant<int, 4>{}, n); break;
            default: if constexpr (Qmax >= 5) run(std::integral_constant<int, Qmax>{}, n); break;
        }
    }
    // the rows left (a decoding step's single row) in tiles of twice the vectors where the registers
    // allow (VNNI): eight chains of vpdpbusd hide its latency, and each weight row is read in longer runs
    constexpr int Q1 = W == 16 ? 8 : 4;
    auto run_one = [&](auto q_count, int n) __attribute__((always_inline)) {
        constexpr int Q = decltype(q_count)::value;
        for (int r = whole; r < rows; ++r)
            int8_tile<Ops, 1, Q>(acc + (size_t)r * ldc, ldc, qx + (size_t)r * lda, lda, B, n);
    };
    for (int n = n0; n < n1 && whole < rows; n += Q1 * W) {
        switch (std::min(Q1, (n1 - n + W - 1) / W)) {
            case 1: run_one(std::integral_constant<int, 1>{}, n); break;
            case 2: run_one(std::integral_constant<int, 2>{}, n); break;
            case 3: run_one(std::integral_constant<int, 3>{}, n); break;
            case 4: run_one(std::integral_constant<int, 4>{}, n); break;
            case 5: if constexpr (Q1 >= 5) run_one(std::integral_constant<int, 5>{}, n); break;
            case 6: if constexpr (Q1 >= 6) run_one(std::integral_constant<int, 6>{}, n); break;
            case 7: if constexpr (Q1 >= 7) run_one(std::integral_constant<int, 7>{}, n); break;
            default: run_one(std::integral_constant<int, Q1>{}, n); break;
        }
    }
}

// ----------------------------------------------------------------------------- AMX tiles
// Where the CPU has AMX-INT8 (amx_int8_active()), tdpbssd multiplies whole tiles, s8 x s8 into int32:
//   C (16 rows x 16 columns, int32) += A (16 rows x 64 k of qx) . B (16 quad-rows of k x 16 columns)
// B's bytes are packed's own: quad-row kb of columns [n, n + 16) is 64 contiguous bytes at
// data + (kb Np + n) 4, so a B tile is 16 of those, Np 4 bytes apart (zero past Kp up to Kt, where
// pack_int8 pads). Both operands signed: no +128 and no column-sum correction (VNNI's u8 . s8 needs
// them). One tdpbssd is 16 x 16 x 64 multiply-adds, ~16 times vpdpbusd's 16 x 4 x 4 per cycle pair.
// The C tiles run 2 x 2 (32 rows x 32 columns, A and B tiles each read twice): 4 C, 2 A and 2 B of
// the 8 tiles. The sums are exact, so the accumulators equal every other level's bit for bit.
#define ATTNX_INT8_AMX \
    __attribute__((target("amx-tile,amx-int8,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni,avx2,fma")))

// Whether int8_product takes the tiles for `rows` rows of B: a tile is 16 rows whatever the rows used,
// and it has fixed costs VNNI's register tiles do not (the tile configuration, ~0.1 us a product;
// copying qx into 64-byte rows; storing C). VNNI's time over AMX's for one product on one thread
// (> 1: AMX faster; Sapphire Rapids class, benchmarks/int8_product_time.cpp):
//   K=32  N=400:  8 rows 0.71x, 12 rows 0.83x, 16 rows 1.28x
//   K=64  N=128:  8 rows 0.96x, 12 rows 1.31x, 16 rows 2.5x
//   K=100 N=400:  4 rows 0.72x, 8 rows 1.29x, 16 rows 1.5x
//   K=512 N=128:  4 rows 0.98x, 8 rows 1.85x, 16 rows 3.4x
// so: from 16 rows, and from 8 where K is past one 64-deep k block
constexpr int kAmxInt8MinRows = 16, kAmxInt8MinRowsDeep = 8;
inline bool int8_amx_pays(int rows, const Int8Packed& B) {
    return rows >= kAmxInt8MinRows || (rows >= kAmxInt8MinRowsDeep && B.Kt > 64);
}

// C tile (i, j) of a 2 x 2 block: tile 2 i + j; A tiles 4 and 5 (row blocks), B tiles 6 and 7 (column
// blocks). The tile numbers are the instructions' immediates, hence the constexpr dispatch.
// acc rows [0, 16 MR) (valid of them real; ldc apart) and columns [0, 16 NR) of a . b: `a` 16 MR rows
// of kblocks 64-byte k blocks (lda bytes apart), `b` the packed quad-rows (ldb bytes apart)
template <int MR, int NR>
ATTNX_INT8_AMX ATTNX_ALWAYS_INLINE void int8_amx_block(int32_t* acc, size_t ldc, int valid, const int8_t* a,
                                                       size_t lda, const int8_t* b, size_t ldb, int kblocks,
                                                       int32_t* spill) {
    ATTNX_AMX_MEMORY_BARRIER();  // the panel's bytes (just copied) and B are in memory before the tile loads
    _tile_zero(0);
    if constexpr (NR == 2) _tile_zero(1);
    if constexpr (MR == 2) _tile_zero(2);
    if constexpr (MR == 2 && NR == 2) _tile_zero(3);
    for (int kb = 0; kb < kblocks; ++kb) {
        const int8_t* ak = a + (size_t)kb * 64;
        const int8_t* bk = b + (size_t)kb * 16 * ldb;  // 16 quad-rows = 64 k
        _tile_loadd(4, ak, lda);
        _tile_loadd(6, bk, ldb);
        _tile_dpbssd(0, 4, 6);
        if constexpr (NR == 2) {
            _tile_loadd(7, bk + 64, ldb);  // the next 16 columns: 16 x 4 bytes on
            _tile_dpbssd(1, 4, 7);
        }
        if constexpr (MR == 2) {
            _tile_loadd(5, ak + 16 * lda, lda);
            _tile_dpbssd(2, 5, 6);
            if constexpr (NR == 2) _tile_dpbssd(3, 5, 7);
        }
    }
    // a whole row block straight into acc; a partial one (the rows past `valid` are padding) through
    // spill. (A macro: the tile intrinsics paste their tile number into the instruction's text. gcc 12's
    // tile intrinsics are asm without a memory clobber: amx.hpp's barrier after each store.)
    const size_t ldc_bytes = ldc * sizeof(int32_t);
#define ATTNX_AMX_STORE_C(t, i, j)                                                                 \
    do {                                                                                           \
        int32_t* c = acc + (size_t)16 * (i) * ldc + 16 * (j);                                      \
        const int rows = std::min(16, valid - 16 * (i));                                           \
        if (rows == 16) {                                                                          \
            _tile_stored(t, c, ldc_bytes);                                                         \
            ATTNX_AMX_MEMORY_BARRIER(); /* the caller reads acc after the call */                  \
        } else {                                                                                   \
            _tile_stored(t, spill, 64);                                                            \
            ATTNX_AMX_MEMORY_BARRIER(); /* spill holds the tile before it is read */               \
            for (int r = 0; r < rows; ++r) std::memcpy(c + (size_t)r * ldc, spill + 16 * r, 64);   \
        }                                                                                          \
    } while (0)
    ATTNX_AMX_STORE_C(0, 0, 0);
    if constexpr (NR == 2) ATTNX_AMX_STORE_C(1, 0, 1);
    if constexpr (MR == 2) ATTNX_AMX_STORE_C(2, 1, 0);
    if constexpr (MR == 2 && NR == 2) ATTNX_AMX_STORE_C(3, 1, 1);
#undef ATTNX_AMX_STORE_C
}

// int8_product on the tiles (same contract): panels of 32 rows, each across the columns [n0, n1) in
// blocks of 32. qx's rows are read in place when they are whole 64-byte k blocks (Kp = Kt) and the
// panel whole 16-row tiles; otherwise the panel is copied into 64-byte rows, zero past Kp and past
// the last row (a tile reads 16 rows of 64 bytes whatever the shape).
ATTNX_INT8_AMX inline void int8_product_amx(int32_t* acc, size_t ldc, const int8_t* qx, size_t lda, int rows,
                                            const Int8Packed& B, int n0, int n1) {
    constexpr int kPanel = 32;
    const int Kp = B.Kp, Kt = B.Kt, kblocks = Kt / 64;
    const size_t ldb = (size_t)B.Np * 4;
    thread_local std::vector<int8_t, CacheLineAllocator<int8_t>> panel;
    alignas(64) int32_t spill[16 * 16];
    AmxTileScope tiles;  // this thread's tiles, configured for this product and released after it
    for (int r = 0; r < rows; r += kPanel) {
        const int m = std::min(kPanel, rows - r);
        const int8_t* a = qx + (size_t)r * lda;
        size_t ld = lda;
        if (Kp != Kt || m % 16) {
            const int padded = round_up(m, 16);
            if (panel.size() < (size_t)kPanel * Kt) panel.resize((size_t)kPanel * Kt);
            for (int i = 0; i < padded; ++i) {
                int8_t* p = panel.data() + (size_t)i * Kt;
                if (i < m) std::memcpy(p, a + (size_t)i * lda, Kp);
                std::memset(p + (i < m ? Kp : 0), 0, Kt - (i < m ? Kp : 0));
            }
            a = panel.data(), ld = (size_t)Kt;
        }
        int32_t* c = acc + (size_t)r * ldc;
        for (int n = n0; n < n1; n += 32) {
            const int8_t* b = B.data.data() + (size_t)n * 4;
            const bool wide = n1 - n > 16;
            if (m > 16) {
                if (wide) int8_amx_block<2, 2>(c + n, ldc, m, a, ld, b, ldb, kblocks, spill);
                else int8_amx_block<2, 1>(c + n, ldc, m, a, ld, b, ldb, kblocks, spill);
            } else {
                if (wide) int8_amx_block<1, 2>(c + n, ldc, m, a, ld, b, ldb, kblocks, spill);
                else int8_amx_block<1, 1>(c + n, ldc, m, a, ld, b, ldb, kblocks, spill);
            }
        }
    }
}

// Whether this CPU has vpdpbusd on 512 bits (read once; the AVX-512 level needs it too)
inline bool cpu_has_vnni() {
    static const bool has = __builtin_cpu_supports("avx512vnni");
    return has;
}

// The int8 instruction set the products run on at the current level: "amx" (products of enough
// rows, int8_amx_pays; fewer: VNNI's), "vnni", "avx2" or "baseline" (an AVX-512 CPU without
// VNNI runs the AVX2 tiles)
inline const char* int8_level_name() {
    const SimdLevel level = simd_level();
    if (amx_int8_active()) return "amx";  // products of enough rows (int8_amx_pays); fewer run the VNNI tiles
    return level == SimdLevel::avx512 && cpu_has_vnni() ? "vnni" : level >= SimdLevel::avx2 ? "avx2" : "baseline";
}

template <class Body> ATTNX_INT8_VNNI void on_vnni(Body& body) { body(Int8Vnni{}); }
template <class Body> ATTNX_INT8_AVX2 void on_avx2_int8(Body& body) { body(Int8Avx2{}); }

template <class Body> void on_int8_level(Body&& body) {
    const SimdLevel level = simd_level();
    if (level == SimdLevel::avx512 && cpu_has_vnni()) on_vnni(body);
    else if (level >= SimdLevel::avx2) on_avx2_int8(body);
    else body(Int8Baseline{});
}

inline void int8_product(int32_t* acc, size_t ldc, const int8_t* qx, size_t lda, int rows, const Int8Packed& B, int n0,
                         int n1) {
    if (n0 < n1 && int8_amx_pays(rows, B) && amx_int8_active())
        return int8_product_amx(acc, ldc, qx, lda, rows, B, n0, n1);
    on_int8_level([&](auto ops) __attribute__((always_inline)) {
        int8_product_on<decltype(ops)>(acc, ldc, qx, lda, rows, B, n0, n1);
    });
}

// The plain loop the tiles must equal: acc[r, n] = sum_k qx[r, k] qw[k, n], qw (K, N) unpacked
inline void int8_product_reference(int32_t* acc, size_t ldc, const int8_t* qx, size_t lda, int rows, const int8_t* qw,
                                   int K, int N) {
    for (int r = 0; r < rows; ++r)
        for (int n = 0; n < N; ++n) {
            int32_t s = 0;
            for (int k = 0; k < K; ++k) s += (int32_t)qx[(size_t)r * lda + k] * qw[(size_t)k * N + n];
            acc[(size_t)r * ldc + n] = s;
        }
}

// n <= W int32 values (lanes past n zero) as floats: the int32 bits loaded as one vector, then converted
template <class V> ATTNX_ALWAYS_INLINE V int32_lanes(const int32_t* p, int n) {
    if constexpr (Lanes<V>::W == 1) return (float)*p;
    else return __builtin_convertvector((typename Lanes<V>::I)vload<V>(reinterpret_cast<const float*>(p), n), V);
}

// ----------------------------------------------------------------------------- activations, both passes
// Up to `rows` activation rows of K values in int8: q, s (every row), and the coarse rows' second pass
// (which, qe, se, acc2 for its products; e a row's residual). Buffers reused by every call.
struct Int8Activations {
    Panels<int8_t> q, qe;  // on cache lines: AMX reads their rows in place, and a tile row across two lines loads slower
    std::vector<float> s, se, e;
    std::vector<int> which, coarse_of;  // coarse_of[r]: row r's index i in the second pass, or -1
    std::vector<int32_t> acc2;
    int rows = 0, K = 0, Kp = 0, Np = 0, coarse = 0;

    // the second pass's buffers are sized when a coarse row first comes
    void resize(int rows_, int K_, int Kp_, int Np_) {
        rows = rows_, K = K_, Kp = Kp_, Np = Np_;
        q.resize((size_t)rows * Kp), s.resize(rows), which.resize(rows), coarse_of.resize(rows), e.resize(K);
    }

    // n rows (<= rows) of x, ldx apart, for a product with weights whose features weigh kw (K): one
    // pass, then the coarse rows' second (compacted: coarse row i is row which[i], its residual
    // quantized in qe row i, se[i])
    template <class V>
    ATTNX_ALWAYS_INLINE void quantize_on(const float* x, size_t ldx, int n, const float* kw) {
        coarse = 0;
        for (int r = 0; r < n; ++r) {
            coarse_of[r] = -1;
            const float* xr = x + (size_t)r * ldx;
            int8_t* qr = q.data() + (size_t)r * Kp;
            if (!quantize_row_coarse<V>(qr, s[r], xr, kw, K, Kp)) continue;
            for (int k = 0; k < K; ++k) e[k] = xr[k] - s[r] * (float)qr[k];  // the same floats as the coarse sums'
            if (qe.size() < (size_t)rows * Kp || acc2.size() < (size_t)rows * Np)  // sized for the largest use
                qe.resize((size_t)rows * Kp), se.resize(rows), acc2.resize((size_t)rows * Np);
            quantize_rows_on<V>(qe.data() + (size_t)coarse * Kp, (size_t)Kp, se.data() + coarse, e.data(), (size_t)K,
                                1, K, Kp);
            coarse_of[r] = coarse, which[coarse++] = r;
        }
    }

    // acc (n rows, ldc apart) = q . B over the columns [n0, n1) (n0 a multiple of 16); the coarse rows'
    // residual products into acc2 (rows B.Np apart). Disjoint column ranges may run on several threads.
    void product(int32_t* acc, size_t ldc, int n, const Int8Packed& B, int n0, int n1) {
        int8_product(acc, ldc, q.data(), (size_t)Kp, n, B, n0, n1);
        if (coarse) int8_product(acc2.data(), (size_t)B.Np, qe.data(), (size_t)Kp, coarse, B, n0, n1);
    }

    // dequantize's value of row r, columns [j, j + m) (m <= W), as one vector that no buffer holds:
    //   acc[r, j] (s[r] sw[j]) + bias[j] (bias may be null), + acc2[i, j] (se[i] sw[j]) for a coarse row
    // (i = coarse_of[r]; acc2's rows ld_acc2 apart). The recurrent steps' epilogue reads the sums here,
    // in the cell's loop, instead of a dequantized buffer written and read back every step.
    template <class V>
    ATTNX_ALWAYS_INLINE V dequantized(const int32_t* acc, size_t ldc, int r, const float* sw, const float* bias, int j,
                                      int m, size_t ld_acc2) const {
        const V w = vload<V>(sw + j, m);
        V v = int32_lanes<V>(acc + (size_t)r * ldc + j, m) * (vbroadcast<V>(s[r]) * w);
        if (bias) v += vload<V>(bias + j, m);
        if (const int i = coarse_of[r]; i >= 0)
            v += int32_lanes<V>(acc2.data() + (size_t)i * ld_acc2 + j, m) * (vbroadcast<V>(se[i]) * w);
        return v;
    }

    // out[r, j - first] (n rows, ldo apart; n0 <= j < n1) = acc[r, j] (sx[r] sw[j]) + bias[j] (bias may be
    // null), then += acc2[i, j] (se[i] sw[j]) for the coarse row r = which[i]; `first`: the column that
    // out's first holds (0: out holds every column from 0; n0: a block of columns apart). `relu`: then
    // out = relu(out) (activation_forward's), on each row while it is in L1
    // (plain loops, inlined so that they vectorize at the caller's level)
    ATTNX_ALWAYS_INLINE void dequantize(float* out, size_t ldo, const int32_t* acc, size_t ldc, int n, const float* sw,
                                        const float* bias, int n0, int n1, size_t ld_acc2, int first = 0,
                                        bool relu = false) const {
        auto rectify = [&](float* o) __attribute__((always_inline)) {
            for (int j = n0; j < n1; ++j) o[j - first] = o[j - first] < 0.f ? 0.f : o[j - first];  // NaN stays NaN
        };
        for (int r = 0; r < n; ++r) {
            float* o = out + (size_t)r * ldo;
            const int32_t* a = acc + (size_t)r * ldc;
            const float sr = s[r];
            if (bias)
                for (int j = n0; j < n1; ++j) o[j - first] = (float)a[j] * (sr * sw[j]) + bias[j];
            else
                for (int j = n0; j < n1; ++j) o[j - first] = (float)a[j] * (sr * sw[j]);
            if (relu && coarse_of[r] < 0) rectify(o);  // a coarse row's after its second pass
        }
        for (int i = 0; i < coarse; ++i) {
            float* o = out + (size_t)which[i] * ldo;
            const int32_t* a = acc2.data() + (size_t)i * ld_acc2;
            const float si = se[i];
            for (int j = n0; j < n1; ++j) o[j - first] += (float)a[j] * (si * sw[j]);
            if (relu) rectify(o);
        }
    }
};

// ----------------------------------------------------------------------------- Dense
// What one thread's int8 Dense rows reuse from call to call (thread_local: an int32 block of 64 rows
// by 512 columns is past malloc's mmap threshold, and a fresh one faulted its pages in on every call):
// the quantized rows, their int32 sums, and the feed-forward's hidden rows
struct Int8Scratch {
    Int8Activations rows;
    std::vector<int32_t> acc;
    std::vector<float> hidden;
};
inline Int8Scratch& int8_scratch() {
    thread_local Int8Scratch scratch;
    return scratch;
}

constexpr int kInt8Chunk = 64;  // rows quantized, multiplied and dequantized together (in L2 between the steps)

// The int8 Dense's output split by columns: block i, the kernel's columns [ends[i - 1], ends[i])
// (ends[-1] = 0, the last end N), into its own array out[i] (rows of its width): a self-attention's
// query, key and value from one product, each contiguous
struct Int8ColumnBlocks {
    static constexpr int kMax = 4;
    float* out[kMax] = {};
    int ends[kMax] = {};
    int count = 0;
};

// The output of a kernel of N columns as one block into out
inline Int8ColumnBlocks one_block(float* out, int N) {
    Int8ColumnBlocks blocks;
    blocks.out[0] = out, blocks.ends[0] = N, blocks.count = 1;
    return blocks;
}

// Rows [r0, r0 + n) (n <= kInt8Chunk) of act(x W + bias), x's rows from x (K values each), on this
// thread: quantized, multiplied by W (w.head) and written to the blocks' rows r0..; bias may be null
inline void dense_rows_int8(const Int8ColumnBlocks& blocks, size_t r0, const float* x, int n, const Int8Kernel& w,
                            const float* bias, Activation activation, Int8Scratch& scratch) {
    const Int8Packed& B = w.head;
    const int K = B.K, N = B.N;
    Int8Activations& xq = scratch.rows;
    xq.resize(kInt8Chunk, K, B.Kp, B.Np);
    scratch.acc.resize((size_t)kInt8Chunk * B.Np);
    on_widest_lanes<float>([&](auto lanes) __attribute__((always_inline)) {
        xq.quantize_on<decltype(lanes)>(x, (size_t)K, n, B.feature_weight.data());
    });
    xq.product(scratch.acc.data(), (size_t)B.Np, n, B, 0, N);
    for (int i = 0, n0 = 0; i < blocks.count; n0 = blocks.ends[i++]) {
        const int width = blocks.ends[i] - n0;
        float* out = blocks.out[i] + r0 * width;
        const bool relu = activation == Activation::relu;  // in the epilogue, each row still in L1
        on_widest_lanes<float>([&](auto) __attribute__((always_inline)) {
            xq.dequantize(out, (size_t)width, scratch.acc.data(), (size_t)B.Np, n, w.scale.data(), bias, n0,
                          blocks.ends[i], (size_t)B.Np, n0, relu);
        });
        if (!relu) activation_forward<float>(out, out, (size_t)n, (size_t)width, activation);
    }
}

// act(x (rows, K) W + bias) with W quantized and packed (w: columns [0, N) in w.head) into the column
// blocks (their ends ascending to N); bias may be null. Rows split across the thread budget.
inline void dense_forward_int8(const Int8ColumnBlocks& blocks, const float* x, int rows, const Int8Kernel& w,
                               const float* bias, Activation activation) {
    const int K = w.head.K, N = w.head.N;
    parallel_for((size_t)rows, (double)rows * K * N / 4, [&](size_t r0, size_t r1) {
        Int8Scratch& scratch = int8_scratch();
        for (size_t c0 = r0; c0 < r1; c0 += kInt8Chunk)
            dense_rows_int8(blocks, c0, x + c0 * K, (int)std::min<size_t>(kInt8Chunk, r1 - c0), w, bias, activation,
                            scratch);
    });
}

// out (rows, N) = act(x (rows, K) W + bias), as one block
inline void dense_forward_int8(float* out, const float* x, int rows, const Int8Kernel& w, const float* bias,
                               Activation activation) {
    dense_forward_int8(one_block(out, w.head.N), x, rows, w, bias, activation);
}

// The feed-forward network on int8 kernels, chunk by chunk of rows (the hidden rows never leave the
// thread's cache): y (rows, N2) = act(x (rows, K) W1 + b1) W2 + b2; each product is dense_rows_int8's,
// so y equals two dense_forward_int8 calls. Biases may be null.
inline void feed_forward_forward_int8(float* y, const float* x, int rows, const Int8Kernel& w1, const float* b1,
                                      Activation activation, const Int8Kernel& w2, const float* b2) {
    const int K = w1.head.K, F = w1.head.N, N = w2.head.N;
    parallel_for((size_t)rows, (double)rows * F * (K + N) / 4, [&](size_t r0, size_t r1) {
        Int8Scratch& scratch = int8_scratch();
        scratch.hidden.resize((size_t)kInt8Chunk * F);
        const Int8ColumnBlocks hidden = one_block(scratch.hidden.data(), F), out = one_block(y, N);
        for (size_t c0 = r0; c0 < r1; c0 += kInt8Chunk) {
            const int n = (int)std::min<size_t>(kInt8Chunk, r1 - c0);
            dense_rows_int8(hidden, 0, x + c0 * K, n, w1, b1, activation, scratch);
            dense_rows_int8(out, c0, scratch.hidden.data(), n, w2, b2, Activation::linear, scratch);
        }
    });
}

// ----------------------------------------------------------------------------- Embedding
// out[i, :] = q[ids[i], :] * scale[ids[i]] (table quantized per row)
inline void embedding_forward_int8(float* out, const int64_t* ids, size_t count, const int8_t* q, const float* scale,
                                   int D) {
    for (size_t i = 0; i < count; ++i) {
        const int8_t* row = q + (size_t)ids[i] * D;
        const float s = scale[ids[i]];
        for (int j = 0; j < D; ++j) out[i * D + j] = (float)row[j] * s;
    }
}

// ----------------------------------------------------------------------------- recurrent layers
// One level of SimpleRNN / GRU / LSTM (cfg as rnn_forward's) on quantized kernels, per step t:
//   ax = Q(x_t) qW,  ah = Q(h_{t-1}) qU                          two int32 products of the step's rows
//   pre = (ax sx sW + b_in) + (ah sh sU [+ b_rec])               (Q: Int8Activations, its coarse rows' second
//                                                                 pass included: dequantized)
// then the float gate math of rnn.hpp's cells (equations below), the scales and biases applied in the
// cell's loop, straight from the int32 sums. The input's product runs per step too (its rows do not
// wait for h): one product of all B T rows up front wrote a (B, T, G) float buffer, 1.6 MB at
// LSTM(100) B=32 T=32, that the steps read back from L3, and its dequantizing pass alone cost as much
// as the steps' recurrent products (int8_lstm_cpu_time.cpp); a step's sums (rows x G int32) stay in L2.
// y (B, T, H) may be null; h, c (B, H) hold the initial state and leave with the final one (c: LSTM
// only). mask (B, T) nonzero = real step (null: all real); a padded step carries the state and writes
// y = 0. A classic GRU (reset before the product) has U packed with split = 2H: r and z from U.head,
// the candidate from U.tail.

// What one thread's int8 recurrent steps reuse from call to call (thread_local): x_t's and h_{t-1}'s
// rows quantized and their int32 sums, and the classic GRU's r * h_{t-1}, quantized and multiplied
struct Int8StepScratch {
    Int8Activations xq, hq, rq;
    std::vector<int32_t> ax, ah, an;
    std::vector<float> rh;
};
inline Int8StepScratch& int8_step_scratch() {
    thread_local Int8StepScratch scratch;
    return scratch;
}

template <class V, class Acts>
ATTNX_ALWAYS_INLINE void rnn_steps_int8(const RNNConfig& cfg, const Acts& acts, int b0, int b1, float* y, float* h,
                                        float* c, const float* x, const Int8Kernel& Wk, const float* b_in,
                                        const Int8Kernel& U, const float* b_rec, const uint8_t* mask,
                                        Int8StepScratch& scratch) {
    constexpr int W = Lanes<V>::W;
    const int Tn = cfg.T, H = cfg.H, C = cfg.C, G = cfg.G(), rows = b1 - b0;
    const bool classic = cfg.cell == RNNCell::gru && !cfg.reset_after;
    const Int8Packed& PW = Wk.head;                // x_t's columns (all G)
    const Int8Packed &PU = U.head, &PUn = U.tail;  // h_{t-1}'s columns (classic GRU: r and z), the candidate's
    const int nU = PU.N;
    const float *sW = Wk.scale.data(), *sU = U.scale.data();
    Int8Activations &xq = scratch.xq, &hq = scratch.hq, &rq = scratch.rq;  // x_t, h_{t-1}, classic GRU's r * h_{t-1}
    xq.resize(rows, C, PW.Kp, PW.Np);
    hq.resize(rows, H, PU.Kp, PU.Np);
    scratch.ax.resize((size_t)rows * PW.Np), scratch.ah.resize((size_t)rows * PU.Np);
    const int32_t *ax = scratch.ax.data(), *ah = scratch.ah.data(), *an = nullptr;
    if (classic) {
        scratch.rh.resize((size_t)rows * H), scratch.an.resize((size_t)rows * PUn.Np);
        rq.resize(rows, H, PUn.Kp, PUn.Np);
        an = scratch.an.data();
    }
    float* rh = scratch.rh.data();
    const size_t ldx = (size_t)Tn * C;  // x's rows of one time step
    for (int step = 0; step < Tn; ++step) {
        const int t = cfg.time_at(step);
        // x_t W and h_{t-1} U (classic GRU: its r and z columns) as int32 sums
        xq.quantize_on<V>(x + ((size_t)b0 * Tn + t) * C, ldx, rows, PW.feature_weight.data());
        xq.product(scratch.ax.data(), (size_t)PW.Np, rows, PW, 0, G);
        hq.quantize_on<V>(h + (size_t)b0 * H, (size_t)H, rows, PU.feature_weight.data());
        hq.product(scratch.ah.data(), (size_t)PU.Np, rows, PU, 0, nU);
        for (int r = 0; r < rows; ++r) {
            const int b = b0 + r;
            float* hb = h + (size_t)b * H;
            float* yb = y ? y + ((size_t)b * Tn + t) * H : nullptr;
            const bool real = !mask || mask[(size_t)b * Tn + t];
            if (!real) {
                if (yb) std::fill(yb, yb + H, 0.f);
                continue;
            }
            for (int j = 0; j < H; j += W) {
                const int n = std::min(W, H - j);
                // gate q's x_t W + b_in, and its h_{t-1} U (+ b_rec), at units [j, j + n)
                auto in = [&](int q) __attribute__((always_inline)) {
                    return xq.dequantized<V>(ax, (size_t)PW.Np, r, sW, b_in, q * H + j, n, (size_t)PW.Np);
                };
                auto rec = [&](int q) __attribute__((always_inline)) {
                    return hq.dequantized<V>(ah, (size_t)PU.Np, r, sU, b_rec, q * H + j, n, (size_t)PU.Np);
                };
                auto pre = [&](int q) __attribute__((always_inline)) { return in(q) + rec(q); };
                V h_t;
                switch (cfg.cell) {
                    case RNNCell::simple:  // h_t = act(x_t W + b + h_{t-1} U)
                        h_t = acts.act(pre(0));
                        break;
                    case RNNCell::lstm: {  // i, f, o = ract(.), g = act(.); c_t = f c_{t-1} + i g; h_t = o act(c_t)
                        const V i = acts.ract(pre(0)), f = acts.ract(pre(1)), g = acts.act(pre(2)), o = acts.ract(pre(3));
                        float* cb = c + (size_t)b * H + j;
                        const V c_t = f * vload<V>(cb, n) + i * g;
                        vstore(cb, c_t, n);
                        h_t = o * acts.act(c_t);
                        break;
                    }
                    default: {  // GRU
                        const V r_ = acts.ract(pre(0)), z = acts.ract(pre(1));
                        if (classic) {  // the candidate's product needs r * h first
                            vstore(rh + (size_t)r * H + j, r_ * vload<V>(hb + j, n), n);
                            continue;
                        }
                        // n = act(x_n + r * (h U_n + b_hn)); h_t = z h_{t-1} + (1 - z) n
                        const V nn = acts.act(in(2) + r_ * rec(2));
                        h_t = z * vload<V>(hb + j, n) + (vbroadcast<V>(1.f) - z) * nn;
                    }
                }
                vstore(hb + j, h_t, n);
                if (yb) vstore(yb + j, h_t, n);
            }
        }
        if (!classic) continue;
        // classic GRU: n = act(x_n + b_n + (r * h_{t-1}) U_n); h_t = z h_{t-1} + (1 - z) n
        rq.quantize_on<V>(rh, (size_t)H, rows, PUn.feature_weight.data());
        rq.product(scratch.an.data(), (size_t)PUn.Np, rows, PUn, 0, H);
        for (int r = 0; r < rows; ++r) {
            const int b = b0 + r;
            if (mask && !mask[(size_t)b * Tn + t]) continue;
            float* hb = h + (size_t)b * H;
            float* yb = y ? y + ((size_t)b * Tn + t) * H : nullptr;
            for (int j = 0; j < H; j += W) {
                const int n = std::min(W, H - j);
                const V z = acts.ract(xq.dequantized<V>(ax, (size_t)PW.Np, r, sW, b_in, H + j, n, (size_t)PW.Np) +
                                      hq.dequantized<V>(ah, (size_t)PU.Np, r, sU, b_rec, H + j, n, (size_t)PU.Np));
                const V nn = acts.act(xq.dequantized<V>(ax, (size_t)PW.Np, r, sW, b_in, 2 * H + j, n, (size_t)PW.Np) +
                                      rq.dequantized<V>(an, (size_t)PUn.Np, r, sU + 2 * H, nullptr, j, n,
                                                        (size_t)PUn.Np));
                const V h_t = z * vload<V>(hb + j, n) + (vbroadcast<V>(1.f) - z) * nn;
                vstore(hb + j, h_t, n);
                if (yb) vstore(yb + j, h_t, n);
            }
        }
    }
}

// W (C, G) and U (H, G) packed (U with split = 2H for a classic GRU, G otherwise); each thread's rows
// step on its own scratch (int8_step_scratch)
inline void rnn_forward_int8(const RNNConfig& cfg, float* y, float* h, float* c, const float* x, const Int8Kernel& W,
                             const Int8Kernel& U, const float* b_in, const float* b_rec, const uint8_t* mask) {
    for_batch_rows(cfg, [&](int b0, int b1) {
        Int8StepScratch& scratch = int8_step_scratch();
        auto run = [&](const auto& acts) {
            on_widest_lanes<float>([&](auto lanes) __attribute__((always_inline)) {
                rnn_steps_int8<decltype(lanes)>(cfg, acts, b0, b1, y, h, c, x, W, b_in, U, b_rec, mask, scratch);
            });
        };
        if (cfg.activation == Activation::tanh && cfg.recurrent_activation == Activation::sigmoid) run(TanhSigmoid{});
        else run(AnyActivations{cfg.activation, cfg.recurrent_activation});
    });
}

}  // namespace attnx
