// SimpleRNN / GRU / LSTM whole-sequence forward and backward (cells call them with T = 1).
#include <cstdint>
#include <cstring>

#include "attnx/rnn.hpp"
#include "attnx/rnn_bf16.hpp"
#include "bindings.hpp"
#include "checks.hpp"

namespace attnx::bind {

static RNNConfig rnn_config(const std::string& cell, bool reset_after, bool reverse, const std::string& activation,
                            const std::string& recurrent_activation) {
    RNNConfig cfg;
    if (cell == "simple") cfg.cell = RNNCell::simple;
    else if (cell == "gru") cfg.cell = RNNCell::gru;
    else if (cell == "lstm") cfg.cell = RNNCell::lstm;
    else throw py::value_error("rnn: unknown cell '" + cell + "'; expected simple, gru or lstm");
    cfg.reset_after = reset_after;
    cfg.reverse = reverse;
    try {
        cfg.activation = activation_from_name(activation);
        cfg.recurrent_activation = activation_from_name(recurrent_activation);
    } catch (const std::invalid_argument& e) {
        throw py::value_error(e.what());
    }
    if (!rnn_activation_ok(cfg.activation) || !rnn_activation_ok(cfg.recurrent_activation))
        throw py::value_error("rnn: activations must be tanh, sigmoid, relu or linear, got '" + activation + "', '" +
                              recurrent_activation + "'");
    return cfg;
}

template <class T> static T* optional_inout(const py::object& a, const std::vector<py::ssize_t>& shape, const char* what) {
    if (a.is_none()) return nullptr;
    py::array arr = array_arg(a, what);
    check_shape(arr, shape, what);
    return inout_ptr<T>(arr, what);
}

template <class T> static const T* optional_in(const py::object& a, const std::vector<py::ssize_t>& shape, const char* what) {
    if (a.is_none()) return nullptr;
    py::array arr = array_arg(a, what);
    check_shape(arr, shape, what);
    return in_ptr<T>(arr, what);
}

static py::object none_or(bool cond, const py::object& a) { return cond ? a : py::none(); }

void init_rnn(py::module_& m) {
    m.def(
        "rnn_forward",
        [](const std::string& cell, const py::array& x, const py::array& kernel, const py::array& recurrent_kernel,
           const py::object& bias, const py::object& recurrent_bias, const py::object& h0, const py::object& c0,
           const py::object& mask, const py::object& recurrent_mask, bool reverse, bool reset_after,
           const std::string& activation, const std::string& recurrent_activation, bool split_batch,
           bool training, bool return_sequences, bool bf16) {
            RNNConfig cfg = rnn_config(cell, reset_after, reverse, activation, recurrent_activation);
            return dispatch_float(x, "rnn_forward: x", [&](auto tag) -> py::tuple {
                using T = decltype(tag);
                check_bf16_operands(bf16, x, "rnn_forward");
                check_rank(x, 3, "rnn_forward: x");
                check_rank(recurrent_kernel, 2, "rnn_forward: recurrent_kernel");
                const py::ssize_t B = x.shape(0), Tn = x.shape(1), C = x.shape(2), H = recurrent_kernel.shape(0);
                cfg.B = (int)B, cfg.T = (int)Tn, cfg.C = (int)C, cfg.H = (int)H;
                cfg.split_batch = split_batch;
                const py::ssize_t G = cfg.G();
                if (B == 0 || Tn == 0) throw py::value_error("rnn_forward: x: empty batch or sequence, shape " + shape_str(x));
                check_shape(kernel, {C, G}, "rnn_forward: kernel");
                check_shape(recurrent_kernel, {H, G}, "rnn_forward: recurrent_kernel");
                const bool lstm = cfg.cell == RNNCell::lstm, gru = cfg.cell == RNNCell::gru;
                const T* px = in_ptr<T>(x, "rnn_forward: x");
                const T* pw = in_ptr<T>(kernel, "rnn_forward: kernel");
                const T* pu = in_ptr<T>(recurrent_kernel, "rnn_forward: recurrent_kernel");
                const T* pb = optional_in<T>(bias, {G}, "rnn_forward: bias");
                if (!recurrent_bias.is_none() && !(gru && reset_after))
                    throw py::value_error("rnn_forward: recurrent_bias is only used by GRU with reset_after=True");
                const T* pbr = optional_in<T>(recurrent_bias, {G}, "rnn_forward: recurrent_bias");
                const T* ph0 = optional_in<T>(h0, {B, H}, "rnn_forward: initial h");
                if (!c0.is_none() && !lstm) throw py::value_error("rnn_forward: c0 is only used by LSTM");
                const T* pc0 = optional_in<T>(c0, {B, H}, "rnn_forward: initial c");
                const MaskRows mask_rows = parse_position_mask(mask, B, Tn, "rnn_forward", "mask");
                const uint8_t* pm = mask_rows.data;
                const T* prm = optional_in<T>(recurrent_mask, {B, H}, "rnn_forward: recurrent_mask");

                py::array_t<T> y = return_sequences ? new_array<T>({B, Tn, H}) : new_array<T>({0});
                auto h = new_array<T>({B, H});
                py::array_t<T> c = lstm ? new_array<T>({B, H}) : new_array<T>({0});
                auto gates = new_array<T>({B, Tn, G});
                // inference keeps nothing for backward: no h_prev, c_prev
                py::array_t<T> h_prev = training ? new_array<T>({B, Tn, H}) : new_array<T>({0});
                py::array_t<T> h_rec = prm ? new_array<T>({B, Tn, H}) : new_array<T>({0});
                const bool keep_c = lstm && training;
                py::array_t<T> c_prev = keep_c ? new_array<T>({B, Tn, H}) : new_array<T>({0});
                py::array_t<T> aux = cfg.cell != RNNCell::simple ? new_array<T>({B, Tn, H}) : new_array<T>({0});
                auto hu = new_array<T>({B, G});
                RNNCache<T> cache;
                cache.gates = gates.mutable_data();
                cache.h_prev = training ? h_prev.mutable_data() : nullptr;
                cache.h_rec = prm ? h_rec.mutable_data() : nullptr;
                cache.c_prev = keep_c ? c_prev.mutable_data() : nullptr;
                cache.aux = cfg.cell != RNNCell::simple ? aux.mutable_data() : nullptr;
                T* py_ = return_sequences ? y.mutable_data() : nullptr;
                T* ph = h.mutable_data();
                T* pc = lstm ? c.mutable_data() : nullptr;
                T* phu = hu.mutable_data();
                {
                    py::gil_scoped_release release;
                    const size_t n = (size_t)B * H;
                    if (ph0) std::copy(ph0, ph0 + n, ph); else std::fill(ph, ph + n, T(0));
                    if (pc) {
                        if (pc0) std::copy(pc0, pc0 + n, pc); else std::fill(pc, pc + n, T(0));
                    }
                    rnn_forward_products<T>(bf16, cfg, py_, ph, pc, cache, px, pw, pu, pb, pbr, pm, prm, phu);
                }
                py::tuple cache_t = py::make_tuple(gates, none_or(training, h_prev), none_or(prm, h_rec), none_or(keep_c, c_prev),
                                                   none_or(cfg.cell != RNNCell::simple, aux));
                return py::make_tuple(none_or(return_sequences, y), h, none_or(lstm, c), cache_t);
            });
        },
        py::arg("cell"), py::arg("x"), py::arg("kernel"), py::arg("recurrent_kernel"), py::arg("bias"),
        py::arg("recurrent_bias"), py::arg("h0"), py::arg("c0"), py::arg("mask"), py::arg("recurrent_mask"),
        py::arg("reverse") = false, py::arg("reset_after") = true, py::arg("activation") = "tanh",
        py::arg("recurrent_activation") = "sigmoid", py::arg("split_batch") = true,
        py::arg("training") = true, py::arg("return_sequences") = true, py::arg("bf16") = false,
        "Runs a SimpleRNN ('simple'), GRU or LSTM over x (B, T, C). Returns (y (B, T, H), h (B, H), c (B, H) or "
        "None, cache) where cache = (gates, h_prev, h_rec, c_prev, aux) is what rnn_backward needs. "
        "training=False keeps nothing for backward (h_prev, c_prev are None); "
        "return_sequences=False computes no y (returned as None); bf16=True runs the input projection and the steps' h_rec . U in bfloat16 (float32 sums).");

    m.def(
        "rnn_backward",
        [](const std::string& cell, const py::array& x, const py::array& kernel, const py::array& recurrent_kernel,
           const py::tuple& cache_t, const py::object& mask, const py::object& recurrent_mask, const py::object& dy,
           const py::object& dh, const py::object& dc, py::array& dkernel, py::array& drecurrent_kernel,
           const py::object& dbias, const py::object& drecurrent_bias, bool reverse, bool reset_after,
           const std::string& activation, const std::string& recurrent_activation, bool need_dx, bool split_batch,
           bool bf16) {
            RNNConfig cfg = rnn_config(cell, reset_after, reverse, activation, recurrent_activation);
            return dispatch_float(x, "rnn_backward: x", [&](auto tag) -> py::tuple {
                using T = decltype(tag);
                check_bf16_operands(bf16, x, "rnn_backward");
                check_rank(x, 3, "rnn_backward: x");
                check_rank(recurrent_kernel, 2, "rnn_backward: recurrent_kernel");
                const py::ssize_t B = x.shape(0), Tn = x.shape(1), C = x.shape(2), H = recurrent_kernel.shape(0);
                cfg.B = (int)B, cfg.T = (int)Tn, cfg.C = (int)C, cfg.H = (int)H;
                cfg.split_batch = split_batch;
                const py::ssize_t G = cfg.G();
                const bool lstm = cfg.cell == RNNCell::lstm, gru_after = cfg.cell == RNNCell::gru && reset_after;
                check_shape(kernel, {C, G}, "rnn_backward: kernel");
                check_shape(recurrent_kernel, {H, G}, "rnn_backward: recurrent_kernel");
                check_shape(dkernel, {C, G}, "rnn_backward: dkernel");
                check_shape(drecurrent_kernel, {H, G}, "rnn_backward: drecurrent_kernel");
                if (cache_t.size() != 5) throw py::value_error("rnn_backward: cache must be the 5-tuple rnn_forward returned");
                const T* prm = optional_in<T>(recurrent_mask, {B, H}, "rnn_backward: recurrent_mask");
                RNNCache<T> cache;
                auto cache_arr = [&](int i, bool used, const char* what) -> T* {
                    if (!used) return nullptr;
                    if (cache_t[i].is_none()) throw py::value_error(std::string(what) + ": missing from the cache");
                    py::array a = array_arg(cache_t[i], what);
                    check_shape(a, {B, Tn, i == 0 ? G : H}, what);
                    return inout_ptr<T>(a, what);
                };
                cache.gates = cache_arr(0, true, "rnn_backward: cache gates");
                cache.h_prev = cache_arr(1, true, "rnn_backward: cache h_prev");
                cache.h_rec = cache_arr(2, prm != nullptr, "rnn_backward: cache h_rec");
                cache.c_prev = cache_arr(3, lstm, "rnn_backward: cache c_prev");
                cache.aux = cache_arr(4, cfg.cell != RNNCell::simple, "rnn_backward: cache aux");
                const T* px = in_ptr<T>(x, "rnn_backward: x");
                const T* pw = in_ptr<T>(kernel, "rnn_backward: kernel");
                const T* pu = in_ptr<T>(recurrent_kernel, "rnn_backward: recurrent_kernel");
                const MaskRows mask_rows = parse_position_mask(mask, B, Tn, "rnn_backward", "mask");
                const uint8_t* pm = mask_rows.data;
                const T* pdy = optional_in<T>(dy, {B, Tn, H}, "rnn_backward: dy");
                const T* pdh_in = optional_in<T>(dh, {B, H}, "rnn_backward: dh");
                const T* pdc_in = optional_in<T>(dc, {B, H}, "rnn_backward: dc");
                T* pdw = inout_ptr<T>(dkernel, "rnn_backward: dkernel");
                T* pdu = inout_ptr<T>(drecurrent_kernel, "rnn_backward: drecurrent_kernel");
                T* pdb = optional_inout<T>(dbias, {G}, "rnn_backward: dbias");
                if (!drecurrent_bias.is_none() && !gru_after)
                    throw py::value_error("rnn_backward: drecurrent_bias is only used by GRU with reset_after=True");
                T* pdbr = optional_inout<T>(drecurrent_bias, {G}, "rnn_backward: drecurrent_bias");

                py::array_t<T> dx = need_dx ? new_array<T>({B, Tn, C}) : new_array<T>({0});
                auto dh0 = new_array<T>({B, H});
                py::array_t<T> dc0 = lstm ? new_array<T>({B, H}) : new_array<T>({0});
                auto dgates = new_array<T>({B, Tn, G});
                // only GRU reset_after has a recurrent pre-activation gradient unlike the input one
                py::array_t<T> dhu = gru_after ? new_array<T>({B, Tn, G}) : dgates;
                auto dhrec = new_array<T>({B, H});
                T* pdx = need_dx ? dx.mutable_data() : nullptr;
                T* pdh = dh0.mutable_data();
                T* pdc = lstm ? dc0.mutable_data() : nullptr;
                T* pdg = dgates.mutable_data();
                T* pdhu = dhu.mutable_data();
                T* pdhrec = dhrec.mutable_data();
                {
                    py::gil_scoped_release release;
                    const size_t n = (size_t)B * H;
                    if (pdh_in) std::copy(pdh_in, pdh_in + n, pdh); else std::fill(pdh, pdh + n, T(0));
                    if (pdc) {
                        if (pdc_in) std::copy(pdc_in, pdc_in + n, pdc); else std::fill(pdc, pdc + n, T(0));
                    }
                    rnn_backward_products<T>(bf16, cfg, pdx, pdw, pdu, pdb, pdbr, pdh, pdc, pdy, cache, px, pw, pu, pm,
                                             prm, pdg, pdhu, pdhrec);
                }
                return py::make_tuple(none_or(need_dx, dx), dh0, none_or(lstm, dc0));
            });
        },
        py::arg("cell"), py::arg("x"), py::arg("kernel"), py::arg("recurrent_kernel"), py::arg("cache"),
        py::arg("mask"), py::arg("recurrent_mask"), py::arg("dy"), py::arg("dh"), py::arg("dc"), py::arg("dkernel"),
        py::arg("drecurrent_kernel"), py::arg("dbias"), py::arg("drecurrent_bias"), py::arg("reverse") = false,
        py::arg("reset_after") = true, py::arg("activation") = "tanh", py::arg("recurrent_activation") = "sigmoid",
        py::arg("need_dx") = true, py::arg("split_batch") = true, py::arg("bf16") = false,
        "Backpropagation through time of rnn_forward: accumulates into dkernel, drecurrent_kernel, dbias, "
        "drecurrent_bias; returns (dx or None, dh0, dc0 or None). dy (B, T, H), dh / dc (B, H) may be None. "
        "bf16=True runs the steps' dgates . U^T, dx, dkernel and drecurrent_kernel in bfloat16 (float32 sums).");
}

}  // namespace attnx::bind
