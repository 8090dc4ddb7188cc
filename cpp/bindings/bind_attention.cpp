// Attention scores, masked softmax, context (scaled dot-product core, general, additive/concat,
// local window) and attention pooling.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "attnx/attention.hpp"
#include "bindings.hpp"
#include "checks.hpp"

namespace attnx::bind {

// A bool (or uint8) C-contiguous mask; nonzero = may attend.
static const uint8_t* mask_ptr(const py::array& m, const std::string& what) {
    const char kind = m.dtype().kind();
    if (!(kind == 'b' || m.dtype().is(py::dtype::of<uint8_t>())) || m.itemsize() != 1)
        throw py::type_error(what + ": expected a bool array, got dtype " + dtype_str(m));
    if (!(m.flags() & py::array::c_style)) throw py::value_error(what + ": expected a C-contiguous array");
    return static_cast<const uint8_t*>(m.data());
}

// mask: None, a key padding mask (B, S) or a full mask (B, Tq, S).
static AttendMask parse_mask(const py::object& mask, bool causal, py::ssize_t B, py::ssize_t Tq, py::ssize_t S,
                             const std::string& what) {
    AttendMask out;
    out.causal = causal;
    if (mask.is_none()) return out;
    py::array m = mask.cast<py::array>();
    if (m.ndim() == 2) {
        check_shape(m, {B, S}, what.c_str());
        out.stride_b = (size_t)S;
    } else {
        check_shape(m, {B, Tq, S}, what.c_str());
        out.stride_b = (size_t)(Tq * S);
        out.stride_t = (size_t)S;
    }
    out.data = mask_ptr(m, what);
    return out;
}

// Sizes of the (B, T, H * D) operands of the scaled dot-product core.
struct SdpaDims {
    py::ssize_t B, H, Tq, S, Dk, Dv;
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
    py::array arr = a.cast<py::array>();
    check_shape(arr, {d.B, d.H, d.Tq, d.S}, what.c_str());
    return in_ptr<T>(arr, what.c_str());
}

void init_attention(py::module_& m) {
    m.def(
        "sdpa_forward",
        [](const py::array& q, const py::array& k, const py::array& v, const py::object& mask, bool causal,
           double scale, int heads, const py::object& dropout_keep) {
            return dispatch_float(q, "sdpa_forward: query", [&](auto tag) -> py::tuple {
                using T = decltype(tag);
                const SdpaDims d = sdpa_dims(q, k, v, heads, "sdpa_forward");
                const AttendMask am = parse_mask(mask, causal, d.B, d.Tq, d.S, "sdpa_forward: mask");
                const T* pq = in_ptr<T>(q, "sdpa_forward: query");
                const T* pk = in_ptr<T>(k, "sdpa_forward: key");
                const T* pv = in_ptr<T>(v, "sdpa_forward: value");
                const T* pkeep = optional_block<T>(dropout_keep, d, "sdpa_forward: dropout_keep");
                auto context = new_array<T>({d.B, d.Tq, d.H * d.Dv});
                auto weights = new_array<T>({d.B, d.H, d.Tq, d.S});
                T* pc = context.mutable_data();
                T* pw = weights.mutable_data();
                {
                    py::gil_scoped_release release;
                    sdpa_forward<T>(pc, pw, pq, pk, pv, am, pkeep, (int)d.B, (int)d.H, (int)d.Tq, (int)d.S, (int)d.Dk,
                                    (int)d.Dv, T(scale));
                }
                return py::make_tuple(context, weights);
            });
        },
        py::arg("query"), py::arg("key"), py::arg("value"), py::arg("mask") = py::none(), py::arg("causal") = false,
        py::arg("scale") = 1.0, py::arg("heads") = 1, py::arg("dropout_keep") = py::none(),
        "Scaled dot-product attention over H heads. query (B, Tq, H*Dk), key (B, S, H*Dk), value (B, S, H*Dv); "
        "mask None, (B, S) key padding or (B, Tq, S), True = may attend; causal limits query t to keys s <= t; "
        "dropout_keep (B, H, Tq, S) scaled keep mask or None. Returns (context (B, Tq, H*Dv), weights (B, H, Tq, S)); "
        "fully masked rows give zero weights and context.");

    m.def(
        "sdpa_backward",
        [](const py::array& dcontext, const py::array& weights, const py::array& q, const py::array& k,
           const py::array& v, double scale, int heads, const py::object& dweights, const py::object& dropout_keep,
           const py::object& dscale) {
            return dispatch_float(q, "sdpa_backward: query", [&](auto tag) -> py::tuple {
                using T = decltype(tag);
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
                T* pds = nullptr;
                py::array dscale_arr;
                if (!dscale.is_none()) {
                    dscale_arr = dscale.cast<py::array>();
                    check_shape(dscale_arr, {1}, "sdpa_backward: dscale");
                    pds = inout_ptr<T>(dscale_arr, "sdpa_backward: dscale");
                }
                auto dq = new_array<T>({d.B, d.Tq, d.H * d.Dk});
                auto dk = new_array<T>({d.B, d.S, d.H * d.Dk});
                auto dv = new_array<T>({d.B, d.S, d.H * d.Dv});
                T* pdq = dq.mutable_data();
                T* pdk = dk.mutable_data();
                T* pdv = dv.mutable_data();
                {
                    py::gil_scoped_release release;
                    sdpa_backward<T>(pdq, pdk, pdv, pds, pdc, pdw, pw, pq, pk, pv, pkeep, (int)d.B, (int)d.H,
                                     (int)d.Tq, (int)d.S, (int)d.Dk, (int)d.Dv, T(scale));
                }
                return py::make_tuple(dq, dk, dv);
            });
        },
        py::arg("dcontext"), py::arg("weights"), py::arg("query"), py::arg("key"), py::arg("value"),
        py::arg("scale") = 1.0, py::arg("heads") = 1, py::arg("dweights") = py::none(),
        py::arg("dropout_keep") = py::none(), py::arg("dscale") = py::none(),
        "Backward of sdpa_forward: returns (dquery, dkey, dvalue). dweights (B, H, Tq, S) is the gradient into the "
        "returned weights (or None); dscale, a (1,) array, accumulates the gradient of a learned scale.");
    m.def(
        "softmax_context_forward",
        [](const py::array& scores, const py::array& value, const py::object& mask, bool causal,
           const py::object& dropout_keep) {
            return dispatch_float(scores, "softmax_context_forward: scores", [&](auto tag) -> py::tuple {
                using T = decltype(tag);
                const SdpaDims d = scores_dims(scores, value, "softmax_context_forward");
                const AttendMask am = parse_mask(mask, causal, d.B, d.Tq, d.S, "softmax_context_forward: mask");
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
                    softmax_context_forward<T>(pc, pw, pv, am, pkeep, (int)d.B, (int)d.H, (int)d.Tq, (int)d.S,
                                               (int)d.Dv);
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
           const py::object& dropout_keep) {
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
                T* pds = dscores.mutable_data();
                T* pdv = dvalue.mutable_data();
                {
                    py::gil_scoped_release release;
                    softmax_context_backward<T>(pds, pdv, pdc, pdw, pw, pv, pkeep, (int)d.B, (int)d.H, (int)d.Tq,
                                                (int)d.S, (int)d.Dv);
                }
                return py::make_tuple(dscores, dvalue);
            });
        },
        py::arg("dcontext"), py::arg("weights"), py::arg("value"), py::arg("dweights") = py::none(),
        py::arg("dropout_keep") = py::none(), "Backward of softmax_context_forward: returns (dscores, dvalue).");
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
}

}  // namespace attnx::bind
