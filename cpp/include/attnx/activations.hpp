// Elementwise activations and the row softmax, forward and backward.
#pragma once
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <immintrin.h>  // declares the AVX-512 builtins vload / vstore use
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace attnx {

enum class Activation { linear, relu, tanh, sigmoid, softmax, gelu };

inline Activation activation_from_name(const std::string& name) {
    if (name == "linear" || name.empty()) return Activation::linear;
    if (name == "relu") return Activation::relu;
    if (name == "tanh") return Activation::tanh;
    if (name == "sigmoid") return Activation::sigmoid;
    if (name == "softmax") return Activation::softmax;
    if (name == "gelu") return Activation::gelu;
    throw std::invalid_argument("unknown activation '" + name +
                                "'; expected linear, relu, tanh, sigmoid, softmax or gelu");
}

template <class T> inline T sigmoid(T x) {
    // branch keeps exp() from overflowing for large |x|
    if (x >= T(0)) return T(1) / (T(1) + std::exp(-x));
    T e = std::exp(x);
    return e / (T(1) + e);
}

// gelu(x) = x * Phi(x), Phi the standard normal CDF (exact form, as Keras and PyTorch default)
template <class T> inline T gelu_cdf(T x) { return T(0.5) * (T(1) + std::erf(x * T(0.70710678118654752440))); }
template <class T> inline T gelu_pdf(T x) { return T(0.39894228040143267794) * std::exp(T(-0.5) * x * x); }

// ----------------------------------------------------------------------------- vectors
#define ATTNX_ALWAYS_INLINE inline __attribute__((always_inline))

// Four, eight or sixteen floats as one value (GCC/Clang vector extension): one SSE register in
// portable builds, one AVX register inside the loops compiled for AVX2, one AVX-512 register inside
// those compiled for AVX-512 (float16 is sixteen floats, not half precision). Branch-free code on
// them vectorizes regardless of -ftrapping-math, which keeps GCC from if-converting scalar loops.
typedef float float4 __attribute__((vector_size(16)));
typedef float float8 __attribute__((vector_size(32)));
typedef float float16 __attribute__((vector_size(64)));

typedef int32_t int4 __attribute__((vector_size(16)));
typedef int32_t int8 __attribute__((vector_size(32)));
typedef int32_t int16 __attribute__((vector_size(64)));
typedef uint32_t uint4 __attribute__((vector_size(16)));
typedef uint32_t uint8 __attribute__((vector_size(32)));
typedef uint32_t uint16 __attribute__((vector_size(64)));

// The scalar type, the lane count and the (signed, unsigned) integer vectors of the values the
// vector loops compute on (one float or double: one lane; double for the gradient checks).
template <class V> struct Lanes;
template <> struct Lanes<double> { using T = double; static constexpr int W = 1; };
template <> struct Lanes<float> { using T = float; using I = int32_t; using U = uint32_t; static constexpr int W = 1; };
template <> struct Lanes<float4> { using T = float; using I = int4; using U = uint4; static constexpr int W = 4; };
template <> struct Lanes<float8> { using T = float; using I = int8; using U = uint8; static constexpr int W = 8; };
template <> struct Lanes<float16> { using T = float; using I = int16; using U = uint16; static constexpr int W = 16; };

// n <= W contiguous values as one vector (lanes past n zero) and back. Sixteen floats exist only
// inside the AVX-512 copies, whose tails load and store under a lane mask (the builtins behind
// _mm512_maskz_loadu_ps / _mm512_mask_storeu_ps: those wrappers would not inline here, outside
// the AVX-512 target); narrower tails go through memcpy.
template <class V, class T = typename Lanes<V>::T> ATTNX_ALWAYS_INLINE V vload(const T* p, int n) {
    V v = {};
    if (n == Lanes<V>::W) std::memcpy(&v, p, sizeof v);
    else if constexpr (Lanes<V>::W == 16) v = __builtin_ia32_loadups512_mask(p, v, (uint16_t)((1u << n) - 1));
    else std::memcpy(&v, p, (size_t)n * sizeof(T));
    return v;
}
template <class V, class T = typename Lanes<V>::T> ATTNX_ALWAYS_INLINE void vstore(T* p, V v, int n) {
    if (n == Lanes<V>::W) std::memcpy(p, &v, sizeof v);
    else if constexpr (Lanes<V>::W == 16) __builtin_ia32_storeups512_mask(p, v, (uint16_t)((1u << n) - 1));
    else std::memcpy(p, &v, (size_t)n * sizeof(T));
}

// Lane j of v (v itself for a single lane)
template <class V, class T = typename Lanes<V>::T> ATTNX_ALWAYS_INLINE T lane(V v, int j) {
    if constexpr (Lanes<V>::W == 1) return v;
    else return v[j];
}

// The instruction sets the kernels are compiled for, narrowest first: baseline x86-64 (SSE2),
// AVX2 + FMA, AVX-512 (F, VL, BW, DQ).
enum class SimdLevel { baseline, avx2, avx512 };

inline const char* simd_level_name(SimdLevel level) {
    return level == SimdLevel::avx512 ? "avx512" : level == SimdLevel::avx2 ? "avx2" : "baseline";
}

// The widest level this CPU (and its OS, which must save the wider registers) runs
inline SimdLevel cpu_simd_level() {
    static const SimdLevel level =
        __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq")
            ? SimdLevel::avx512
        : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? SimdLevel::avx2
                                                                          : SimdLevel::baseline;
    return level;
}

// The widest level the kernels may take: how the tests run each level's copies on this CPU
// (_core._force_simd_level). Not for concurrent use with running kernels: operands packed for
// one level must be read by the same level.
inline std::atomic<int>& simd_level_cap() {
    static std::atomic<int> cap{(int)SimdLevel::avx512};
    return cap;
}

// The level the kernels run at: the CPU's, unless capped lower
inline SimdLevel simd_level() {
    return (SimdLevel)std::min((int)cpu_simd_level(), simd_level_cap().load(std::memory_order_relaxed));
}

// body(V{}) on the widest vectors this CPU runs for T: float16 in a copy compiled for AVX-512,
// float8 in one for AVX2 + FMA (multiply-adds fused in both), float4 on baseline x86-64, double (one
// lane) for the gradient checks. body is an always-inline generic lambda, so that its loops compile
// inside the copy that calls it (scalar loops there vectorize to the copy's width); returns what
// body returns.
template <class Body>
__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,prefer-vector-width=512"),
               optimize("fp-contract=fast"))) auto on_avx512_lanes(Body& body) {
    return body(float16{});
}
template <class Body>
__attribute__((target("avx2,fma"), optimize("fp-contract=fast"))) auto on_avx2_lanes(Body& body) {
    return body(float8{});
}
template <class T, class Body> auto on_widest_lanes(Body&& body) {
    if constexpr (std::is_same_v<T, double>) {
        return body(double{});
    } else {
        switch (simd_level()) {
            case SimdLevel::avx512: return on_avx512_lanes(body);
            case SimdLevel::avx2: return on_avx2_lanes(body);
            default: return body(float4{});
        }
    }
}

// ----------------------------------------------------------------------------- exp
// The one exp kernel for floats, on vectors V (or one float): Cephes' expf, branch-free:
//   exp(x) = 2^n * p(r),  n = round(x / ln 2),  r = x - n ln 2 in [-ln2 / 2, ln2 / 2]
// with p a degree-7 polynomial (relative error < 2e-7, about 1 ulp). exp(x) = 0 below
// -87.3365 (where the result would be subnormal), inf above 88.7228, NaN for NaN. `nonpositive`
// (the softmax's x - max) drops the overflow handling. Doubles keep std::exp (gradchecks want the
// last bits).
template <class V, bool nonpositive = false> ATTNX_ALWAYS_INLINE V exp_lanes(V x) {
    if constexpr (std::is_same_v<V, double>) {
        return std::exp(x);
    } else {
        using I = typename Lanes<V>::I;
        const V round_bias = V{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer in any FP mode
        const V t = x * 1.44269504088896341f + round_bias;
        const V n = t - round_bias;
        // r = x - n ln2, ln2 split in two so n * ln2_hi is exact
        const V r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
        V p = r * 1.9875691500e-4f + 1.3981999507e-3f;
        p = p * r + 8.3334519073e-3f;
        p = p * r + 4.1665795894e-2f;
        p = p * r + 1.6666665459e-1f;
        p = p * r + 5.0000001201e-1f;
        p = p * (r * r) + r + 1.0f;
        // 2^n from the exponent bits; n = 128 (x near the top of the range) as 2^127 * 2. The
        // integer n is t's low mantissa bits (no float-to-int conversion, which NaN would make
        // undefined; out of range, the selects below replace what comes of it).
        // Integer arithmetic in unsigned: it wraps where signed would overflow.
        using U = typename Lanes<V>::U;
        U t_bits;
        std::memcpy(&t_bits, &t, sizeof t_bits);
        I e = (I)(t_bits - 0x4B400000u);  // minus the bits of round_bias
        const I max_exponent = I{} + 127;
        if constexpr (!nonpositive) e = e > max_exponent ? max_exponent : e;
        const U bits = ((U)e + 127u) << 23;
        V scale;
        std::memcpy(&scale, &bits, sizeof scale);
        V y = p * scale;
        if constexpr (!nonpositive) {
            const V doubled = y + y;
            y = n > V{} + 127.0f ? doubled : y;
            y = x > V{} + 88.72283935f ? V{} + std::numeric_limits<float>::infinity() : y;
        }
        return x < V{} - 87.33654475f ? V{} : y;
    }
}

// reference: std::exp (cpp/tests/test_reference_activations.cpp)
// y[i] = exp(x[i]) for i < n; y may alias x.
template <class T> inline void exp_array(T* y, const T* x, size_t n) {
    on_widest_lanes<T>([&](auto lanes) __attribute__((always_inline)) {
        using V = decltype(lanes);
        constexpr size_t W = Lanes<V>::W;
        size_t i = 0;
        for (; i + W <= n; i += W) vstore(y + i, exp_lanes(vload<V>(x + i, W)), W);
        for (; i < n; ++i) y[i] = exp_lanes(x[i]);
    });
}

// ----------------------------------------------------------------------------- row reductions
// Reductions over a row keep kLanes partial results so that they vectorize: one accumulator
// would chain every add behind the last (4 cycles each), which costs more than the math.
constexpr size_t kLanes = 8;

// sum_{c < n} term(c), in L partial sums (more where the loop runs on wide vectors: 32 doubles are
// four AVX-512 chains)
template <class T, size_t L = kLanes, class Term> ATTNX_ALWAYS_INLINE T sum_lanes(size_t n, Term term) {
    T lane[L] = {};
    const size_t body = n - n % L;
    for (size_t c = 0; c < body; c += L)
        for (size_t j = 0; j < L; ++j) lane[j] += term(c + j);
    T sum = 0;
    for (size_t c = body; c < n; ++c) sum += term(c);
    for (size_t j = 0; j < L; ++j) sum += lane[j];
    return sum;
}

// ----------------------------------------------------------------------------- softmax
// The softmax of x over the entries with mask[c] != 0 (mask null: all entries) before its
// normalization, on vectors V: y[c] = exp(x[c] - max) where allowed, 0 elsewhere; returns
// 1 / sum_c y[c], so that softmax = y * the result. A fully masked row gives zeros (and 0), never
// NaN; a NaN row gives NaNs. One row of length cols; y may alias x.
template <class V, class T>
ATTNX_ALWAYS_INLINE T masked_exp_row_lanes(T* y, const T* x, const uint8_t* mask, size_t cols) {
    constexpr size_t W = Lanes<V>::W;
    constexpr T minus_inf = -std::numeric_limits<T>::infinity();
    // y = x where allowed, -inf (weight exp(-inf) = 0) elsewhere
    if (mask)
        for (size_t c = 0; c < cols; ++c) y[c] = mask[c] ? x[c] : minus_inf;
    else if (y != x)
        std::copy(x, x + cols, y);
    // m = max_c y[c] (NaNs skipped here; they reach the sum below, and the whole row, through exp)
    const size_t body = cols - cols % W;
    V lane_max = V{} + minus_inf;
    for (size_t c = 0; c < body; c += W) {
        const V v = vload<V>(y + c, W);
        lane_max = v > lane_max ? v : lane_max;
    }
    T maxv = minus_inf;
    for (size_t j = 0; j < W; ++j) maxv = lane(lane_max, j) > maxv ? lane(lane_max, j) : maxv;
    for (size_t c = body; c < cols; ++c) maxv = y[c] > maxv ? y[c] : maxv;
    if (maxv == minus_inf) {  // nothing to attend to, unless NaN (a row of NaNs must not pass for a masked one)
        const bool nan = std::any_of(y, y + cols, [](T v) { return v != v; });
        const T fill = nan ? std::numeric_limits<T>::quiet_NaN() : T(0);
        std::fill(y, y + cols, fill);
        return fill;
    }
    // y = exp(y - m),  sum = sum_c y[c]
    V lane_sum = {};
    for (size_t c = 0; c < body; c += W) {
        const V e = exp_lanes<V, true>(vload<V>(y + c, W) - maxv);
        vstore(y + c, e, W);
        lane_sum += e;
    }
    T sum = 0;
    for (size_t c = body; c < cols; ++c) sum += (y[c] = exp_lanes<T, true>(y[c] - maxv));
    for (size_t j = 0; j < W; ++j) sum += lane(lane_sum, j);
    return T(1) / sum;
}

// reference: cpp/reference/activations.hpp, softmax_forward
// y = softmax(x) over the entries with mask[c] != 0 (mask null: all entries), on vectors V;
// masked entries get 0 and a fully masked row is all zeros, never NaN. One row of length cols;
// y may alias x.
template <class V, class T>
ATTNX_ALWAYS_INLINE void masked_softmax_row_lanes(T* y, const T* x, const uint8_t* mask, size_t cols) {
    const T norm = masked_exp_row_lanes<V>(y, x, mask, cols);
    for (size_t c = 0; c < cols; ++c) y[c] *= norm;
}

// masked_softmax_row_lanes on the widest vectors this CPU runs
template <class T> inline void masked_softmax_row(T* y, const T* x, const uint8_t* mask, size_t cols) {
    on_widest_lanes<T>([&](auto lanes) __attribute__((always_inline)) {
        masked_softmax_row_lanes<decltype(lanes)>(y, x, mask, cols);
    });
}

// y[r, :] = softmax(x[r, :]) for rows of length cols; y may alias x.
template <class T> inline void softmax_rows(T* y, const T* x, size_t rows, size_t cols) {
    on_widest_lanes<T>([&](auto lanes) __attribute__((always_inline)) {
        for (size_t r = 0; r < rows; ++r)
            masked_softmax_row_lanes<decltype(lanes)>(y + r * cols, x + r * cols, nullptr, cols);
    });
}

// reference: cpp/reference/activations.hpp, softmax_backward
// dx[r, c] = y[r, c] * (dy[r, c] - sum_k dy[r, k] y[r, k]); dx may alias dy. Also the backward of
// masked_softmax_row: masked entries have y = 0 and so get dx = 0.
template <class T> inline void softmax_rows_backward(T* dx, const T* dy, const T* y, size_t rows, size_t cols) {
    on_widest_lanes<T>([&](auto) __attribute__((always_inline)) {
        for (size_t r = 0; r < rows; ++r) {
            const T* yr = y + r * cols;
            const T* dyr = dy + r * cols;
            const T dot = sum_lanes<T>(cols, [&](size_t c) { return dyr[c] * yr[c]; });
            T* dxr = dx + r * cols;
            for (size_t c = 0; c < cols; ++c) dxr[c] = yr[c] * (dyr[c] - dot);
        }
    });
}

// ------------------------------------------------------------------------ vector activations
// What the recurrent time loops, the additive score and activation_forward / _backward compute on.

// tanh without libm: Eigen's rational approximation on [-7.9, 7.9] (tanh is 1 to float precision
// beyond). |error| < 4e-7 against the double tanh at every level (2.72e-7 with fused multiply-adds,
// 3.63e-7 without), exactly +-1 at the clamp, tanh(0) = 0, odd, |tanh| <= 1, NaN for NaN
// (test_reference_activations' dense sweep). The quotient stays a division: a reciprocal estimate
// and Newton steps instead (rcp14ps + one, or rcpps + two on AVX2) were as accurate but slower on
// Zen 5 (activate_block tanh 0.188 -> 0.206 ns per float at AVX-512, 0.364 -> 0.412 at AVX2):
// the divider runs beside the multiply-adds, which are what these loops wait for.
template <class V> ATTNX_ALWAYS_INLINE V tanh_rational(V x) {
    const V limit = V{} + 7.90531110763549805f;
    x = x > limit ? limit : x;
    x = x < -limit ? -limit : x;
    const V x2 = x * x;
    V p = x2 * -2.76076847742355e-16f + 2.00018790482477e-13f;
    p = p * x2 + -8.60467152213735e-11f;
    p = p * x2 + 5.12229709037114e-08f;
    p = p * x2 + 1.48572235717979e-05f;
    p = p * x2 + 6.37261928875436e-04f;
    p = p * x2 + 4.89352455891786e-03f;
    V q = x2 * 1.19825839466702e-06f + 1.18534705686654e-04f;
    q = q * x2 + 2.26843463243900e-03f;
    q = q * x2 + 4.89352518554385e-03f;
    const V y = x * p / q;
    // exactly +-1 at the clamp, whether or not the multiply-adds fuse (fused, the rational gives 1 - 2^-24)
    return x == limit ? V{} + 1.0f : x == -limit ? V{} - 1.0f : y;
}

// sigmoid without libm, to float's relative precision on both tails (a sigmoid output is a
// probability whose log a loss may take: tanh's absolute error would be 0.3% of sigmoid(-10)):
//   e = exp(-|x|) in (0, 1],  s = 1 / (1 + e) for x >= 0,  e / (1 + e) for x < 0.
// 0 below x = -87.3, where exp_lanes flushes; NaN for NaN. Relative error < 3e-7 at every level
// (the tests' sweep). The Activation layer's and Dense epilogues' sigmoid; the gates take
// activate()'s cheaper one.
template <class V> ATTNX_ALWAYS_INLINE V sigmoid_lanes(V x) {
    const V minus_abs = x > V{} ? -x : x;
    const V e = exp_lanes<V, true>(minus_abs);
    return (x < V{} ? e : V{} + 1.0f) / (e + 1.0f);
}

// gelu's Phi(x) = (1 + erf(x / sqrt2)) / 2, without libm, for float lanes, with what its slope
// needs. From the negative side, where Phi is small and its relative precision matters:
//   Phi(-|x|) = erfc(z) / 2 = exp(-z^2) erfcx(z) / 2,  z = |x| / sqrt2 (clamped to 10: erfc(10) = 2e-45),
//   erfcx(z) ~ t P(t),  t = 1 / (1 + z / 2) in (1/6, 1],  P of degree 9 fitted (relative least squares on
//   Chebyshev nodes, double) to erfcx(z) / t: relative error < 4e-8 with its float coefficients;
// Phi(x) = 1 - Phi(-|x|) for x > 0. Phi's error < 2e-7; gelu's relative error < 1e-6 on [-5, 0)
// and < 3e-6 on [-10, -5) (|gelu| < 1.5e-6 there: float's rounding of x^2 / 2 in exp's argument;
// the tests' sweep). The exp(-z^2) is also phi's, phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
template <class V> struct NormalLanes { V cdf, pdf; };
template <class V> ATTNX_ALWAYS_INLINE NormalLanes<V> normal_lanes(V x) {
    const V abs_x = x < V{} ? -x : x;
    V z = abs_x * 0.70710678118654752f;
    z = z > V{} + 10.0f ? V{} + 10.0f : z;
    const V t = 1.0f / (z * 0.5f + 1.0f);
    V p = t * 1.353464928e-02f + -1.296140552e-01f;
    p = p * t + 4.428111315e-01f;
    p = p * t + -6.870458126e-01f;
    p = p * t + 4.341518879e-01f;
    p = p * t + -1.045284793e-01f;
    p = p * t + 2.274455130e-01f;
    p = p * t + 2.382882237e-01f;
    p = p * t + 2.828940153e-01f;
    p = p * t + 2.820628881e-01f;
    // exp(-z^2) from x, not the rounded z (whose rounding was 7e-6 of the result at x = -10)
    const V gauss = exp_lanes<V, true>(-0.5f * (x * x));
    const V tail = 0.5f * gauss * (t * p);  // Phi(-|x|)
    return {x > V{} ? 1.0f - tail : tail, gauss * 0.39894228040143267794f};
}

// reference: cpp/reference/activations.hpp, act
// act(v) lane by lane as the recurrent gates and the additive score take it: floats without libm,
// sigmoid(x) = (1 + tanh(x / 2)) / 2 (absolute error < 2e-7: a gate scales a bounded state, and
// this is one rational, cheaper than sigmoid_lanes' exp and quotient); double, for the gradient
// checks, the libm functions.
template <class V> ATTNX_ALWAYS_INLINE V activate(Activation a, V v) {
    switch (a) {
        case Activation::tanh:
            if constexpr (std::is_same_v<V, double>) return std::tanh(v);
            else return tanh_rational(v);
        case Activation::sigmoid:
            if constexpr (std::is_same_v<V, double>) return sigmoid(v);
            else return 0.5f + 0.5f * tanh_rational(0.5f * v);
        case Activation::relu: return v > typename Lanes<V>::T(0) ? v : V{};
        default: return v;
    }
}

// reference: cpp/reference/activations.hpp, act
// act(v) lane by lane as a layer's output takes it (activation_forward): activate()'s, but sigmoid to
// float's relative precision (sigmoid_lanes) and gelu (normal_lanes); double: libm.
template <class V> ATTNX_ALWAYS_INLINE V activate_output(Activation a, V v) {
    if constexpr (!std::is_same_v<V, double>) {
        if (a == Activation::sigmoid) return sigmoid_lanes(v);
        if (a == Activation::gelu) return v * normal_lanes(v).cdf;
    } else if (a == Activation::gelu) {
        return v * gelu_cdf(v);
    }
    return activate(a, v);
}

// reference: cpp/reference/activations.hpp, act_slope
// act'(x) lane by lane, given x and y = act(x) (gelu's needs x, the others y)
template <class V> ATTNX_ALWAYS_INLINE V activate_slope(Activation a, V x, V y) {
    using T = typename Lanes<V>::T;
    switch (a) {
        case Activation::tanh: return T(1) - y * y;
        case Activation::sigmoid: return y * (T(1) - y);
        // d/dx [x Phi(x)] = Phi(x) + x phi(x)
        case Activation::gelu:
            if constexpr (std::is_same_v<V, double>) return gelu_cdf(x) + x * gelu_pdf(x);
            else {
                const NormalLanes<V> normal = normal_lanes(x);
                return normal.cdf + x * normal.pdf;
            }
        default: return V{} + T(1);  // linear; relu and softmax have their own loops
    }
}

// body(lanes, i, m) for i = 0, W, 2W, ... < n on the widest vectors V this CPU runs (lanes: a V tag), with
// m = min(W, n - i) values at i: the one loop of the element-wise passes below
template <class T, class Body> ATTNX_ALWAYS_INLINE void for_widest_lanes(size_t n, Body&& body) {
    on_widest_lanes<T>([&](auto lanes) __attribute__((always_inline)) {
        constexpr size_t W = Lanes<decltype(lanes)>::W;
        for (size_t i = 0; i < n; i += W) body(lanes, i, (int)std::min(W, n - i));
    });
}

// reference: cpp/reference/activations.hpp, act
// v = act(v) over n contiguous values, on the widest vectors this CPU runs
template <class T> void activate_block(Activation a, T* v, int n) {
    for_widest_lanes<T>((size_t)n, [&](auto lanes, size_t k, int m) __attribute__((always_inline)) {
        using V = decltype(lanes);
        vstore(v + k, activate(a, vload<V>(v + k, m)), m);
    });
}

// reference: cpp/reference/activations.hpp, activation_forward
// y = act(x) over a (rows, cols) block; softmax acts on each row. y may alias x.
template <class T> void activation_forward(T* y, const T* x, size_t rows, size_t cols, Activation act) {
    const size_t n = rows * cols;
    switch (act) {
        case Activation::linear: if (y != x) std::copy(x, x + n, y); break;
        case Activation::relu: for (size_t i = 0; i < n; ++i) y[i] = x[i] < T(0) ? T(0) : x[i]; break;  // NaN stays NaN
        case Activation::softmax: softmax_rows(y, x, rows, cols); break;
        default:
            for_widest_lanes<T>(n, [&](auto lanes, size_t i, int m) __attribute__((always_inline)) {
                using V = decltype(lanes);
                vstore(y + i, activate_output(act, vload<V>(x + i, m)), m);
            });
    }
}

// reference: cpp/reference/activations.hpp, activation_backward
// dx = dy * act'(x), using the cached output y where that is cheaper (gelu needs x).
// dx may alias dy.
template <class T>
void activation_backward(T* dx, const T* dy, const T* x, const T* y, size_t rows, size_t cols, Activation act) {
    const size_t n = rows * cols;
    switch (act) {
        case Activation::linear: if (dx != dy) std::copy(dy, dy + n, dx); break;
        // dy read on every path: then the select is a vector blend, not a branch per element (mispredicted
        // half the time on random signs: 5 ms per 1M elements)
        case Activation::relu:
            for (size_t i = 0; i < n; ++i) {
                const T g = dy[i];
                dx[i] = y[i] > T(0) ? g : T(0);
            }
            break;
        case Activation::softmax: softmax_rows_backward(dx, dy, y, rows, cols); break;
        default:
            for_widest_lanes<T>(n, [&](auto lanes, size_t i, int m) __attribute__((always_inline)) {
                using V = decltype(lanes);
                const V slope = activate_slope(act, vload<V>(x + i, m), vload<V>(y + i, m));
                vstore(dx + i, vload<V>(dy + i, m) * slope, m);
            });
    }
}

// The sum of v's lanes (v itself for a single lane)
template <class V, class T = typename Lanes<V>::T> ATTNX_ALWAYS_INLINE T sum_of_lanes(V v) {
    T sum = 0;
    for (int j = 0; j < Lanes<V>::W; ++j) sum += lane(v, j);
    return sum;
}

}  // namespace attnx
