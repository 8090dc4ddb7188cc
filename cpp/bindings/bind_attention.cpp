// Attention scores, masked softmax, context (scaled dot-product core, general, additive/concat,
// local window) and attention pooling.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>

#include "attnx/attention.hpp"
#include "attnx/pooling.hpp"
#include "bindings.hpp"
#include "checks.hpp"

namespace attnx::bind {

// The kernels' view of a mask parsed by parse_mask (checks.hpp), with the causal limit.
static AttendMask attend_mask(const MaskRows& rows, bool causal) {
    AttendMask out;
    out.data = rows.data;
    out.stride_b = rows.stride_b;
    out.stride_t = rows.stride_t;
    out.causal = causal;
    return out;
}

// Sizes of the (B, T, H * D) operands of the scaled dot-product core.
struct SdpaDims {
    py::ssize_t B, H, Tq, S, Dk, Dv;
    AttendShape shape() const { return {(int)B, (int)H, (int)Tq, (int)S, (int)Dk, (int)Dv}; }
};

static SdpaDims sdpa_dims(const py::array& q, const py::array& k, const py::array& v, int heads, const char* fn) {
    const std::string f(fn);
    if (heads < 1) throw py::value_error(f + ": heads must be positive, got " + std::to_string(heads));
    check_rank(q, 3, (f + ": query").c_str());
    check_rank(k, 3, (f + ": key").c_str());
    check_rank(v, 3, (f + ": value").c_str());
    const py::ssize_t B = q.shape(0), Tq = q.shape(1), S = k.shape(1);
    check_shape(k, {B, -1, q.shape(2)}, (f + ": key (batch and size must match the query's)").c_str());
    check_shape(v, {B, S, -1}, (f + ": value (batch and length must match the key's)").c_str());
    if (q.shape(2) % heads || v.shape(2) % heads)
        throw py::value_error(f + ": query size " + std::to_string(q.shape(2)) + " and value size " +
                              std::to_string(v.shape(2)) + " must be divisible by heads=" + std::to_string(heads));
    return {B, heads, Tq, S, q.shape(2) / heads, v.shape(2) / heads};
}

// Sizes from scores (B, H, Tq, S) and value (B, S, H * Dv).
static SdpaDims scores_dims(const py::array& scores, const py::array& value, const char* fn) {
    const std::string f(fn);
    check_rank(scores, 4, (f + ": scores").c_str());
    check_rank(value, 3, (f + ": value").c_str());
    const py::ssize_t B = scores.shape(0), H = scores.shape(1);
    check_shape(value, {B, scores.shape(3), -1}, (f + ": value (batch and length must match the scores')").c_str());
    if (H < 1 || value.shape(2) % H)
        throw py::value_error(f + ": value size " + std::to_string(value.shape(2)) + " must be divisible by heads=" +
                              std::to_string(H));
    return {B, H, scores.shape(2), scores.shape(3), 0, value.shape(2) / H};
}

template <class T> static const T* optional_block(const py::object& a, const SdpaDims& d, const std::string& what) {
    if (a.is_none()) return nullptr;
    py::array arr = array_arg(a, what.c_str());
    check_shape(arr, {d.B, d.H, d.Tq, d.S}, what.c_str());
    return in_ptr<T>(arr, what.c_str());
}

void init_attention(py::module_& m) {
    m.def(
        "sdpa_forward",
        [](const py::array& q, const py::array& k, const py::array& v, const py::object& mask, bool causal,
           double scale, int heads, const py::object& dropout_keep, bool return_weights, bool bf16,
           const py::object& dropout_stream) {
            return dispatch_float(q, "sdpa_forward: query", [&](auto tag) -> py::tuple {
                using T = decltype(tag);
                check_bf16_operands(bf16, q, "sdpa_forward");
                const SdpaDims d = sdpa_dims(q, k, v, heads, "sdpa_forward");
                const MaskRows mask_rows = parse_mask(mask, d.B, d.Tq, d.S, "sdpa_forward", "mask");
                const AttendMask am = attend_mask(mask_rows, causal);
                const T* pq = in_ptr<T>(q, "sdpa_forward: query");
                const T* pk = in_ptr<T>(k, "sdpa_forward: key");
                const T* pv = in_ptr<T>(v, "sdpa_forward: value");
                const T* pkeep = optional_block<T>(dropout_keep, d, "sdpa_forward: dropout_keep");
                const KeepStream drawn = keep_stream(dropout_stream, dropout_keep, "sdpa_forward");
                auto context = new_array<T>({d.B, d.Tq, d.H * d.Dv});
                py::object weights = py::none();
                T* pw = nullptr;
                if (return_weights) {
                    auto w = new_array<T>({d.B, d.H, d.Tq, d.S});
                    pw = w.mutable_data();
                    weights = std::move(w);
                }
                T* pc = context.mutable_data();
                {
                    py::gil_scoped_release release;
                    sdpa_forward<T>(d.shape(), pc, pw, pq, pk, pv, am, pkeep, T(scale), bf16, drawn);
                }
                return py::make_tuple(context, weights);
            });
        },
        py::arg("query"), py::arg("key"), py::arg("value"), py::arg("mask") = py::none(), py::arg("causal") = false,
        py::arg("scale") = 1.0, py::arg("heads") = 1, py::arg("dropout_keep") = py::none(),
        py::arg("return_weights") = true, py::arg("bf16") = false, py::arg("dropout_stream") = py::none(),
        "Scaled dot-product attention over H heads. query (B, Tq, H*Dk), key (B, S, H*Dk), value (B, S, H*Dv); "
        "mask None, (B, S) key padding or (B, Tq, S) (leading axis 1: shared by the batch), True = may attend; "
        "causal limits query t to keys s <= t; dropout_keep (B, H, Tq, S) scaled keep mask or None. "
        "Returns (context (B, Tq, H*Dv), weights (B, H, Tq, S)); fully masked rows give zero weights and context. "
        "return_weights=False returns (context, None) without ever writing the weights (inference). bf16=True "
        "(mixed_bfloat16, float32 arrays): both products on operands rounded to bf16, sums in float32. "
        "dropout_stream (rate, key, first_row): the keep mask random_keep(shape=(B, H, Tq, S), ...) would give, "
        "drawn as the kernel uses it, in place of dropout_keep.");

    m.def(
        "sdpa_backward",
        [](const py::array& dcontext, const py::array& weights, const py::array& q, const py::array& k,
           const py::array& v, double scale, int heads, const py::object& dweights, const py::object& dropout_keep,
           const py::object& dscale, bool bf16, const py::object& dropout_stream) {
            return dispatch_float(q, "sdpa_backward: query", [&](auto tag) -> py::tuple {
                using T = decltype(tag);
                check_bf16_operands(bf16, q, "sdpa_backward");
                const SdpaDims d = sdpa_dims(q, k, v, heads, "sdpa_backward");
                check_shape(dcontext, {d.B, d.Tq, d.H * d.Dv}, "sdpa_backward: dcontext");
                check_shape(weights, {d.B, d.H, d.Tq, d.S}, "sdpa_backward: weights");
                const T* pdc = in_ptr<T>(dcontext, "sdpa_backward: dcontext");
                const T* pw = in_ptr<T>(weights, "sdpa_backward: weights");
                const T* pq = in_ptr<T>(q, "sdpa_backward: query");
                const T* pk = in_ptr<T>(k, "sdpa_backward: key");
                const T* pv = in_ptr<T>(v, "sdpa_backward: value");
                const T* pdw = optional_block<T>(dweights, d, "sdpa_backward: dweights");
                const T* pkeep = optional_block<T>(dropout_keep, d, "sdpa_backward: dropout_keep");
                const KeepStream drawn = keep_stream(dropout_stream, dropout_keep, "sdpa_backward");
                T* pds = optional_inout_ptr<T>(dscale, {1}, "sdpa_backward: dscale");
                auto dq = new_array<T>({d.B, d.Tq, d.H * d.Dk});
                auto dk = new_array<T>({d.B, d.S, d.H * d.Dk});
                auto dv = new_array<T>({d.B, d.S, d.H * d.Dv});
                T* pdq = dq.mutable_data();
                T* pdk = dk.mutable_data();
                T* pdv = dv.mutable_data();
                {
                    py::gil_scoped_release release;
                    sdpa_backward<T>(d.shape(), pdq, pdk, pdv, pds, pdc, pdw, pw, pq, pk, pv, pkeep, T(scale), bf16, drawn);
                }
                return py::make_tuple(dq, dk, dv);
            });
        },
        py::arg("dcontext"), py::arg("weights"), py::arg("query"), py::arg("key"), py::arg("value"),
        py::arg("scale") = 1.0, py::arg("heads") = 1, py::arg("dweights") = py::none(),
        py::arg("dropout_keep") = py::none(), py::arg("dscale") = py::none(), py::arg("bf16") = false,
        py::arg("dropout_stream") = py::none(),
        "Backward of sdpa_forward (bf16 and dropout_stream as there): returns (dquery, dkey, dvalue). dweights (B, H, Tq, S) is the gradient into the "
        "returned weights (or None); dscale, a (1,) array, accumulates the gradient of a learned scale.");
    m.def(
        "softmax_context_forward",
        [](const py::array& scores, const py::array& value, const py::object& mask, bool causal,
           const py::object& dropout_keep) {
            return dispatch_float(scores, "softmax_context_forward: scores", [&](auto tag) -> py::tuple {
                using T = decltype(tag);
                const SdpaDims d = scores_dims(scores, value, "softmax_context_forward");
                const MaskRows mask_rows = parse_mask(mask, d.B, d.Tq, d.S, "softmax_context_forward", "mask");
                const AttendMask am = attend_mask(mask_rows, causal);
                const T* pv = in_ptr<T>(value, "softmax_context_forward: value");
                const T* pkeep = optional_block<T>(dropout_keep, d, "softmax_context_forward: dropout_keep");
                const T* ps = in_ptr<T>(scores, "softmax_context_forward: scores");
                auto weights = new_array<T>({d.B, d.H, d.Tq, d.S});
                auto context = new_array<T>({d.B, d.Tq, d.H * d.Dv});
                T* pc = context.mutable_data();
                T* pw = weights.mutable_data();
                {
                    py::gil_scoped_release release;
                    std::copy(ps, ps + weights.size(), pw);  // the kernel turns scores into weights in place
                    softmax_context_forward<T>(d.shape(), pc, pw, pv, am, pkeep);
                }
                return py::make_tuple(context, weights);
            });
        },
        py::arg("scores"), py::arg("value"), py::arg("mask") = py::none(), py::arg("causal") = false,
        py::arg("dropout_keep") = py::none(),
        "Masked softmax over source positions and context from any scores (B, H, Tq, S), value (B, S, H*Dv). "
        "Returns (context (B, Tq, H*Dv), weights (B, H, Tq, S)).");

    m.def(
        "softmax_context_backward",
        [](const py::array& dcontext, const py::array& weights, const py::array& value, const py::object& dweights,
           const py::object& dropout_keep, bool need_dkeep) {
            return dispatch_float(weights, "softmax_context_backward: weights", [&](auto tag) -> py::tuple {
                using T = decltype(tag);
                const SdpaDims d = scores_dims(weights, value, "softmax_context_backward");
                check_shape(dcontext, {d.B, d.Tq, d.H * d.Dv}, "softmax_context_backward: dcontext");
                const T* pdc = in_ptr<T>(dcontext, "softmax_context_backward: dcontext");
                const T* pw = in_ptr<T>(weights, "softmax_context_backward: weights");
                const T* pv = in_ptr<T>(value, "softmax_context_backward: value");
                const T* pdw = optional_block<T>(dweights, d, "softmax_context_backward: dweights");
                const T* pkeep = optional_block<T>(dropout_keep, d, "softmax_context_backward: dropout_keep");
                auto dscores = new_array<T>({d.B, d.H, d.Tq, d.S});
                auto dvalue = new_array<T>({d.B, d.S, d.H * d.Dv});
                if (need_dkeep && !pkeep)
                    throw py::value_error("softmax_context_backward: need_dkeep requires dropout_keep");
                py::object dkeep = py::none();
                T* pdk = nullptr;
                if (need_dkeep) {
                    auto arr = new_array<T>({d.B, d.H, d.Tq, d.S});
                    pdk = arr.mutable_data();
                    dkeep = arr;
                }
                T* pds = dscores.mutable_data();
                T* pdv = dvalue.mutable_data();
                {
                    py::gil_scoped_release release;
                    softmax_context_backward<T>(d.shape(), pds, pdv, pdk, pdc, pdw, pw, pv, pkeep);
                }
                return py::make_tuple(dscores, dvalue, dkeep);
            });
        },
        py::arg("dcontext"), py::arg("weights"), py::arg("value"), py::arg("dweights") = py::none(),
        py::arg("dropout_keep") = py::none(), py::arg("need_dkeep") = false,
        "Backward of softmax_context_forward: returns (dscores, dvalue, dkeep), dkeep the gradient of the "
        "multiplier dropout_keep when need_dkeep (else None).");
    m.def(
        "additive_scores_forward",
        [](const py::array& pq, const py::array& pk, const py::array& v) {
            return dispatch_float(pq, "additive_scores_forward: pq", [&](auto tag) -> py::tuple {
                using T = decltype(tag);
                check_rank(pq, 3, "additive_scores_forward: pq");
                const py::ssize_t B = pq.shape(0), Tq = pq.shape(1), U = pq.shape(2);
                check_shape(pk, {B, -1, U}, "additive_scores_forward: pk");
                check_shape(v, {U}, "additive_scores_forward: v");
                const py::ssize_t S = pk.shape(1);
                const T* ppq = in_ptr<T>(pq, "additive_scores_forward: pq");
                const T* ppk = in_ptr<T>(pk, "additive_scores_forward: pk");
                const T* pv = in_ptr<T>(v, "additive_scores_forward: v");
                auto scores = new_array<T>({B, Tq, S});
                auto hidden = new_array<T>({B, Tq, S, U});
                T* ps = scores.mutable_data();
                T* ph = hidden.mutable_data();
                {
                    py::gil_scoped_release release;
                    additive_scores_forward<T>(ps, ph, ppq, ppk, pv, (int)B, (int)Tq, (int)S, (int)U);
                }
                return py::make_tuple(scores, hidden);
            });
        },
        py::arg("pq"), py::arg("pk"), py::arg("v"),
        "scores[b, t, s] = v . tanh(pq[b, t] + pk[b, s]) for projected queries pq (B, Tq, U) and keys pk (B, S, U). "
        "Returns (scores (B, Tq, S), hidden (B, Tq, S, U) the tanh values backward needs).");

    m.def(
        "additive_scores_backward",
        [](const py::array& dscores, const py::array& hidden, const py::array& v, py::array& dv) {
            return dispatch_float(hidden, "additive_scores_backward: hidden", [&](auto tag) -> py::tuple {
                using T = decltype(tag);
                check_rank(hidden, 4, "additive_scores_backward: hidden");
                const py::ssize_t B = hidden.shape(0), Tq = hidden.shape(1), S = hidden.shape(2), U = hidden.shape(3);
                check_shape(dscores, {B, Tq, S}, "additive_scores_backward: dscores");
                check_shape(v, {U}, "additive_scores_backward: v");
                check_shape(dv, {U}, "additive_scores_backward: dv");
                const T* pds = in_ptr<T>(dscores, "additive_scores_backward: dscores");
                const T* ph = in_ptr<T>(hidden, "additive_scores_backward: hidden");
                const T* pv = in_ptr<T>(v, "additive_scores_backward: v");
                T* pdv = inout_ptr<T>(dv, "additive_scores_backward: dv");
                auto dpq = new_array<T>({B, Tq, U});
                auto dpk = new_array<T>({B, S, U});
                T* pdpq = dpq.mutable_data();
                T* pdpk = dpk.mutable_data();
                {
                    py::gil_scoped_release release;
                    additive_scores_backward<T>(pdpq, pdpk, pdv, pds, ph, pv, (int)B, (int)Tq, (int)S, (int)U);
                }
                return py::make_tuple(dpq, dpk);
            });
        },
        py::arg("dscores"), py::arg("hidden"), py::arg("v"), py::arg("dv"),
        "Backward of additive_scores_forward: returns (dpq, dpk) and accumulates into dv.");
    m.def(
        "dot_scores_forward",
        [](const py::array& q, const py::array& k, double scale) {
            return dispatch_float(q, "dot_scores_forward: query", [&](auto tag) -> py::array {
                using T = decltype(tag);
                check_rank(q, 3, "dot_scores_forward: query");
                const py::ssize_t B = q.shape(0), Tq = q.shape(1), Dk = q.shape(2);
                check_shape(k, {B, -1, Dk}, "dot_scores_forward: key (batch and size must match the query's)");
                const py::ssize_t S = k.shape(1);
                const T* pq = in_ptr<T>(q, "dot_scores_forward: query");
                const T* pk = in_ptr<T>(k, "dot_scores_forward: key");
                return released_result<T>({B, Tq, S}, [&](T* ps) {
                    dot_scores_forward<T>(AttendShape{(int)B, 1, (int)Tq, (int)S, (int)Dk, 0}, ps, pq, pk, T(scale));
                });
            });
        },
        py::arg("query"), py::arg("key"), py::arg("scale") = 1.0,
        "scores = scale * query . key^T for query (B, Tq, D), key (B, S, D); returns (B, Tq, S).");

    m.def(
        "dot_scores_backward",
        [](const py::array& dscores, const py::array& q, const py::array& k, double scale, const py::object& dscale) {
            return dispatch_float(q, "dot_scores_backward: query", [&](auto tag) -> py::tuple {
                using T = decltype(tag);
                check_rank(q, 3, "dot_scores_backward: query");
                const py::ssize_t B = q.shape(0), Tq = q.shape(1), Dk = q.shape(2);
                check_shape(k, {B, -1, Dk}, "dot_scores_backward: key");
                const py::ssize_t S = k.shape(1);
                check_shape(dscores, {B, Tq, S}, "dot_scores_backward: dscores");
                const T* pds = in_ptr<T>(dscores, "dot_scores_backward: dscores");
                const T* pq = in_ptr<T>(q, "dot_scores_backward: query");
                const T* pk = in_ptr<T>(k, "dot_scores_backward: key");
                T* pdscale = optional_inout_ptr<T>(dscale, {1}, "dot_scores_backward: dscale");
                auto dq = new_array<T>({B, Tq, Dk});
                auto dk = new_array<T>({B, S, Dk});
                T* pdq = dq.mutable_data();
                T* pdk = dk.mutable_data();
                {
                    py::gil_scoped_release release;
                    dot_scores_backward<T>(AttendShape{(int)B, 1, (int)Tq, (int)S, (int)Dk, 0}, pdq, pdk, pdscale, pds,
                                           pq, pk, T(scale));
                }
                return py::make_tuple(dq, dk);
            });
        },
        py::arg("dscores"), py::arg("query"), py::arg("key"), py::arg("scale") = 1.0, py::arg("dscale") = py::none(),
        "Backward of dot_scores_forward: returns (dquery, dkey); dscale, a (1,) array, accumulates the gradient of "
        "the scale.");

    m.def(
        "local_window_forward",
        [](const py::array& positions, int source_len, int window, const py::object& source_mask) {
            return dispatch_float(positions, "local_window_forward: positions", [&](auto tag) -> py::tuple {
                using T = decltype(tag);
                if (window < 0)
                    throw py::value_error("local_window_forward: window D must be >= 0, got " + std::to_string(window));
                check_rank(positions, 2, "local_window_forward: positions");
                const py::ssize_t B = positions.shape(0), Tq = positions.shape(1), S = source_len;
                const MaskRows source_rows = parse_position_mask(source_mask, B, S, "local_window_forward", "source_mask");
                const uint8_t* pm = source_rows.data;
                const T* pp = in_ptr<T>(positions, "local_window_forward: positions");
                py::array_t<bool> allowed({B, Tq, S});
                auto gauss = new_array<T>({B, 1, Tq, S});
                uint8_t* pa = reinterpret_cast<uint8_t*>(allowed.mutable_data());
                T* pg = gauss.mutable_data();
                {
                    py::gil_scoped_release release;
                    local_window_forward<T>(pa, pg, pp, pm, (int)B, (int)Tq, (int)S, window);
                }
                return py::make_tuple(allowed, gauss);
            });
        },
        py::arg("positions"), py::arg("source_len"), py::arg("window"), py::arg("source_mask") = py::none(),
        "Local attention window around positions p (B, Tq) of half-width D: returns (allowed (B, Tq, S) bool, "
        "gauss (B, 1, Tq, S) = exp(-(s - p)^2 / (2 (D/2)^2)) inside the window, 0 outside).");

    m.def(
        "local_window_backward",
        [](const py::array& dgauss, const py::array& gauss, const py::array& positions, int window) {
            return dispatch_float(positions, "local_window_backward: positions", [&](auto tag) -> py::array {
                using T = decltype(tag);
                check_rank(positions, 2, "local_window_backward: positions");
                const py::ssize_t B = positions.shape(0), Tq = positions.shape(1);
                check_rank(gauss, 4, "local_window_backward: gauss");
                const py::ssize_t S = gauss.shape(3);
                check_shape(gauss, {B, 1, Tq, S}, "local_window_backward: gauss");
                check_shape(dgauss, {B, 1, Tq, S}, "local_window_backward: dgauss");
                const T* pdg = in_ptr<T>(dgauss, "local_window_backward: dgauss");
                const T* pg = in_ptr<T>(gauss, "local_window_backward: gauss");
                const T* pp = in_ptr<T>(positions, "local_window_backward: positions");
                return released_result<T>({B, Tq}, [&](T* pdp) {
                    local_window_backward<T>(pdp, pdg, pg, pp, (int)B, (int)Tq, (int)S, window);
                });
            });
        },
        py::arg("dgauss"), py::arg("gauss"), py::arg("positions"), py::arg("window"),
        "Backward of the Gaussian factor: returns d loss / d positions (B, Tq).");
    m.def(
        "attention_pooling_forward",
        [](const py::array& x, const py::array& kernel, const py::array& bias, const py::object& mask,
           bool return_sequences) {
            return dispatch_float(x, "attention_pooling_forward: x", [&](auto tag) -> py::tuple {
                using T = decltype(tag);
                check_rank(x, 3, "attention_pooling_forward: x");
                const py::ssize_t B = x.shape(0), Tn = x.shape(1), C = x.shape(2);
                check_shape(kernel, {C, 1}, "attention_pooling_forward: kernel");
                if (!(bias.size() == 1 || bias.size() == Tn) || bias.ndim() != 2 || bias.shape(1) != 1)
                    throw py::value_error("attention_pooling_forward: bias expected shape (" + std::to_string(Tn) +
                                          ", 1) or (1, 1), got " + shape_str(bias));
                const MaskRows mask_rows = parse_position_mask(mask, B, Tn, "attention_pooling_forward", "mask");
                const uint8_t* pm = mask_rows.data;
                const T* px = in_ptr<T>(x, "attention_pooling_forward: x");
                const T* pw = in_ptr<T>(kernel, "attention_pooling_forward: kernel");
                const T* pb = in_ptr<T>(bias, "attention_pooling_forward: bias");
                const PoolingConfig cfg{(int)B, (int)Tn, (int)C, bias.shape(0) == Tn && Tn != 1, return_sequences};
                auto out = return_sequences ? new_array<T>({B, Tn, C}) : new_array<T>({B, C});
                auto weights = new_array<T>({B, Tn});
                auto energy = new_array<T>({B, Tn});
                T* po = out.mutable_data();
                T* pa = weights.mutable_data();
                T* pe = energy.mutable_data();
                {
                    py::gil_scoped_release release;
                    attention_pooling_forward<T>(cfg, po, pa, pe, px, pw, pb, pm);
                }
                return py::make_tuple(out, weights, energy);
            });
        },
        py::arg("x"), py::arg("kernel"), py::arg("bias"), py::arg("mask") = py::none(),
        py::arg("return_sequences") = false,
        "e = tanh(x . kernel + bias), a = masked softmax of e over time, out = sum_t a_t x_t (or a * x). x (B, T, C), "
        "kernel (C, 1), bias (T, 1) or (1, 1). Returns (out, weights (B, T), energy (B, T)).");

    m.def(
        "attention_pooling_backward",
        [](const py::array& dout, const py::object& dweights, const py::array& weights, const py::array& energy,
           const py::array& x, const py::array& kernel, py::array& dkernel, py::array& dbias, bool return_sequences,
           bool need_dx) {
            return dispatch_float(x, "attention_pooling_backward: x", [&](auto tag) -> py::object {
                using T = decltype(tag);
                check_rank(x, 3, "attention_pooling_backward: x");
                const py::ssize_t B = x.shape(0), Tn = x.shape(1), C = x.shape(2);
                if (return_sequences) check_shape(dout, {B, Tn, C}, "attention_pooling_backward: dout");
                else check_shape(dout, {B, C}, "attention_pooling_backward: dout");
                check_shape(weights, {B, Tn}, "attention_pooling_backward: weights");
                check_shape(energy, {B, Tn}, "attention_pooling_backward: energy");
                check_shape(kernel, {C, 1}, "attention_pooling_backward: kernel");
                check_shape(dkernel, {C, 1}, "attention_pooling_backward: dkernel");
                if (!(dbias.size() == 1 || dbias.size() == Tn) || dbias.ndim() != 2 || dbias.shape(1) != 1)
                    throw py::value_error("attention_pooling_backward: dbias expected shape (" + std::to_string(Tn) +
                                          ", 1) or (1, 1), got " + shape_str(dbias));
                const T* pdw = optional_in_ptr<T>(dweights, {B, Tn}, "attention_pooling_backward: dweights");
                const T* pdo = in_ptr<T>(dout, "attention_pooling_backward: dout");
                const T* pa = in_ptr<T>(weights, "attention_pooling_backward: weights");
                const T* pe = in_ptr<T>(energy, "attention_pooling_backward: energy");
                const T* px = in_ptr<T>(x, "attention_pooling_backward: x");
                const T* pk = in_ptr<T>(kernel, "attention_pooling_backward: kernel");
                T* pdk = inout_ptr<T>(dkernel, "attention_pooling_backward: dkernel");
                T* pdb = inout_ptr<T>(dbias, "attention_pooling_backward: dbias");
                const PoolingConfig cfg{(int)B, (int)Tn, (int)C, dbias.shape(0) == Tn && Tn != 1, return_sequences};
                if (!need_dx) {
                    py::gil_scoped_release release;
                    attention_pooling_backward<T>(cfg, (T*)nullptr, pdk, pdb, pdo, pdw, pa, pe, px, pk);
                    return py::none();
                }
                return released_result<T>({B, Tn, C}, [&](T* pdx) {
                    attention_pooling_backward<T>(cfg, pdx, pdk, pdb, pdo, pdw, pa, pe, px, pk);
                });
            });
        },
        py::arg("dout"), py::arg("dweights"), py::arg("weights"), py::arg("energy"), py::arg("x"), py::arg("kernel"),
        py::arg("dkernel"), py::arg("dbias"), py::arg("return_sequences") = false, py::arg("need_dx") = true,
        "Backward of attention_pooling_forward: returns dx (None when need_dx is False) and accumulates into "
        "dkernel and dbias.");
    m.def(
        "masked_softmax_forward",
        [](const py::array& scores, const py::object& mask, bool causal) {
            return dispatch_float(scores, "masked_softmax_forward: scores", [&](auto tag) -> py::array {
                using T = decltype(tag);
                check_rank(scores, 4, "masked_softmax_forward: scores");
                const py::ssize_t B = scores.shape(0), H = scores.shape(1), Tq = scores.shape(2), S = scores.shape(3);
                const MaskRows mask_rows = parse_mask(mask, B, Tq, S, "masked_softmax_forward", "mask");
                const AttendMask am = attend_mask(mask_rows, causal);
                const T* ps = in_ptr<T>(scores, "masked_softmax_forward: scores");
                return released_result<T>({B, H, Tq, S}, [&](T* pw) {
                    masked_softmax_scores<T>(AttendShape{(int)B, (int)H, (int)Tq, (int)S, 0, 0}, pw, ps, am);
                });
            });
        },
        py::arg("scores"), py::arg("mask") = py::none(), py::arg("causal") = false,
        "Softmax over the last axis of scores (B, H, Tq, S) where mask ((B, S) or (B, Tq, S), True = may attend) "
        "allows; fully masked rows give zeros. The backward is activation_backward(..., 'softmax').");
}

}  // namespace attnx::bind
