// bf16.hpp against cpp/reference/bf16.hpp: the rounding to bf16 (exactly, on ties, subnormals, the
// overflow to inf and NaN), the packed bf16 product in its four transpose forms with and without
// accumulation, on sizes that leave vector, tile, row-block and pair-block tails and odd K, and the
// Dense forward and backward, and the convolution (conv.hpp's bf16 path: patches, groups of images,
// col2im) forward and backward, and scaled dot-product attention (attention.hpp's sdpa with bf16: scores,
// context and their gradients); on every SIMD level (AVX-512 both on vdpbf16ps where the CPU has it
// and on float lanes), on one thread and two. The float-lane levels must agree bit for bit.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "attnx/attention.hpp"
#include "attnx/bf16.hpp"
#include "attnx/conv.hpp"
#include "reference/bf16.hpp"
#include "attend_check.hpp"
#include "bf16_check.hpp"
#include "reference_check.hpp"

using namespace attnx;
using namespace attnx::test;

namespace {

// Tolerance of the float32 sums against the reference's double ones (relative to 1 + |value|); the
// rounding of the operands to bf16 alone moves a product by ~2^-9 relative, which this catches
constexpr double kBf16SumTolerance = 1e-4;

float from_bits(uint32_t bits) {
    float x;
    std::memcpy(&x, &bits, sizeof x);
    return x;
}

std::vector<float> rounding_cases() {
    std::vector<float> x;
    std::mt19937 rng(7);
    std::uniform_int_distribution<uint32_t> bits;
    for (int i = 0; i < 20000; ++i) x.push_back(from_bits(bits(rng)));  // every exponent, NaNs, subnormals
    for (uint32_t hi : {0x3F80u, 0x3F81u, 0x0001u, 0x7F7Fu, 0xFF7Fu, 0x0080u})
        for (uint32_t lo : {0x7FFFu, 0x8000u, 0x8001u, 0x0000u, 0xFFFFu}) x.push_back(from_bits(hi << 16 | lo));  // ties
    for (float v : {0.0f, -0.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min(),
                    std::numeric_limits<float>::max(), 1.00390625f, 1.01171875f})
        x.push_back(v);
    return x;
}

void test_rounding() {
    const std::vector<float> x = rounding_cases();
    for (float v : x) {
        const double want = reference::round_to_bf16((double)v);
        const float got = bf16_value(bf16_bits(v));
        const bool same = std::isnan(want) ? std::isnan(got) : (double)got == want && std::signbit(got) == std::signbit(want);
        if (!same) {
            std::printf("FAIL round_to_bf16(%.9g): got %.9g, reference %.9g\n", v, got, want);
            ++failures();
            return;
        }
    }
    on_every_level_and_split([&](const std::string& level) {
        std::vector<float> y(x.size());
        round_to_bf16(y.data(), x.data(), x.size());
        for (size_t i = 0; i < x.size(); ++i)
            if (std::memcmp(&y[i], &x[i], 4) != 0 && !(std::isnan(x[i]) && std::isnan(y[i]))) {
                const float want = bf16_value(bf16_bits(x[i]));
                if (std::memcmp(&y[i], &want, 4) != 0) {
                    std::printf("FAIL round_to_bf16 array %s [%zu]\n", level.c_str(), i);
                    ++failures();
                    return;
                }
            }
    });
}

// pack_bf16_rows and pack_bf16_columns (AVX512_BF16's conversion where the CPU has it, integer lanes
// elsewhere) give bf16_bits' pairs bit for bit on the rounding's cases (subnormals in some vectors and
// not others, NaNs, ties), on odd K and on row, vector and pad tails
void test_packing_rounds_as_bf16_bits(const std::vector<float>& x) {
    auto pair = [](float even, float odd) { return bf16_bits(even) | bf16_bits(odd) << 16; };
    for (int K : {1, 2, 31, 32, 33, 67}) {
        const int rows = 9, K2 = (K + 1) / 2, cols = 37, pad = 48;
        std::vector<float> a((size_t)rows * (K + 3));
        for (size_t i = 0; i < a.size(); ++i) a[i] = x[(i * 7919 + K) % x.size()];
        on_every_bf16_path([&](const std::string& path) {
            std::vector<uint32_t> got((size_t)rows * (K2 + 2), 0xDEADBEEFu);
            pack_bf16_rows(got.data(), K2 + 2, a.data(), K + 3, rows, K);
            for (int r = 0; r < rows; ++r)
                for (int kp = 0; kp < K2 + 2; ++kp) {
                    const float* row = a.data() + (size_t)r * (K + 3);
                    const uint32_t want = kp >= K2 ? 0xDEADBEEFu : pair(row[2 * kp], 2 * kp + 1 < K ? row[2 * kp + 1] : 0.0f);
                    if (got[(size_t)r * (K2 + 2) + kp] != want) {
                        std::printf("FAIL pack_bf16_rows %s K=%d [%d, %d]: %08x, want %08x\n", path.c_str(), K, r, kp,
                                    got[(size_t)r * (K2 + 2) + kp], want);
                        ++failures();
                        return;
                    }
                }
            // At (K, cols) from the same values, rows cols + 3 apart
            std::vector<float> at((size_t)K * (cols + 3));
            for (size_t i = 0; i < at.size(); ++i) at[i] = x[(i * 104729 + K) % x.size()];
            std::vector<uint32_t> panel((size_t)K2 * (pad + 1), 0xDEADBEEFu);
            pack_bf16_columns(panel.data(), pad + 1, at.data(), cols + 3, K, cols, pad);
            for (int kp = 0; kp < K2; ++kp)
                for (int c = 0; c < pad + 1; ++c) {
                    const float* even = at.data() + (size_t)(2 * kp) * (cols + 3) + c;
                    const uint32_t want = c == pad ? 0xDEADBEEFu : c >= cols ? 0u
                                                                             : pair(*even, 2 * kp + 1 < K ? even[cols + 3] : 0.0f);
                    if (panel[(size_t)kp * (pad + 1) + c] != want) {
                        std::printf("FAIL pack_bf16_columns %s K=%d [%d, %d]: %08x, want %08x\n", path.c_str(), K, kp, c,
                                    panel[(size_t)kp * (pad + 1) + c], want);
                        ++failures();
                        return;
                    }
                }
            // the column sums taken beside the pairs: sums[c] + At[0, c] + At[1, c] + ... in float32, in order
            // (a Dense's bias gradient, as bias_gradient sums it), the pairs the same
            std::vector<float> sums(cols + 1, 1.5f), want_sums(cols + 1, 1.5f);
            for (int k = 0; k < K; ++k)
                for (int c = 0; c < cols; ++c) want_sums[c] += at[(size_t)k * (cols + 3) + c];
            std::vector<uint32_t> summed((size_t)K2 * (pad + 1), 0xDEADBEEFu);
            pack_bf16_columns(summed.data(), pad + 1, at.data(), cols + 3, K, cols, pad, sums.data());
            for (int c = 0; c <= cols; ++c)
                if (!(sums[c] == want_sums[c] || (std::isnan(sums[c]) && std::isnan(want_sums[c]))) || summed != panel) {
                    std::printf("FAIL pack_bf16_columns' column sums %s K=%d [%d]: %g, want %g%s\n", path.c_str(), K, c,
                                sums[c], want_sums[c], summed != panel ? " (and the pairs differ)" : "");
                    ++failures();
                    return;
                }
        });
    }
}

void test_gemm(int M, int N, int K, bool trans_a, bool trans_b, bool accumulate, unsigned seed) {
    std::mt19937 rng(seed);
    const auto A = random_values(rng, (size_t)M * K), B = random_values(rng, (size_t)K * N);
    const auto C0 = random_values(rng, (size_t)M * N);
    std::vector<double> want = C0;
    reference::bf16_gemm(want.data(), A.data(), trans_a, B.data(), trans_b, M, N, K, accumulate);
    char where[112];
    std::snprintf(where, sizeof where, "bf16_gemm M=%d N=%d K=%d%s%s%s", M, N, K, trans_a ? " A^T" : "",
                  trans_b ? " B^T" : "", accumulate ? " +=" : "");
    const auto Af = cast<float>(A), Bf = cast<float>(B);
    const size_t lda = trans_a ? M : K, ldb = trans_b ? K : N;
    std::vector<float> float_lanes;  // the first float-lane level's result: the others must equal it
    on_every_bf16_path([&](const std::string& level) {
        std::vector<float> C = cast<float>(C0);
        bf16_gemm(C.data(), (size_t)N, Af.data(), lda, trans_a, Bf.data(), ldb, trans_b, M, N, K, accumulate);
        expect_near(C, want, kBf16SumTolerance, std::string(where) + " " + level);
        if (!bf16_tiles().native) {
            if (float_lanes.empty()) float_lanes = C;
            else if (std::memcmp(C.data(), float_lanes.data(), C.size() * 4) != 0) {
                std::printf("FAIL %s %s: not bit for bit the other float-lane levels' result\n", where, level.c_str());
                ++failures();
            }
        }
    });
    // the tolerance tells bf16 operands from float32 ones: a float32 product misses the reference
    if (K >= 64) {
        std::vector<double> float32_product = C0;
        for (int m = 0; m < M; ++m)
            for (int n = 0; n < N; ++n) {
                double acc = accumulate ? C0[(size_t)m * N + n] : 0;
                for (int k = 0; k < K; ++k)
                    acc += (trans_a ? A[(size_t)k * M + m] : A[(size_t)m * K + k]) *
                           (trans_b ? B[(size_t)n * K + k] : B[(size_t)k * N + n]);
                float32_product[(size_t)m * N + n] = acc;
            }
        double worst = 0;
        for (size_t i = 0; i < want.size(); ++i)
            worst = std::max(worst, std::abs(float32_product[i] - want[i]) / (1 + std::abs(want[i])));
        CHECK(worst > 10 * kBf16SumTolerance);
    }
}

void test_dense(int N, int C, int OC, Activation act, bool bias, unsigned seed) {
    std::mt19937 rng(seed);
    const auto x = random_values(rng, (size_t)N * C), W = random_values(rng, (size_t)C * OC, 0.3);
    const auto b = random_values(rng, OC), dz = random_values(rng, (size_t)N * OC);
    const auto dW0 = random_values(rng, (size_t)C * OC), db0 = random_values(rng, OC);
    std::vector<double> y((size_t)N * OC), z(y.size()), dx(x.size()), dW = dW0, db = db0;
    reference::bf16_dense_forward(y.data(), z.data(), x.data(), W.data(), bias ? b.data() : nullptr, N, C, OC, act);
    reference::bf16_dense_backward(dx.data(), dW.data(), db.data(), dz.data(), x.data(), W.data(), N, C, OC);
    const Named want{{"y", y}, {"z", z}, {"dx", dx}, {"dW", dW}, {"db", db}};
    char where[96];
    std::snprintf(where, sizeof where, "bf16_dense N=%d C=%d OC=%d act=%d%s", N, C, OC, (int)act, bias ? " bias" : "");
    std::map<std::string, Named> one_thread;  // each path's results on one thread
    on_every_bf16_path([&](const std::string& level) {
        const auto x_ = cast<float>(x), W_ = cast<float>(W), b_ = cast<float>(b), dz_ = cast<float>(dz);
        std::vector<float> y_(y.size()), z_(z.size()), dx_(dx.size()), dW_ = cast<float>(dW0), db_ = cast<float>(db0);
        bf16_dense_forward(y_.data(), z_.data(), x_.data(), W_.data(), bias ? b_.data() : nullptr, N, C, OC, act);
        bf16_dense_backward(dx_.data(), dW_.data(), db_.data(), dz_.data(), x_.data(), W_.data(), N, C, OC);
        const Named got{{"y", to_double(y_)}, {"z", to_double(z_)}, {"dx", to_double(dx_)}, {"dW", to_double(dW_)},
                        {"db", to_double(db_)}};
        compare_all(got, want, kBf16SumTolerance, std::string(where) + " " + level);
        // the activation and the bias gradient split across threads sum as one thread does: bit for bit
        const size_t two = level.find(" 2 threads");
        if (two == std::string::npos) one_thread[level] = got;
        else CHECK(got == one_thread.at(std::string(level).replace(two, 10, " 1 thread")));
    });
}

double max_abs(const std::vector<double>& v) {
    double m = 0;
    for (double e : v) m = std::max(m, std::abs(e));
    return m;
}

void test_conv(int B, int H, int W, int C, int KH, int KW, int S, bool same, int F, Activation act, unsigned seed,
               double x_scale = 1.0) {
    const Window2D w = window_2d(B, H, W, C, KH, KW, S, S, same);
    std::mt19937 rng(seed);
    const auto x = random_values(rng, (size_t)B * H * W * C, x_scale), kernel = random_values(rng, (size_t)w.patch() * F, 0.3);
    const auto bias = random_values(rng, F), dy = random_values(rng, (size_t)B * w.out_pixels() * F);
    const auto dK0 = random_values(rng, kernel.size()), db0 = random_values(rng, F);
    std::vector<double> y(dy.size()), z(dy.size()), dx(x.size()), dK = dK0, db = db0;
    reference::bf16_conv2d_forward(y.data(), z.data(), x.data(), kernel.data(), bias.data(), w, F, act);
    reference::bf16_conv2d_backward(dx.data(), dK.data(), db.data(), dy.data(), x.data(), kernel.data(), y.data(),
                                    z.data(), w, F, act);
    const Named want{{"y", y}, {"z", z}, {"dx", dx}, {"dK", dK}, {"db", db}};
    char where[128];
    std::snprintf(where, sizeof where, "bf16_conv2d B=%d %dx%dx%d K=%dx%d S=%d %s F=%d act=%d", B, H, W, C, KH, KW, S,
                  same ? "same" : "valid", F, (int)act);
    on_every_bf16_path([&](const std::string& level) {
        const auto x_ = cast<float>(x), k_ = cast<float>(kernel), b_ = cast<float>(bias), dy_ = cast<float>(dy);
        std::vector<float> y_(y.size()), z_(z.size()), dx_(dx.size()), dK_ = cast<float>(dK0), db_ = cast<float>(db0);
        bf16_conv2d_forward(y_.data(), z_.data(), x_.data(), k_.data(), b_.data(), w, F, act);
        bf16_conv2d_backward(dx_.data(), dK_.data(), db_.data(), dy_.data(), x_.data(), k_.data(), y_.data(),
                             z_.data(), w, F, act);
        // dz = dy act'(z) is rounded to bf16 before the dx and dK sums. Where a dz lies within the float
        // activation's error (< 4e-7) of a bf16 rounding tie, the kernel and the double reference may round it
        // to neighbouring bf16 values, one step (<= 2^-7 |dz|, |act'| < 1.2): in a sum that moves dx by up to
        // that step times max|K|, dK by it times max|x|. A smooth activation's sums are allowed one such step;
        // linear and relu (dz exact) are held as before.
        const std::string at = std::string(where) + " " + level;
        const bool smooth = act != Activation::linear && act != Activation::relu;
        const double dz_step = smooth ? 1.2 * max_abs(dy) / 128 : 0.0;
        compare_all({{"y", to_double(y_)}, {"z", to_double(z_)}, {"db", to_double(db_)}}, {want[0], want[1], want[4]},
                    kBf16SumTolerance, at);
        expect_near(dx_, want[2].second, kBf16SumTolerance + dz_step * max_abs(kernel), at + " dx");
        expect_near(dK_, want[3].second, kBf16SumTolerance + dz_step * max_abs(x), at + " dK");
    });
}


// sdpa_forward / sdpa_backward with bf16 against reference::bf16_sdpa_*. The weights (a float32 softmax of
// float32 sums) are held to the reference's; the context and the gradients are checked from the kernel's own
// weights, as the reference rounds weights * keep to bf16 too (keep 0 or 2, rate 0.5: the product is exact in
// float, so both round the same value). dscores (a float32 softmax backward) is rounded to bf16 before the dq
// and dk sums: where one lies within float32's error of a bf16 tie, the kernel and the double reference round
// it to neighbouring bf16 values, one step (<= 2^-7 |dscores|), which moves dq by that times |k| (dk: |q|).
void test_sdpa(AttendShape sh, bool full_mask, bool causal, bool dropout, bool with_dweights, unsigned seed) {
    std::mt19937 rng(seed);
    const AttendSizes sizes(sh);
    const size_t nq = sizes.query, nk = sizes.key, nv = sizes.value, nc = sizes.context, nw = sizes.weights;
    const auto q = random_values(rng, nq), k = random_values(rng, nk), v = random_values(rng, nv);
    const auto dcontext = random_values(rng, nc), dweights = random_values(rng, nw, 0.1);
    std::vector<double> keep(nw);
    for (auto& e : keep) e = rng() % 2 ? 2.0 : 0.0;
    std::vector<uint8_t> mask_data((full_mask ? (size_t)sh.B * sh.Tq : (size_t)sh.B) * sh.S);
    for (size_t i = 0; i < mask_data.size(); ++i) mask_data[i] = i % sh.S == 0 || rng() % 4 != 0;
    AttendMask mask;
    mask.data = mask_data.data(), mask.causal = causal;
    mask.stride_b = full_mask ? (size_t)sh.Tq * sh.S : (size_t)sh.S, mask.stride_t = full_mask ? sh.S : 0;
    const double scale = 1 / std::sqrt((double)sh.Dk);
    const double* keep_p = dropout ? keep.data() : nullptr;
    const double* dweights_p = with_dweights ? dweights.data() : nullptr;
    std::vector<double> context(nc), weights(nw);
    reference::bf16_sdpa_forward(sh, context.data(), weights.data(), q.data(), k.data(), v.data(), mask, keep_p, scale);
    char where[160];
    std::snprintf(where, sizeof where, "bf16 sdpa B=%d H=%d Tq=%d S=%d Dk=%d Dv=%d%s%s%s%s", sh.B, sh.H, sh.Tq, sh.S,
                  sh.Dk, sh.Dv, full_mask ? " full mask" : " key mask", causal ? " causal" : "", dropout ? " dropout" : "",
                  with_dweights ? " dweights" : "");
    // the tolerance tells bf16 operands from float32 ones: float32's context misses the reference (over
    // thousands of keys the context's average washes the rounding out below it)
    if (sh.S >= 64 && sh.S <= 1024) {
        std::vector<double> float32_context(nc), float32_weights(nw);
        reference::sdpa_forward(sh, float32_context.data(), float32_weights.data(), q.data(), k.data(), v.data(), mask,
                                keep_p, scale);
        double worst = 0;
        for (size_t i = 0; i < nc; ++i)
            worst = std::max(worst, std::abs(float32_context[i] - context[i]) / (1 + std::abs(context[i])));
        CHECK(worst > 10 * kBf16SumTolerance);
    }
    on_every_bf16_path([&](const std::string& level) {
        const std::string at = std::string(where) + " " + level;
        const auto q_ = cast<float>(q), k_ = cast<float>(k), v_ = cast<float>(v), keep_ = cast<float>(keep);
        const auto dc_ = cast<float>(dcontext), dw_ = cast<float>(dweights);
        std::vector<float> context_(nc), weights_(nw), bare_context(nc), dq_(nq), dk_(nk), dv_(nv);
        const float* kp = dropout ? keep_.data() : nullptr;
        sdpa_forward<float>(sh, context_.data(), weights_.data(), q_.data(), k_.data(), v_.data(), mask, kp, (float)scale,
                            true);
        expect_near(weights_, weights, kBf16SumTolerance, at + " weights");
        const auto own_weights = to_double(weights_);
        std::vector<double> want_context(nc);
        reference::bf16_weighted_values(sh, want_context.data(), own_weights.data(), v.data(), keep_p);
        expect_near(context_, want_context, kBf16SumTolerance, at + " context");
        // without the weights (inference) the same context, bit for bit
        sdpa_forward<float>(sh, bare_context.data(), nullptr, q_.data(), k_.data(), v_.data(), mask, kp, (float)scale, true);
        CHECK(bare_context == context_);
        float dscale_ = 0;
        sdpa_backward<float>(sh, dq_.data(), dk_.data(), dv_.data(), &dscale_, dc_.data(),
                             with_dweights ? dw_.data() : nullptr, weights_.data(), q_.data(), k_.data(), v_.data(), kp,
                             (float)scale, true);
        std::vector<double> dq(nq), dk(nk), dv(nv), dscores(nw);
        double dscale = 0;
        reference::bf16_sdpa_backward(sh, dq.data(), dk.data(), dv.data(), &dscale, dscores.data(), dcontext.data(),
                                      dweights_p, own_weights.data(), q.data(), k.data(), v.data(), keep_p, scale);
        const double ds_step = max_abs(dscores) / 128;
        expect_near(dv_, dv, kBf16SumTolerance, at + " dv");
        expect_near(dq_, dq, kBf16SumTolerance + ds_step * scale * max_abs(k), at + " dq");
        expect_near(dk_, dk, kBf16SumTolerance + ds_step * scale * max_abs(q), at + " dk");
        expect_near(std::vector<float>{dscale_}, {dscale}, kBf16SumTolerance + ds_step * sh.Dk * max_abs(k) * max_abs(q),
                    at + " dscale");
    });
}
// A step product's left rows as bf16_step_left lays them out for AMX tiles (K2p pairs apart, zeros past
// K2 and up to a whole tile of rows: amx_step_product reads them in place), multiplied on a tile after a
// product's own AmxTileScope closed inside an outer one: scopes nest, and the inner must leave the tiles
// configured (a tile instruction on released tiles faults)
void test_step_rows_and_nested_tile_scopes() {
    if (!amx_bf16_active() || !bf16_tiles().native) return;  // the layout and the scopes are AMX's
    std::mt19937 rng(7);
    const int count = 19, K = 37, C = 6, K2 = (K + C + 1) / 2, K2p = amx_pairs_padded(K2);  // 22 pairs -> 32
    const auto h = cast<float>(random_values(rng, (size_t)count * K)), x = cast<float>(random_values(rng, (size_t)count * C));
    const uint32_t* rows = bf16_step_left(LeftRows<float>{h.data(), (size_t)K, K, x.data(), (size_t)C, C}, count);
    CHECK(bf16_step_stride(K2) == (size_t)K2p);
    auto value = [&](int r, int k) { return k < K ? h[(size_t)r * K + k] : k < K + C ? x[(size_t)r * C + k - K] : 0.0f; };
    int wrong = 0;
    for (int r = 0; r < 2 * kAmxRows; ++r)
        for (int kp = 0; kp < K2p; ++kp) {
            const uint32_t want = r < count && kp < K2 ? bf16_bits(value(r, 2 * kp)) | bf16_bits(value(r, 2 * kp + 1)) << 16 : 0u;
            wrong += rows[(size_t)r * K2p + kp] != want;
        }
    CHECK(wrong == 0);
    // 16 columns of pair rows (K2p of them, the last K2 - 16 past `whole` from a zero-padded tail)
    std::vector<uint32_t> panel((size_t)K2 * 16);
    for (auto& pair : panel) pair = bf16_bits((float)std::normal_distribution<double>()(rng)) | bf16_bits((float)std::normal_distribution<double>()(rng)) << 16;
    const int whole = K2 / kAmxPairs * kAmxPairs;
    alignas(64) uint32_t tail[kAmxPairs * 16] = {};
    std::memcpy(tail, panel.data() + (size_t)whole * 16, (size_t)(K2 - whole) * 16 * sizeof(uint32_t));
    alignas(64) float sums[kAmxRows * 16];
    {
        const AmxTileScope outer;
        std::vector<float> A(64 * 64, 1.0f), B(64 * 64, 1.0f), Cm(64 * 64);
        bf16_gemm(Cm.data(), 64, A.data(), 64, false, B.data(), 64, false, 64, 64, 64, false);  // its scope opens and closes
        amx_step_tile<1>(sums, rows, K2p, panel.data(), 16, whole, tail);
    }
    auto low = [](uint32_t pair) { return bf16_value(pair & 0xFFFFu); };
    auto high = [](uint32_t pair) { return bf16_value(pair >> 16); };
    double worst = 0;
    for (int r = 0; r < kAmxRows; ++r)
        for (int n = 0; n < 16; ++n) {
            double want = 0, size = 0;
            for (int kp = 0; kp < K2; ++kp) {
                const uint32_t a = rows[(size_t)r * K2p + kp], b = panel[(size_t)kp * 16 + n];
                want += (double)low(a) * low(b) + (double)high(a) * high(b);
                size += std::abs((double)low(a) * low(b)) + std::abs((double)high(a) * high(b));
            }
            worst = std::max(worst, std::abs(sums[r * 16 + n] - want) / (1 + size));
        }
    CHECK(worst < 1e-6);
}
}  // namespace

int main() {
    test_rounding();
    test_packing_rounds_as_bf16_bits(rounding_cases());
    test_step_rows_and_nested_tile_scopes();
    unsigned seed = 1;
    for (bool ta : {false, true})
        for (bool tb : {false, true})
            for (bool acc : {false, true}) {
                test_gemm(1, 1, 1, ta, tb, acc, seed++);
                test_gemm(7, 5, 3, ta, tb, acc, seed++);          // smaller than one tile
                test_gemm(13, 70, 65, ta, tb, acc, seed++);       // tile tails, odd K
                test_gemm(131, 67, 601, ta, tb, acc, seed++);     // past a row block and a pair block
                test_gemm(250, 130, 1100, ta, tb, acc, seed++);   // split across threads, three pair blocks
            }
    test_gemm(4, 9, 0, false, false, false, seed++);  // K = 0: zeros
    for (Activation act : {Activation::linear, Activation::relu, Activation::tanh, Activation::gelu, Activation::softmax}) {
        test_dense(37, 29, 45, act, true, seed++);
        test_dense(301, 67, 53, act, false, seed++);
        test_dense(200, 24, 700, act, true, seed++);  // the activation and the bias gradient split across threads
    }
    test_conv(2, 7, 6, 3, 3, 3, 1, true, 5, Activation::linear, seed++);     // padding on every side
    test_conv(3, 9, 8, 2, 3, 3, 2, false, 4, Activation::relu, seed++);      // strides, windows that skip pixels
    test_conv(2, 12, 12, 16, 3, 3, 1, true, 17, Activation::gelu, seed++);   // Winograd's shape in float32
    test_conv(3, 1, 40, 8, 1, 5, 1, false, 6, Activation::tanh, seed++);     // Conv1D's image (one row)
    // three groups of images (16 MiB of patches each); x small, as the kernel gradient sums 3680 rows in float32
    test_conv(230, 6, 6, 256, 3, 3, 1, false, 4, Activation::linear, seed++, 0.1);
    test_sdpa({1, 1, 1, 1, 1, 1}, false, false, false, false, seed++);      // one query, one key
    test_sdpa({2, 3, 17, 19, 16, 8}, false, false, true, true, seed++);    // smaller than one tile
    test_sdpa({1, 2, 33, 70, 24, 40}, true, true, false, true, seed++);    // full and causal mask, odd tails
    test_sdpa({2, 4, 64, 96, 32, 32}, false, false, true, false, seed++);  // problems split across threads
    test_sdpa({1, 2, 40, 2200, 32, 24}, false, false, true, true, seed++);  // blocks of query rows (sdpa_bf16_block_rows)
    test_sdpa({2, 1, 37, 2000, 8, 16}, true, true, false, false, seed++);  // the same, masked, a short last block
    return attnx::test::report("test_reference_bf16");
}
