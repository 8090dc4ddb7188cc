// int8 inference: quantized Dense, Embedding and recurrent forward passes, and the raw int8
// product the tests hold to the plain loop at each SIMD level (quantized.hpp).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <pybind11/stl.h>

#include "attnx/quantized.hpp"
#include "bindings.hpp"
#include "checks.hpp"

namespace attnx::bind {

// Values of int8 operands of the products lie in [-127, 127] (symmetric quantization): the AVX2
// tiles take |qx| and sign(qx) qw, and |-128| does not fit an int8 (quantized.hpp)
static void check_int8_range(const int8_t* q, py::ssize_t count, const std::string& what) {
    int8_t lowest = 0;
    for (py::ssize_t i = 0; i < count; ++i) lowest = std::min(lowest, q[i]);  // no early exit: vectorized
    if (lowest == -128) throw py::value_error(what + ": int8 values must lie in [-127, 127], got -128");
}

// A quantized kernel q int8 (K, N) in [-127, 127] with its per-column scale float32 (N), packed for
// the products (split: Int8Kernel's). The range is checked here, once per packing: the layers pack
// when their weights are set and reuse the packed kernel on every call (attnx.quantization.packed)
static std::shared_ptr<Int8Kernel> pack_kernel(const py::array& q, const py::array& scale, py::ssize_t split) {
    check_rank(q, 2, "pack_int8: kernel");
    const py::ssize_t K = q.shape(0), N = q.shape(1);
    check_shape(scale, {N}, "pack_int8: kernel_scale");
    const int8_t* pq = in_ptr<int8_t>(q, "pack_int8: kernel");
    const float* ps = in_ptr<float>(scale, "pack_int8: kernel_scale");
    if (split < 0 || split > N)
        throw py::value_error("pack_int8: split must lie in [0, " + std::to_string(N) +
                              "] (the kernel's columns), got " + std::to_string(split));
    check_int8_range(pq, K * N, "pack_int8: kernel");
    auto w = std::make_shared<Int8Kernel>();
    py::gil_scoped_release release;
    pack_int8_kernel(*w, pq, ps, (int)K, (int)N, split ? (int)split : (int)N);
    return w;
}

// A packed kernel's shape must be (K, N) with the split the caller's product needs
static const Int8Kernel& packed_kernel(const Int8Kernel& w, py::ssize_t K, py::ssize_t N, py::ssize_t split,
                                       const std::string& what) {
    if (w.K != K || w.N != N || w.split != split)
        throw py::value_error(what + ": expected a kernel packed as (" + std::to_string(K) + ", " + std::to_string(N) +
                              ") split at column " + std::to_string(split) + ", got (" + std::to_string(w.K) + ", " +
                              std::to_string(w.N) + ") split at " + std::to_string(w.split) +
                              " (kernels.pack_int8(kernel, kernel_scale, split))");
    return w;
}

void init_quantized(py::module_& m) {
    py::class_<Int8Kernel, std::shared_ptr<Int8Kernel>>(
        m, "Int8Kernel", "An int8 kernel (K, N) and its per-column scales packed for the int8 products (pack_int8).")
        .def_property_readonly("shape", [](const Int8Kernel& w) { return py::make_tuple(w.K, w.N); })
        .def_property_readonly("split", [](const Int8Kernel& w) { return w.split; });

    m.def("pack_int8", &pack_kernel, py::arg("kernel"), py::arg("kernel_scale"), py::arg("split") = 0,
          "kernel int8 (K, N) in [-127, 127] and kernel_scale float32 (N,) packed once for dense_forward_int8 and "
          "rnn_forward_int8; split (0: N) packs the columns [split, N) apart (a classic GRU's recurrent kernel: 2 H).");

    m.def(
        "int8_product",
        [](const py::array& qx, const py::array& qw) {
            check_rank(qx, 2, "int8_product: qx");
            check_rank(qw, 2, "int8_product: qw");
            const py::ssize_t R = qx.shape(0), K = qx.shape(1), N = qw.shape(1);
            check_shape(qw, {K, N}, "int8_product: qw");
            const int8_t* px = in_ptr<int8_t>(qx, "int8_product: qx");
            const int8_t* pw = in_ptr<int8_t>(qw, "int8_product: qw");
            check_int8_range(px, qx.size(), "int8_product: qx");
            check_int8_range(pw, qw.size(), "int8_product: qw");
            return released_result<int32_t>({R, N}, [&](int32_t* out) {
                Int8Packed B;
                pack_int8(B, pw, (size_t)N, (int)K, (int)N);
                std::vector<int8_t> a((size_t)R * B.Kp, 0);
                for (py::ssize_t r = 0; r < R; ++r) std::copy(px + r * K, px + (r + 1) * K, a.data() + r * B.Kp);
                std::vector<int32_t> acc((size_t)R * B.Np);
                int8_product(acc.data(), (size_t)B.Np, a.data(), (size_t)B.Kp, (int)R, B, 0, (int)N);
                for (py::ssize_t r = 0; r < R; ++r)
                    std::copy(acc.data() + r * B.Np, acc.data() + r * B.Np + N, out + r * N);
            });
        },
        py::arg("qx"), py::arg("qw"),
        "acc (R, N) int32 = qx (R, K) int8 . qw (K, N) int8 on the int8 tiles of the current SIMD level "
        "(values in [-127, 127]).");

    m.def(
        "quantize_rows",
        [](const py::array& x) {
            check_rank(x, 2, "quantize_rows: x");
            const py::ssize_t R = x.shape(0), K = x.shape(1);
            const float* px = in_ptr<float>(x, "quantize_rows: x");
            auto q = new_array<int8_t>({R, K});
            auto s = new_array<float>({R});
            int8_t* pq = q.mutable_data();
            float* ps = s.mutable_data();
            {
                py::gil_scoped_release release;
                quantize_rows(pq, (size_t)K, ps, px, (size_t)K, (int)R, (int)K, (int)K);
            }
            return py::make_tuple(q, s);
        },
        py::arg("x"),
        "(q (R, K) int8, scale (R,) float32) of x (R, K) float32 per row: scale = max|x| / 127, "
        "q = round(x / scale) (how the int8 layers quantize their inputs).");

    m.def(
        "quantize_activations",
        [](const py::array& x, const py::array& kernel) {
            check_rank(x, 2, "quantize_activations: x");
            const py::ssize_t R = x.shape(0), K = x.shape(1);
            check_rank(kernel, 2, "quantize_activations: kernel");
            check_shape(kernel, {K, kernel.shape(1)}, "quantize_activations: kernel");
            const float* px = in_ptr<float>(x, "quantize_activations: x");
            const int8_t* pw = in_ptr<int8_t>(kernel, "quantize_activations: kernel");
            auto q = new_array<int8_t>({R, K}), qe = new_array<int8_t>({R, K});
            auto s = new_array<float>({R}), se = new_array<float>({R});
            int8_t *pq = q.mutable_data(), *pqe = qe.mutable_data();
            float *ps = s.mutable_data(), *pse = se.mutable_data();
            {
                py::gil_scoped_release release;
                std::vector<float> kw(K);
                int8_feature_weights(kw.data(), pw, (size_t)kernel.shape(1), (int)K, (int)kernel.shape(1));
                Int8Activations a;
                a.resize((int)R, (int)K, (int)K, 0);
                on_widest_lanes<float>([&](auto lanes) __attribute__((always_inline)) {
                    a.quantize_on<decltype(lanes)>(px, (size_t)K, (int)R, kw.data());
                });
                std::copy(a.q.begin(), a.q.end(), pq);
                std::copy(a.s.begin(), a.s.end(), ps);
                std::fill(pqe, pqe + R * K, int8_t(0));
                std::fill(pse, pse + R, 0.f);
                for (int i = 0; i < a.coarse; ++i) {
                    std::copy(a.qe.begin() + (size_t)i * K, a.qe.begin() + (size_t)(i + 1) * K, pqe + a.which[i] * K);
                    pse[a.which[i]] = a.se[i];
                }
            }
            return py::make_tuple(q, s, qe, se);
        },
        py::arg("x"), py::arg("kernel"),
        "(q (R, K) int8, scale (R,), residual_q (R, K) int8, residual_scale (R,)) of x (R, K) float32 for a product "
        "with the int8 kernel (K, N): how the int8 layers quantize their inputs, x ~ scale q + residual_scale "
        "residual_q; the residual is quantized for the coarse rows only (quantized.hpp), zeros elsewhere.");

    m.def(
        "dense_forward_int8",
        [](const py::array& x, const Int8Kernel& kernel, const py::object& bias, const std::string& activation) {
            check_rank(x, 2, "dense_forward_int8: x");
            const py::ssize_t R = x.shape(0), K = x.shape(1), N = kernel.N;
            const Int8Kernel& w = packed_kernel(kernel, K, N, N, "dense_forward_int8: kernel");
            const float* px = in_ptr<float>(x, "dense_forward_int8: x");
            const float* pb = optional_in_ptr<float>(bias, {N}, "dense_forward_int8: bias");
            const Activation act = parse_activation(activation);
            return released_result<float>({R, N}, [&](float* out) {
                dense_forward_int8(out, px, (int)R, w, pb, act);
            });
        },
        py::arg("x"), py::arg("kernel"), py::arg("bias"), py::arg("activation") = "linear",
        "activation(x (R, K) . kernel + bias) with kernel int8 (K, N) quantized per column and packed (pack_int8), "
        "x quantized per row; float32 (R, N).");

    m.def(
        "dense_forward_int8_blocks",
        [](const py::array& x, const Int8Kernel& kernel, const py::object& bias, const std::vector<py::ssize_t>& widths,
           const std::string& activation) {
            check_rank(x, 2, "dense_forward_int8_blocks: x");
            const py::ssize_t R = x.shape(0), K = x.shape(1), N = kernel.N;
            const Int8Kernel& w = packed_kernel(kernel, K, N, N, "dense_forward_int8_blocks: kernel");
            py::ssize_t total = 0;
            for (py::ssize_t width : widths) total += width > 0 ? width : N + 1;  // a width <= 0 fails the sum
            if (widths.empty() || (int)widths.size() > Int8ColumnBlocks::kMax || total != N)
                throw py::value_error("dense_forward_int8_blocks: widths must be 1 to " +
                                      std::to_string(Int8ColumnBlocks::kMax) + " positive column counts summing to the "
                                      "kernel's " + std::to_string(N) + " columns, got " + std::to_string(widths.size()) +
                                      " summing to " + std::to_string(total));
            const float* px = in_ptr<float>(x, "dense_forward_int8_blocks: x");
            const float* pb = optional_in_ptr<float>(bias, {N}, "dense_forward_int8_blocks: bias");
            const Activation act = parse_activation(activation);
            py::list outs;
            Int8ColumnBlocks blocks;
            for (py::ssize_t width : widths) {
                auto out = new_array<float>({R, width});
                blocks.out[blocks.count] = out.mutable_data();
                blocks.ends[blocks.count] = (blocks.count ? blocks.ends[blocks.count - 1] : 0) + (int)width;
                ++blocks.count;
                outs.append(out);
            }
            {
                py::gil_scoped_release release;
                dense_forward_int8(blocks, px, (int)R, w, pb, act);
            }
            return outs;
        },
        py::arg("x"), py::arg("kernel"), py::arg("bias"), py::arg("widths"), py::arg("activation") = "linear",
        "dense_forward_int8's output as a list of arrays (R, width) of consecutive column blocks (widths summing to "
        "the kernel's N, at most 4): a self-attention's query, key and value from one product, each contiguous.");

    m.def(
        "feed_forward_forward_int8",
        [](const py::array& x, const Int8Kernel& kernel1, const py::object& bias1, const Int8Kernel& kernel2,
           const py::object& bias2, const std::string& activation) {
            check_rank(x, 2, "feed_forward_forward_int8: x");
            const py::ssize_t R = x.shape(0), K = x.shape(1), F = kernel1.N, N = kernel2.N;
            const Int8Kernel& w1 = packed_kernel(kernel1, K, F, F, "feed_forward_forward_int8: kernel1");
            const Int8Kernel& w2 = packed_kernel(kernel2, F, N, N, "feed_forward_forward_int8: kernel2");
            const float* px = in_ptr<float>(x, "feed_forward_forward_int8: x");
            const float* pb1 = optional_in_ptr<float>(bias1, {F}, "feed_forward_forward_int8: bias1");
            const float* pb2 = optional_in_ptr<float>(bias2, {N}, "feed_forward_forward_int8: bias2");
            const Activation act = parse_activation(activation);
            return released_result<float>({R, N}, [&](float* out) {
                feed_forward_forward_int8(out, px, (int)R, w1, pb1, act, w2, pb2);
            });
        },
        py::arg("x"), py::arg("kernel1"), py::arg("bias1"), py::arg("kernel2"), py::arg("bias2"),
        py::arg("activation") = "relu",
        "activation(x (R, K) . kernel1 + bias1) . kernel2 + bias2 on int8 kernels (K, F) and (F, N) packed by "
        "pack_int8, in blocks of rows whose hidden activations stay in the thread's cache; float32 (R, N), the "
        "same floats as two dense_forward_int8 calls.");

    m.def(
        "embedding_forward_int8",
        [](const py::array& ids, const py::array& table, const py::array& scale) {
            check_rank(table, 2, "embedding_forward_int8: table");
            const py::ssize_t V = table.shape(0), D = table.shape(1);
            const int8_t* pt = in_ptr<int8_t>(table, "embedding_forward_int8: table");
            check_shape(scale, {V}, "embedding_forward_int8: scale");
            const float* ps = in_ptr<float>(scale, "embedding_forward_int8: scale");
            const int64_t* pi = ids_ptr(ids, V, "embedding_forward_int8", "ids");
            std::vector<py::ssize_t> shape(ids.shape(), ids.shape() + ids.ndim());
            shape.push_back(D);
            return released_result<float>(shape, [&](float* out) {
                embedding_forward_int8(out, pi, (size_t)ids.size(), pt, ps, (int)D);
            });
        },
        py::arg("ids"), py::arg("table"), py::arg("scale"),
        "table[ids] * scale[ids, None] for an int8 table (V, D) quantized per row.");

    m.def(
        "rnn_forward_int8",
        [](const std::string& cell, const py::array& x, const Int8Kernel& kernel, const Int8Kernel& recurrent_kernel,
           const py::object& bias,
           const py::object& recurrent_bias, const py::object& h0, const py::object& c0, const py::object& mask,
           bool reverse, bool reset_after, const std::string& activation, const std::string& recurrent_activation,
           bool return_sequences) {
            RNNConfig cfg;
            if (cell == "simple") cfg.cell = RNNCell::simple;
            else if (cell == "gru") cfg.cell = RNNCell::gru;
            else if (cell == "lstm") cfg.cell = RNNCell::lstm;
            else throw py::value_error("rnn_forward_int8: unknown cell '" + cell + "'; expected simple, gru or lstm");
            cfg.reset_after = reset_after, cfg.reverse = reverse;
            cfg.activation = parse_activation(activation);
            cfg.recurrent_activation = parse_activation(recurrent_activation);
            if (!rnn_activation_ok(cfg.activation) || !rnn_activation_ok(cfg.recurrent_activation))
                throw py::value_error("rnn_forward_int8: activations must be tanh, sigmoid, relu or linear");
            check_rank(x, 3, "rnn_forward_int8: x");
            const py::ssize_t B = x.shape(0), Tn = x.shape(1), C = x.shape(2), H = recurrent_kernel.K;
            cfg.B = (int)B, cfg.T = (int)Tn, cfg.C = (int)C, cfg.H = (int)H;
            const py::ssize_t G = cfg.G();
            if (B == 0 || Tn == 0) throw py::value_error("rnn_forward_int8: x: empty batch or sequence, shape " + shape_str(x));
            const float* px = in_ptr<float>(x, "rnn_forward_int8: x");
            const Int8Kernel& w = packed_kernel(kernel, C, G, G, "rnn_forward_int8: kernel");
            const bool classic = cfg.cell == RNNCell::gru && !reset_after;
            const Int8Kernel& u = packed_kernel(recurrent_kernel, H, G, classic ? 2 * H : G,
                                                "rnn_forward_int8: recurrent_kernel");
            const bool lstm = cfg.cell == RNNCell::lstm, gru_after = cfg.cell == RNNCell::gru && reset_after;
            const float* pb = optional_in_ptr<float>(bias, {G}, "rnn_forward_int8: bias");
            if (!recurrent_bias.is_none() && !gru_after)
                throw py::value_error("rnn_forward_int8: recurrent_bias is only used by GRU with reset_after=True");
            const float* pbr = optional_in_ptr<float>(recurrent_bias, {G}, "rnn_forward_int8: recurrent_bias");
            const float* ph0 = optional_in_ptr<float>(h0, {B, H}, "rnn_forward_int8: initial h");
            if (!c0.is_none() && !lstm) throw py::value_error("rnn_forward_int8: c0 is only used by LSTM");
            const float* pc0 = optional_in_ptr<float>(c0, {B, H}, "rnn_forward_int8: initial c");
            const uint8_t* pm = parse_position_mask(mask, B, Tn, "rnn_forward_int8", "mask").data;
            py::array_t<float> y = return_sequences ? new_array<float>({B, Tn, H}) : new_array<float>({0});
            auto h = new_array<float>({B, H});
            py::array_t<float> c = lstm ? new_array<float>({B, H}) : new_array<float>({0});
            float* py_ = return_sequences ? y.mutable_data() : nullptr;
            float* ph = h.mutable_data();
            float* pc = lstm ? c.mutable_data() : nullptr;
            {
                py::gil_scoped_release release;
                const size_t n = (size_t)B * H;
                if (ph0) std::copy(ph0, ph0 + n, ph); else std::fill(ph, ph + n, 0.f);
                if (pc) {
                    if (pc0) std::copy(pc0, pc0 + n, pc); else std::fill(pc, pc + n, 0.f);
                }
                rnn_forward_int8(cfg, py_, ph, pc, px, w, u, pb, pbr, pm);
            }
            return py::make_tuple(return_sequences ? py::object(y) : py::none(), h,
                                  lstm ? py::object(c) : py::none());
        },
        py::arg("cell"), py::arg("x"), py::arg("kernel"), py::arg("recurrent_kernel"), py::arg("bias"),
        py::arg("recurrent_bias"), py::arg("h0"), py::arg("c0"),
        py::arg("mask"), py::arg("reverse") = false, py::arg("reset_after") = true, py::arg("activation") = "tanh",
        py::arg("recurrent_activation") = "sigmoid", py::arg("return_sequences") = true,
        "rnn_forward's inference on int8 kernels packed by pack_int8 (kernel (C, G), recurrent_kernel (H, G), split "
        "at 2 H for a classic GRU, else G): "
        "returns (y (B, T, H) or None, h (B, H), c (B, H) or None).");

    m.def("int8_level", []() { return std::string(int8_level_name()); },
          "The int8 instruction set the products run on now: 'amx' (AMX-INT8 tiles, for products of 16 rows or more, "
          "8 where K > 64; fewer rows take the VNNI tiles), 'vnni', 'avx2' or 'baseline'.");
}

}  // namespace attnx::bind
