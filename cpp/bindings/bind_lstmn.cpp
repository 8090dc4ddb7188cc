// The LSTM-Network (lstmn.hpp): whole-sequence forward and backward over the memory tape.
#include <cstdint>

#include "attnx/lstmn.hpp"
#include "bindings.hpp"
#include "checks.hpp"

namespace attnx::bind {

namespace {

constexpr int kCacheSize = 9;  // gates, h, c, summary, summary_c, summary_prev, keys, query, weights

// The sizes the weights give, checked against each other and against x (B, T, C).
template <class T>
LSTMNConfig lstmn_config(const char* fn, const py::array& x, const py::array& kernel, const py::array& recurrent_kernel,
                         const py::array& memory_kernel, const py::array& attention_input_kernel,
                         const py::array& summary_kernel, const py::array& attention_vector, bool reverse) {
    const std::string f(fn);
    check_rank(x, 3, (f + ": x").c_str());
    check_rank(recurrent_kernel, 2, (f + ": recurrent_kernel").c_str());
    check_rank(memory_kernel, 2, (f + ": memory_kernel").c_str());
    LSTMNConfig cfg;
    cfg.B = (int)x.shape(0), cfg.T = (int)x.shape(1), cfg.C = (int)x.shape(2);
    cfg.H = (int)recurrent_kernel.shape(0), cfg.A = (int)memory_kernel.shape(1);
    cfg.reverse = reverse;
    if (cfg.B == 0 || cfg.T == 0) throw py::value_error(f + ": x: empty batch or sequence, shape " + shape_str(x));
    if (cfg.H == 0 || cfg.A == 0) throw py::value_error(f + ": units and attention units must be positive");
    const py::ssize_t C = cfg.C, H = cfg.H, A = cfg.A, G = 4 * H;
    check_shape(kernel, {C, G}, (f + ": kernel").c_str());
    check_shape(recurrent_kernel, {H, G}, (f + ": recurrent_kernel").c_str());
    check_shape(memory_kernel, {H, A}, (f + ": memory_kernel").c_str());
    check_shape(attention_input_kernel, {C, A}, (f + ": attention_input_kernel").c_str());
    check_shape(summary_kernel, {H, A}, (f + ": summary_kernel").c_str());
    check_shape(attention_vector, {A}, (f + ": attention_vector").c_str());
    return cfg;
}

}  // namespace

void init_lstmn(py::module_& m) {
    m.def(
        "lstmn_forward",
        [](const py::array& x, const py::array& kernel, const py::array& recurrent_kernel, const py::object& bias,
           const py::array& memory_kernel, const py::array& attention_input_kernel, const py::array& summary_kernel,
           const py::object& attention_bias, const py::array& attention_vector, const py::object& h0,
           const py::object& c0, const py::object& mask, bool reverse, bool training) {
            return dispatch_float(x, "lstmn_forward: x", [&](auto tag) -> py::tuple {
                using T = decltype(tag);
                const LSTMNConfig cfg = lstmn_config<T>("lstmn_forward", x, kernel, recurrent_kernel, memory_kernel,
                                                        attention_input_kernel, summary_kernel, attention_vector,
                                                        reverse);
                const py::ssize_t B = cfg.B, Tn = cfg.T, H = cfg.H, A = cfg.A, G = 4 * H;
                const T* px = in_ptr<T>(x, "lstmn_forward: x");
                const T* pw = in_ptr<T>(kernel, "lstmn_forward: kernel");
                const T* pu = in_ptr<T>(recurrent_kernel, "lstmn_forward: recurrent_kernel");
                const T* pb = optional_in_ptr<T>(bias, {G}, "lstmn_forward: bias");
                const T* pwm = in_ptr<T>(memory_kernel, "lstmn_forward: memory_kernel");
                const T* pwa = in_ptr<T>(attention_input_kernel, "lstmn_forward: attention_input_kernel");
                const T* pws = in_ptr<T>(summary_kernel, "lstmn_forward: summary_kernel");
                const T* pba = optional_in_ptr<T>(attention_bias, {A}, "lstmn_forward: attention_bias");
                const T* pv = in_ptr<T>(attention_vector, "lstmn_forward: attention_vector");
                const T* ph0 = optional_in_ptr<T>(h0, {B, H}, "lstmn_forward: h0");
                const T* pc0 = optional_in_ptr<T>(c0, {B, H}, "lstmn_forward: c0");
                const MaskRows mask_rows = parse_position_mask(mask, B, Tn, "lstmn_forward", "mask");

                std::vector<py::array_t<T>> arrays;
                for (py::ssize_t width : {G, H, H, H, H, H, A, A, Tn}) arrays.push_back(new_array<T>({B, Tn, width}));
                LSTMNCache<T> cache;
                T** slots[kCacheSize] = {&cache.gates,   &cache.h,    &cache.c,     &cache.summary, &cache.summary_c,
                                         &cache.summary_prev, &cache.keys, &cache.query, &cache.weights};
                for (int i = 0; i < kCacheSize; ++i) *slots[i] = arrays[i].mutable_data();
                auto h = new_array<T>({B, H});
                auto c = new_array<T>({B, H});
                T* ph = h.mutable_data();
                T* pc = c.mutable_data();
                {
                    py::gil_scoped_release release;
                    lstmn_forward<T>(cfg, ph, pc, cache, px, pw, pu, pb, pwm, pwa, pws, pba, pv, ph0, pc0,
                                     mask_rows.data);
                }
                // the outputs are the tape h (zeros at padded steps); a training call returns a copy, so that
                // what the caller does to its outputs never reaches the cache
                py::array y = training ? py::array(arrays[1].attr("copy")()) : py::array(arrays[1]);
                py::object cache_t = py::none();
                if (training) {
                    py::tuple t(kCacheSize);
                    for (int i = 0; i < kCacheSize; ++i) t[i] = arrays[i];
                    cache_t = t;
                }
                return py::make_tuple(y, h, c, arrays[8], cache_t);
            });
        },
        py::arg("x"), py::arg("kernel"), py::arg("recurrent_kernel"), py::arg("bias"), py::arg("memory_kernel"),
        py::arg("attention_input_kernel"), py::arg("summary_kernel"), py::arg("attention_bias"),
        py::arg("attention_vector"), py::arg("h0"), py::arg("c0"), py::arg("mask"), py::arg("reverse") = false,
        py::arg("training") = true,
        "Runs the LSTM-Network over x (B, T, C). Returns (y (B, T, H), final h (B, H), final c (B, H), attention "
        "weights (B, T, T), cache or None) where cache (training only) is what lstmn_backward needs.");

    m.def(
        "lstmn_backward",
        [](const py::array& x, const py::array& kernel, const py::array& recurrent_kernel,
           const py::array& memory_kernel, const py::array& attention_input_kernel, const py::array& summary_kernel,
           const py::array& attention_vector, const py::tuple& cache_t, const py::object& mask, const py::object& dy,
           const py::object& dh, const py::object& dc, py::array& dkernel, py::array& drecurrent_kernel,
           const py::object& dbias, py::array& dmemory_kernel, py::array& dattention_input_kernel,
           py::array& dsummary_kernel, const py::object& dattention_bias, py::array& dattention_vector, bool reverse,
           bool need_dx) {
            return dispatch_float(x, "lstmn_backward: x", [&](auto tag) -> py::tuple {
                using T = decltype(tag);
                const LSTMNConfig cfg = lstmn_config<T>("lstmn_backward", x, kernel, recurrent_kernel, memory_kernel,
                                                        attention_input_kernel, summary_kernel, attention_vector,
                                                        reverse);
                const py::ssize_t B = cfg.B, Tn = cfg.T, C = cfg.C, H = cfg.H, A = cfg.A, G = 4 * H;
                if (cache_t.size() != kCacheSize)
                    throw py::value_error("lstmn_backward: cache must be the 9-tuple lstmn_forward returned");
                LSTMNCache<T> cache;
                T** slots[kCacheSize] = {&cache.gates,   &cache.h,    &cache.c,     &cache.summary, &cache.summary_c,
                                         &cache.summary_prev, &cache.keys, &cache.query, &cache.weights};
                const py::ssize_t widths[kCacheSize] = {G, H, H, H, H, H, A, A, Tn};
                std::vector<py::array> held;
                for (int i = 0; i < kCacheSize; ++i) {
                    held.push_back(shaped_array_arg(cache_t[i], {B, Tn, widths[i]}, "lstmn_backward: cache"));
                    *slots[i] = inout_ptr<T>(held.back(), "lstmn_backward: cache");
                }
                const T* px = in_ptr<T>(x, "lstmn_backward: x");
                const T* pw = in_ptr<T>(kernel, "lstmn_backward: kernel");
                const T* pu = in_ptr<T>(recurrent_kernel, "lstmn_backward: recurrent_kernel");
                const T* pwm = in_ptr<T>(memory_kernel, "lstmn_backward: memory_kernel");
                const T* pwa = in_ptr<T>(attention_input_kernel, "lstmn_backward: attention_input_kernel");
                const T* pws = in_ptr<T>(summary_kernel, "lstmn_backward: summary_kernel");
                const T* pv = in_ptr<T>(attention_vector, "lstmn_backward: attention_vector");
                const MaskRows mask_rows = parse_position_mask(mask, B, Tn, "lstmn_backward", "mask");
                const T* pdy = optional_in_ptr<T>(dy, {B, Tn, H}, "lstmn_backward: dy");
                const T* pdh = optional_in_ptr<T>(dh, {B, H}, "lstmn_backward: dh");
                const T* pdc = optional_in_ptr<T>(dc, {B, H}, "lstmn_backward: dc");
                check_shape(dkernel, {C, G}, "lstmn_backward: dkernel");
                check_shape(drecurrent_kernel, {H, G}, "lstmn_backward: drecurrent_kernel");
                check_shape(dmemory_kernel, {H, A}, "lstmn_backward: dmemory_kernel");
                check_shape(dattention_input_kernel, {C, A}, "lstmn_backward: dattention_input_kernel");
                check_shape(dsummary_kernel, {H, A}, "lstmn_backward: dsummary_kernel");
                check_shape(dattention_vector, {A}, "lstmn_backward: dattention_vector");
                T* pdw = inout_ptr<T>(dkernel, "lstmn_backward: dkernel");
                T* pdu = inout_ptr<T>(drecurrent_kernel, "lstmn_backward: drecurrent_kernel");
                T* pdb = optional_inout_ptr<T>(dbias, {G}, "lstmn_backward: dbias");
                T* pdwm = inout_ptr<T>(dmemory_kernel, "lstmn_backward: dmemory_kernel");
                T* pdwa = inout_ptr<T>(dattention_input_kernel, "lstmn_backward: dattention_input_kernel");
                T* pdws = inout_ptr<T>(dsummary_kernel, "lstmn_backward: dsummary_kernel");
                T* pdba = optional_inout_ptr<T>(dattention_bias, {A}, "lstmn_backward: dattention_bias");
                T* pdv = inout_ptr<T>(dattention_vector, "lstmn_backward: dattention_vector");

                py::array_t<T> dx = need_dx ? new_array<T>({B, Tn, C}) : new_array<T>({0});
                auto dh0 = new_array<T>({B, H});
                auto dc0 = new_array<T>({B, H});
                std::vector<py::array_t<T>> scratch;
                for (py::ssize_t width : {G, A, H, H, A}) scratch.push_back(new_array<T>({B, Tn, width}));
                scratch.push_back(new_array<T>({B, A}));
                LSTMNWork<T> work{scratch[0].mutable_data(), scratch[1].mutable_data(), scratch[2].mutable_data(),
                                  scratch[3].mutable_data(), scratch[4].mutable_data(), scratch[5].mutable_data()};
                T* pdx = need_dx ? dx.mutable_data() : nullptr;
                T* pdh0 = dh0.mutable_data();
                T* pdc0 = dc0.mutable_data();
                {
                    py::gil_scoped_release release;
                    lstmn_backward<T>(cfg, pdx, pdw, pdu, pdb, pdwm, pdwa, pdws, pdba, pdv, pdh0, pdc0, pdy, pdh, pdc,
                                      cache, work, px, pw, pu, pwm, pwa, pws, pv, mask_rows.data);
                }
                return py::make_tuple(need_dx ? py::object(dx) : py::none(), dh0, dc0);
            });
        },
        py::arg("x"), py::arg("kernel"), py::arg("recurrent_kernel"), py::arg("memory_kernel"),
        py::arg("attention_input_kernel"), py::arg("summary_kernel"), py::arg("attention_vector"), py::arg("cache"),
        py::arg("mask"), py::arg("dy"), py::arg("dh"), py::arg("dc"), py::arg("dkernel"), py::arg("drecurrent_kernel"),
        py::arg("dbias"), py::arg("dmemory_kernel"), py::arg("dattention_input_kernel"), py::arg("dsummary_kernel"),
        py::arg("dattention_bias"), py::arg("dattention_vector"), py::arg("reverse") = false,
        py::arg("need_dx") = true,
        "Backward of lstmn_forward: accumulates into the weight gradients; returns (dx or None, dh0, dc0). "
        "dy (B, T, H), dh / dc (B, H) may be None.");
}

}  // namespace attnx::bind
