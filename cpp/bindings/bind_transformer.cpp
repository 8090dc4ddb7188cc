// Layer normalization, positional encodings, dropout (keep masks come from bind_random.cpp), residuals,
// the cached step of a decoder stack, and the one search (search.hpp) over it or over a Python step.
#include <pybind11/stl.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "attnx/decoder_step.hpp"
#include "attnx/search.hpp"
#include "attnx/transformer.hpp"
#include "bindings.hpp"
#include "checks.hpp"
#include "search_bindings.hpp"

namespace attnx::bind {

static std::vector<py::ssize_t> shape_of(const py::array& a) { return {a.shape(), a.shape() + a.ndim()}; }

// One product's kernel of the step (slot `what`): a float array of dtype T and shape (K, N), or (T float
// only) a packed int8 kernel (kernels.Int8Kernel) of that shape, unsplit. Returns the StepLinear with
// the kernel (the bias is the caller's).
template <class T>
StepLinear<T> step_kernel(const py::object& kernel, py::ssize_t K, py::ssize_t N, const std::string& what) {
    StepLinear<T> w;
    if (py::isinstance<Int8Kernel>(kernel)) {
        if constexpr (!std::is_same_v<T, float>)
            throw py::type_error(what + ": an int8 kernel runs in a float32 step; got float64 activations");
        const Int8Kernel& q = kernel.cast<const Int8Kernel&>();
        if (q.K != K || q.N != N || q.split != q.N)
            throw py::value_error(what + ": expected an int8 kernel packed as (" + std::to_string(K) + ", " +
                                  std::to_string(N) + ") unsplit, got (" + std::to_string(q.K) + ", " +
                                  std::to_string(q.N) + ") split at " + std::to_string(q.split));
        w.int8 = &q;
        return w;
    }
    if (py::isinstance<py::array>(kernel) && has_dtype<int8_t>(kernel.cast<py::array>()))
        throw py::type_error(what + ": an int8 array; pass it packed with its scale (kernels.pack_int8, as "
                             "attnx.quantization.packed caches it)");
    w.kernel = in_ptr<T>(shaped_array_arg(kernel, {K, N}, what.c_str()), what.c_str());
    return w;
}

// The per-layer weights of a decoder stack (`weights`: per layer 22 entries or None, in
// DecoderLayerWeights' order, decoder_layer_weights' slots, as TransformerDecoderLayer.step_weights
// gives them) checked against the model size D, into `layers`; returns the stack's config (layers, D,
// H, F and the options). A kernel is a float array or a packed int8 kernel (step_kernel); without a
// self key kernel the self query kernel projects q, k and v side by side (D, 3D).
template <class T>
DecoderStepConfig stack_config(std::vector<DecoderLayerWeights<T>>& layers,
                               const std::vector<std::vector<py::object>>& weights, py::ssize_t L, py::ssize_t D,
                               int num_heads, bool norm_first, double epsilon, Activation act, const std::string& fn) {
    static const char* kNames[22] = {
        "norm1 gamma", "norm1 beta", "self query kernel", "self query bias", "self key kernel",
        "self key bias", "self value kernel", "self value bias", "self output kernel", "self output bias",
        "norm2 gamma", "norm2 beta", "cross query kernel", "cross query bias", "cross output kernel",
        "cross output bias", "norm3 gamma", "norm3 beta", "feed-forward kernel1", "feed-forward bias1",
        "feed-forward kernel2", "feed-forward bias2"};
    if (L < 1 || (py::ssize_t)weights.size() != L)
        throw py::value_error(fn + ": weights must hold one list per layer of the caches (" +
                              std::to_string(L) + "), got " + std::to_string(weights.size()));
    if (num_heads < 1 || D % num_heads)
        throw py::value_error(fn + ": num_heads must divide the model size " +
                              std::to_string(D) + ", got " + std::to_string(num_heads));
    if (!(epsilon > 0)) throw py::value_error(fn + ": epsilon must be positive");
    layers.resize((size_t)L);
    py::ssize_t F = -1;
    for (py::ssize_t l = 0; l < L; ++l) {
        const std::vector<py::object>& given = weights[l];
        if (given.size() != 22)
            throw py::value_error(fn + ": weights[" + std::to_string(l) + "] must hold 22 arrays (packed int8 kernels or None), got " +
                                  std::to_string(given.size()));
        if (given[18].is_none()) throw py::value_error(fn + ": the feed-forward kernel1 is required");
        const py::ssize_t width = py::isinstance<Int8Kernel>(given[18])
                                      ? given[18].cast<const Int8Kernel&>().N
                                      : shaped_array_arg(given[18], {D, -1}, (fn + ": feed-forward kernel1").c_str()).shape(1);
        if (F >= 0 && width != F) throw py::value_error(fn + ": every layer's feed-forward width must be equal");
        F = width;
        const bool fused = given[4].is_none();  // q, k, v in one (D, 3D) kernel
        const bool has_cross = !given[12].is_none();
        const T* p[22] = {};
        const Int8Kernel* int8[22] = {};
        for (int i = 0; i < 22; ++i) {
            const std::string what = fn + ": layer " + std::to_string(l) + " " + kNames[i];
            // without a cross-attention query the whole cross-attention block is absent
            const bool cross = i >= 10 && i < 16;
            if (cross && !has_cross && !given[i].is_none())
                throw py::value_error(what + " given without the cross-attention query kernel");
            const bool kernel = i == 2 || i == 4 || i == 6 || i == 8 || i == 12 || i == 14 || i == 18 || i == 20;
            const bool fused_away = fused && i >= 4 && i < 8;  // the key's and value's slots of a fused projection
            if (fused_away) {
                if (!given[i].is_none())
                    throw py::value_error(what + " given without the self key kernel (a fused q, k, v kernel "
                                          "holds it)");
                continue;
            }
            // (D, D) kernels, (D,) biases and norms; fused q, k, v (D, 3D), (3D,); feed-forward (D, F), (F,), (F, D)
            const py::ssize_t rows = i == 20 ? F : D;
            const py::ssize_t columns = i == 18 || i == 19 ? F : (fused && (i == 2 || i == 3)) ? 3 * D : D;
            if (kernel) {
                if (given[i].is_none()) {
                    if (!cross || has_cross) throw py::value_error(what + " is required");
                    continue;
                }
                const StepLinear<T> w = step_kernel<T>(given[i], rows, columns, what);
                p[i] = w.kernel, int8[i] = w.int8;
            } else {
                p[i] = optional_in_ptr<T>(given[i], {columns}, what.c_str());
            }
        }
        layers[l] = decoder_layer_weights<T>(p, int8);
    }
    DecoderStepConfig config;
    config.layers = (int)L, config.D = (int)D, config.H = num_heads, config.F = (int)F;
    config.norm_first = norm_first, config.epsilon = epsilon, config.activation = act;
    return config;
}

// The step functor of search.hpp over a Python decoder of the step protocol (attnx.decoding): the
// search runs without the GIL and takes it only here, in the callbacks.
struct PythonStep {
    using logits_type = double;
    using attention_type = double;
    py::object decoder_step, state;
    int width;
    bool want_attention;
    py::ssize_t vocab_size = 0;  // the first step's
    py::array_t<double> logits, weights;
    py::object weights_dtype = py::none();
    std::vector<py::ssize_t> middle;  // the attention's axes between the row and the source axis
    int heads = 1, keys = 0;

    const double* step(const int64_t* ids, int rows, int position) {
        py::gil_scoped_acquire gil;
        py::array_t<int64_t> previous((py::ssize_t)rows);
        std::copy(ids, ids + rows, previous.mutable_data());
        py::tuple out = decoder_step(previous, position, state, want_attention);
        if (out.size() != 3) throw py::value_error("decoding: a decoder's step must return (logits, state, attention)");
        state = out[1];
        logits = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(out[0]);
        if (logits && logits.ndim() == 2 && vocab_size == 0) vocab_size = logits.shape(1);
        if (!logits || logits.ndim() != 2 || logits.shape(0) != rows || logits.shape(1) != vocab_size)
            throw py::value_error("decoding: the decoder's step returned logits of shape " +
                                  (logits ? shape_str(logits) : std::string("?")) + ", expected (" +
                                  std::to_string(rows) + ", " + std::to_string(vocab_size) + ")");
        if (vocab_size < width)
            throw py::value_error("decoding: width " + std::to_string(width) + " is more than the decoder's " +
                                  std::to_string(vocab_size) + " words");
        if (want_attention) {
            py::array given = py::array::ensure(out[2]);
            if (!given || given.ndim() < 2 || given.shape(0) != rows)
                throw py::value_error("decoding: the decoder's step returned no attention (rows, ..., source) for " +
                                      std::to_string(rows) + " rows");
            std::vector<py::ssize_t> axes(given.shape() + 1, given.shape() + given.ndim() - 1);
            if (weights_dtype.is_none()) {
                weights_dtype = given.dtype(), middle = axes, keys = (int)given.shape(given.ndim() - 1);
                heads = 1;
                for (auto a : middle) heads *= (int)a;
            } else if (axes != middle || given.shape(given.ndim() - 1) != keys) {
                throw py::value_error("decoding: the decoder's step changed its attention's shape");
            }
            weights = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(given);
        }
        return logits.data();
    }
    const double* attention() const { return weights.data(); }
    int attention_heads() const { return heads; }
    int attention_keys() const { return keys; }
    int vocab() const { return (int)vocab_size; }
    void select(const int32_t* rows, int count) {
        py::gil_scoped_acquire gil;
        py::array_t<int64_t> picked((py::ssize_t)count);
        std::copy(rows, rows + count, picked.mutable_data());
        state = state.attr("select")(picked);
    }
};

// The (rows, cols) a dropout_stream's mask has for x: its first axis the batch's rows (random_keep's)
static std::pair<size_t, size_t> stream_rows(const py::array& x, const char* what) {
    if (x.ndim() < 1) throw py::value_error(std::string(what) + ": a dropout_stream needs an array with a batch axis");
    const size_t rows = (size_t)x.shape(0);
    return {rows, rows ? (size_t)x.size() / rows : 0};
}

void init_transformer(py::module_& m) {
    m.def(
        "layernorm_forward",
        [](const py::array& x, const py::object& gamma, const py::object& beta, double eps) {
            return dispatch_float(x, "layernorm_forward: x", [&](auto tag) -> py::tuple {
                using T = decltype(tag);
                check_rank(x, 2, "layernorm_forward: x");
                const auto N = x.shape(0), C = x.shape(1);
                if (!(eps > 0)) throw py::value_error("layernorm_forward: eps must be positive");
                const T* px = in_ptr<T>(x, "layernorm_forward: x");
                const T* pg = optional_in_ptr<T>(gamma, {C}, "layernorm_forward: gamma");
                const T* pb = optional_in_ptr<T>(beta, {C}, "layernorm_forward: beta");
                auto y = new_array<T>({N, C});
                auto mean = new_array<T>({N});
                auto rstd = new_array<T>({N});
                T *py_ = y.mutable_data(), *pm = mean.mutable_data(), *ps = rstd.mutable_data();
                {
                    py::gil_scoped_release release;
                    layernorm_forward<T>(py_, pm, ps, px, pg, pb, N, C, T(eps));
                }
                return py::make_tuple(y, mean, rstd);
            });
        },
        py::arg("x"), py::arg("gamma"), py::arg("beta"), py::arg("eps"),
        "Layer normalization over the last axis of x (N, C); returns (y, mean, rstd).");

    m.def(
        "layernorm_backward",
        [](const py::array& dy, const py::array& x, const py::array& mean, const py::array& rstd,
           const py::object& gamma, const py::object& dgamma, const py::object& dbeta, bool need_dx) {
            return dispatch_float(dy, "layernorm_backward: dy", [&](auto tag) -> py::object {
                using T = decltype(tag);
                check_rank(x, 2, "layernorm_backward: x");
                const auto N = x.shape(0), C = x.shape(1);
                check_shape(dy, {N, C}, "layernorm_backward: dy");
                check_shape(mean, {N}, "layernorm_backward: mean");
                check_shape(rstd, {N}, "layernorm_backward: rstd");
                T* pdg = optional_inout_ptr<T>(dgamma, {C}, "layernorm_backward: dgamma");
                T* pdb = optional_inout_ptr<T>(dbeta, {C}, "layernorm_backward: dbeta");
                const T* pg = optional_in_ptr<T>(gamma, {C}, "layernorm_backward: gamma");
                const T* pdy = in_ptr<T>(dy, "layernorm_backward: dy");
                const T* px = in_ptr<T>(x, "layernorm_backward: x");
                const T* pm = in_ptr<T>(mean, "layernorm_backward: mean");
                const T* ps = in_ptr<T>(rstd, "layernorm_backward: rstd");
                if (!need_dx) {
                    py::gil_scoped_release release;
                    layernorm_backward<T>((T*)nullptr, pdg, pdb, pdy, px, pm, ps, pg, N, C);
                    return py::none();
                }
                return released_result<T>({N, C}, [&](T* pdx) {
                    layernorm_backward<T>(pdx, pdg, pdb, pdy, px, pm, ps, pg, N, C);
                });
            });
        },
        py::arg("dy"), py::arg("x"), py::arg("mean"), py::arg("rstd"), py::arg("gamma"), py::arg("dgamma"),
        py::arg("dbeta"), py::arg("need_dx") = true,
        "Backward of layernorm_forward: returns dx (None when need_dx is False), accumulates into dgamma / dbeta.");

    m.def(
        "sinusoidal_table",
        [](py::ssize_t num_positions, py::ssize_t dim, const py::dtype& dtype, double max_wavelength) {
            if (num_positions < 0 || dim <= 0)
                throw py::value_error("sinusoidal_table: expected num_positions >= 0 and dim > 0, got " +
                                      std::to_string(num_positions) + ", " + std::to_string(dim));
            if (!(max_wavelength > 0)) throw py::value_error("sinusoidal_table: max_wavelength must be positive");
            auto make = [&](auto tag) -> py::array {
                using T = decltype(tag);
                auto table = new_array<T>({num_positions, dim});
                sinusoidal_table<T>(table.mutable_data(), num_positions, dim, max_wavelength);
                return std::move(table);
            };
            if (is_dtype<float>(dtype)) return make(float{});
            if (is_dtype<double>(dtype)) return make(double{});
            throw py::type_error("sinusoidal_table: expected float32 or float64, got " +
                                 py::str(dtype).cast<std::string>());
        },
        py::arg("num_positions"), py::arg("dim"), py::arg("dtype"), py::arg("max_wavelength") = 10000.0,
        "Vaswani et al.'s sin/cos position table (num_positions, dim).");

    m.def(
        "add_positions_forward",
        [](const py::array& x, const py::array& table) {
            return dispatch_float(x, "add_positions_forward: x", [&](auto tag) -> py::array {
                using T = decltype(tag);
                check_rank(x, 3, "add_positions_forward: x");
                const auto B = x.shape(0), Tn = x.shape(1), D = x.shape(2);
                check_shape(table, {-1, D}, "add_positions_forward: table");
                if (table.shape(0) < Tn)
                    throw py::value_error("add_positions_forward: sequence length " + std::to_string(Tn) +
                                          " exceeds the table's " + std::to_string(table.shape(0)) + " positions");
                const T* px = in_ptr<T>(x, "add_positions_forward: x");
                const T* pt = in_ptr<T>(table, "add_positions_forward: table");
                return released_result<T>({B, Tn, D}, [&](T* py_) {
                    add_positions_forward<T>(py_, px, pt, B, Tn, D);
                });
            });
        },
        py::arg("x"), py::arg("table"), "y[b, t] = x[b, t] + table[t] for x (B, T, D) and table (>= T, D).");

    m.def(
        "add_positions_backward",
        [](py::array& dtable, const py::array& dy) {
            dispatch_float(dy, "add_positions_backward: dy", [&](auto tag) {
                using T = decltype(tag);
                check_rank(dy, 3, "add_positions_backward: dy");
                const auto B = dy.shape(0), Tn = dy.shape(1), D = dy.shape(2);
                check_shape(dtable, {-1, D}, "add_positions_backward: dtable");
                if (dtable.shape(0) < Tn)
                    throw py::value_error("add_positions_backward: sequence length " + std::to_string(Tn) +
                                          " exceeds the table's " + std::to_string(dtable.shape(0)) + " positions");
                T* pdt = inout_ptr<T>(dtable, "add_positions_backward: dtable");
                const T* pdy = in_ptr<T>(dy, "add_positions_backward: dy");
                py::gil_scoped_release release;
                add_positions_backward<T>(pdt, pdy, B, Tn, D);
            });
        },
        py::arg("dtable"), py::arg("dy"), "dtable[t] += sum_b dy[b, t] (accumulates).");

    m.def(
        "apply_keep",
        [](const py::array& x, const py::object& keep, const py::object& dropout_stream) {
            return dispatch_float(x, "apply_keep: x", [&](auto tag) -> py::array {
                using T = decltype(tag);
                const KeepStream drawn = keep_stream(dropout_stream, keep, "apply_keep");
                const T* px = in_ptr<T>(x, "apply_keep: x");
                if (dropout_stream.is_none()) {
                    if (keep.is_none()) throw py::value_error("apply_keep: give keep or dropout_stream");
                    const T* pk = optional_in_ptr<T>(keep, shape_of(x), "apply_keep: keep");
                    return released_result<T>(shape_of(x), [&](T* py_) { apply_keep<T>(py_, px, pk, (size_t)x.size()); });
                }
                const auto [rows, cols] = stream_rows(x, "apply_keep: x");
                return released_result<T>(shape_of(x), [&](T* py_) { apply_keep<T>(py_, px, rows, cols, drawn); });
            });
        },
        py::arg("x"), py::arg("keep") = py::none(), py::arg("dropout_stream") = py::none(),
        "y = x * keep (dropout forward, and backward on dy); dropout_stream (rate, key, first_row): the mask\n"
        "random_keep would draw for x's shape, drawn as it is used instead of given.");

    m.def(
        "feed_forward_forward",
        [](const py::array& x, const py::array& kernel1, const py::object& bias1, const py::array& kernel2,
           const py::object& bias2, const std::string& activation) {
            const Activation act = parse_activation(activation);
            return dispatch_float(x, "feed_forward_forward: x", [&](auto tag) -> py::array {
                using T = decltype(tag);
                check_rank(x, 2, "feed_forward_forward: x");
                check_rank(kernel1, 2, "feed_forward_forward: kernel1");
                check_rank(kernel2, 2, "feed_forward_forward: kernel2");
                const auto N = x.shape(0), C = x.shape(1), F = kernel1.shape(1), OC = kernel2.shape(1);
                check_shape(kernel1, {C, F}, "feed_forward_forward: kernel1");
                check_shape(kernel2, {F, OC}, "feed_forward_forward: kernel2");
                const T* px = in_ptr<T>(x, "feed_forward_forward: x");
                const T* pw1 = in_ptr<T>(kernel1, "feed_forward_forward: kernel1");
                const T* pw2 = in_ptr<T>(kernel2, "feed_forward_forward: kernel2");
                const T* pb1 = optional_in_ptr<T>(bias1, {F}, "feed_forward_forward: bias1");
                const T* pb2 = optional_in_ptr<T>(bias2, {OC}, "feed_forward_forward: bias2");
                return released_result<T>({N, OC}, [&](T* py_) {
                    feed_forward_forward<T>(py_, px, pw1, pb1, pw2, pb2, (int)N, (int)C, (int)F, (int)OC, act);
                });
            });
        },
        py::arg("x"), py::arg("kernel1"), py::arg("bias1"), py::arg("kernel2"), py::arg("bias2"),
        py::arg("activation") = "relu",
        "y = act(x . kernel1 + bias1) . kernel2 + bias2 for x (N, C), without keeping the hidden activations "
        "(inference).");

    m.def(
        "residual_add",
        [](const py::array& x, const py::array& sub, const py::object& keep, const py::object& dropout_stream) {
            return dispatch_float(x, "residual_add: x", [&](auto tag) -> py::array {
                using T = decltype(tag);
                check_shape(sub, shape_of(x), "residual_add: sub");
                const KeepStream drawn = keep_stream(dropout_stream, keep, "residual_add");
                const T* px = in_ptr<T>(x, "residual_add: x");
                const T* ps = in_ptr<T>(sub, "residual_add: sub");
                if (dropout_stream.is_none()) {
                    const T* pk = optional_in_ptr<T>(keep, shape_of(x), "residual_add: keep");
                    return released_result<T>(shape_of(x), [&](T* py_) {
                        residual_add<T>(py_, px, ps, pk, (size_t)x.size());
                    });
                }
                const auto [rows, cols] = stream_rows(x, "residual_add: x");
                return released_result<T>(shape_of(x), [&](T* py_) { residual_add<T>(py_, px, ps, rows, cols, drawn); });
            });
        },
        py::arg("x"), py::arg("sub"), py::arg("keep") = py::none(), py::arg("dropout_stream") = py::none(),
        "y = x + keep * sub (keep None: y = x + sub); dropout_stream as apply_keep's.");
    m.def(
        "decoder_stack_step",
        [](const py::array& x, py::array& self_keys, py::array& self_values, const py::array& cross_keys,
           const py::array& cross_values, const py::object& source_mask, int position,
           const std::vector<std::vector<py::object>>& weights, int num_heads, bool norm_first, double epsilon,
           const std::string& activation, bool return_attention) {
            const Activation act = parse_activation(activation);
            return dispatch_float(x, "decoder_stack_step: x", [&](auto tag) -> py::tuple {
                using T = decltype(tag);
                check_rank(x, 2, "decoder_stack_step: x");
                check_rank(self_keys, 4, "decoder_stack_step: self_keys");
                check_rank(cross_keys, 4, "decoder_stack_step: cross_keys");
                const auto N = x.shape(0), D = x.shape(1), L = self_keys.shape(0), capacity = self_keys.shape(2);
                const auto S = cross_keys.shape(2);
                check_shape(self_keys, {L, N, capacity, D}, "decoder_stack_step: self_keys");
                check_shape(self_values, {L, N, capacity, D}, "decoder_stack_step: self_values");
                check_shape(cross_keys, {L, N, S, D}, "decoder_stack_step: cross_keys");
                check_shape(cross_values, {L, N, S, D}, "decoder_stack_step: cross_values");
                if (position < 0 || position >= capacity)
                    throw py::value_error("decoder_stack_step: position must be in [0, capacity " +
                                          std::to_string(capacity) + "), got " + std::to_string(position));
                const MaskRows mask = parse_position_mask(source_mask, N, S, "decoder_stack_step", "source_mask");
                const T* px = in_ptr<T>(x, "decoder_stack_step: x");
                T* pkeys = inout_ptr<T>(self_keys, "decoder_stack_step: self_keys");
                T* pvalues = inout_ptr<T>(self_values, "decoder_stack_step: self_values");
                const T* pcross_keys = in_ptr<T>(cross_keys, "decoder_stack_step: cross_keys");
                const T* pcross_values = in_ptr<T>(cross_values, "decoder_stack_step: cross_values");
                std::vector<DecoderLayerWeights<T>> layers;
                DecoderStepConfig config = stack_config<T>(layers, weights, L, D, num_heads, norm_first, epsilon, act,
                                                           "decoder_stack_step");
                config.N = (int)N, config.S = (int)S, config.capacity = (int)capacity, config.position = position;
                auto y = new_array<T>({N, D});
                std::copy(px, px + N * D, y.mutable_data());
                py::object weights_out = py::none();
                T* pweights = nullptr;
                if (return_attention) {
                    auto w = new_array<T>({N, (py::ssize_t)num_heads, S});
                    pweights = w.mutable_data();
                    weights_out = std::move(w);
                }
                T* py_ = y.mutable_data();
                if (N > 0) {
                    py::gil_scoped_release release;
                    decoder_stack_step<T>(py_, pkeys, pvalues, pweights, pcross_keys, pcross_values, mask.data,
                                          layers.data(), config);
                }
                return py::make_tuple(y, weights_out);
            });
        },
        py::arg("x"), py::arg("self_keys"), py::arg("self_values"), py::arg("cross_keys"), py::arg("cross_values"),
        py::arg("source_mask"), py::arg("position"), py::arg("weights"), py::arg("num_heads"),
        py::arg("norm_first"), py::arg("epsilon"), py::arg("activation"), py::arg("return_attention") = false,
        "One cached position through every decoder layer of a stack for x (N, D): writes row `position` of the "
        "self-attention caches (layers, N, capacity, D) in place and returns (y (N, D), the last layer's "
        "cross-attention weights (N, heads, S) or None). weights: per layer 22 entries in DecoderLayerWeights' "
        "order (cpp/include/attnx/decoder_step.hpp): float arrays, or packed int8 kernels (kernels.Int8Kernel) "
        "for a float32 step's kernels; a None self key kernel: the self query kernel projects q, k, v (D, 3D).");
    m.def(
        "search_decoder_stack",
        [](const py::array& cross_keys, const py::array& cross_values, const py::object& source_mask,
           const std::vector<std::vector<py::object>>& weights, int num_heads, bool norm_first, double epsilon,
           const std::string& activation, const py::array& embedding, const py::object& embedding_row_scale,
           double embedding_scale, const py::array& positions, const py::object& norm_gamma,
           const py::object& norm_beta, double norm_epsilon, const py::object& output_kernel,
           const py::object& output_bias, int64_t start_id, int64_t end_id, int width, double length_penalty,
           int max_length, bool return_attention, int batch_size) {
            const char* fn = "search_decoder_stack";
            if (batch_size < 0) throw py::value_error("search_decoder_stack: batch_size must be >= 0 (0: all at once)");
            const Activation act = parse_activation(activation);
            return dispatch_float(cross_keys, "search_decoder_stack: cross_keys", [&](auto tag) -> py::tuple {
                using T = decltype(tag);
                check_rank(cross_keys, 4, "search_decoder_stack: cross_keys");
                check_rank(embedding, 2, "search_decoder_stack: embedding");
                const auto L = cross_keys.shape(0), B = cross_keys.shape(1), S = cross_keys.shape(2);
                const auto D = cross_keys.shape(3), V = embedding.shape(0);
                check_shape(embedding, {-1, D}, "search_decoder_stack: embedding");
                check_shape(cross_values, {L, B, S, D}, "search_decoder_stack: cross_values");
                check_shape(positions, {-1, D}, "search_decoder_stack: positions");
                if (positions.shape(0) < max_length)
                    throw py::value_error("search_decoder_stack: positions has " + std::to_string(positions.shape(0)) +
                                          " rows, fewer than max_length = " + std::to_string(max_length));
                if (!(norm_epsilon > 0)) throw py::value_error("search_decoder_stack: norm_epsilon must be positive");
                SearchConfig search = search_config(fn, B, V, start_id, end_id, width, length_penalty, max_length,
                                                    return_attention);
                if (S < 1) throw py::value_error("search_decoder_stack: the memory has no positions");
                const MaskRows mask = parse_position_mask(source_mask, B, S, fn, "source_mask");
                std::vector<DecoderLayerWeights<T>> layers;
                DecoderStepConfig config = stack_config<T>(layers, weights, L, D, num_heads, norm_first, epsilon, act,
                                                           fn);
                if (!layers.back().cross_query.present())
                    throw py::value_error("search_decoder_stack: the last layer has no cross-attention");
                config.N = (int)(B * width), config.S = (int)S, config.capacity = max_length;
                config.memory_batch = (int)B;
                DecoderEnds<T> ends;
                // a quantized Embedding's table: int8 rows and their scales (float32 steps only)
                if (has_dtype<int8_t>(embedding)) {
                    if (!std::is_same_v<T, float>)
                        throw py::type_error("search_decoder_stack: an int8 embedding runs in a float32 step");
                    if (embedding_row_scale.is_none())
                        throw py::value_error("search_decoder_stack: an int8 embedding needs its embedding_row_scale");
                    ends.embedding_int8 = in_ptr<int8_t>(embedding, "search_decoder_stack: embedding");
                    ends.embedding_row_scale = optional_in_ptr<float>(embedding_row_scale, {V},
                                                                      "search_decoder_stack: embedding_row_scale");
                    if (output_kernel.is_none())
                        throw py::value_error("search_decoder_stack: an int8 embedding cannot be the tied output "
                                              "projection; pass output_kernel");
                } else {
                    if (!embedding_row_scale.is_none())
                        throw py::value_error("search_decoder_stack: embedding_row_scale belongs to an int8 embedding; "
                                              "the embedding has dtype " + dtype_str(embedding));
                    ends.embedding = in_ptr<T>(embedding, "search_decoder_stack: embedding");
                }
                ends.embedding_scale = T(embedding_scale);
                ends.positions = in_ptr<T>(positions, "search_decoder_stack: positions");
                ends.norm_gamma = optional_in_ptr<T>(norm_gamma, {D}, "search_decoder_stack: norm_gamma");
                ends.norm_beta = optional_in_ptr<T>(norm_beta, {D}, "search_decoder_stack: norm_beta");
                ends.norm_epsilon = norm_epsilon;
                if (!output_kernel.is_none())
                    ends.output = step_kernel<T>(output_kernel, D, V, "search_decoder_stack: output_kernel");
                else if (!output_bias.is_none())
                    throw py::value_error("search_decoder_stack: output_bias given without output_kernel (a tied "
                                          "output has no bias)");
                ends.output.bias = optional_in_ptr<T>(output_bias, {V}, "search_decoder_stack: output_bias");
                ends.vocab = (int)V;
                const T* pcross_keys = in_ptr<T>(cross_keys, "search_decoder_stack: cross_keys");
                const T* pcross_values = in_ptr<T>(cross_values, "search_decoder_stack: cross_values");
                SearchResult<T> result;
                {
                    py::gil_scoped_release release;
                    result = search_decoder_batches<T>(layers.data(), config, pcross_keys, pcross_values, mask.data,
                                                       ends, search, batch_size > 0 ? batch_size : (int)B);
                }
                return search_result_tuple(result, return_attention);
            });
        },
        py::arg("cross_keys"), py::arg("cross_values"), py::arg("source_mask"), py::arg("weights"),
        py::arg("num_heads"), py::arg("norm_first"), py::arg("epsilon"), py::arg("activation"), py::arg("embedding"),
        py::arg("embedding_row_scale"), py::arg("embedding_scale"), py::arg("positions"), py::arg("norm_gamma"), py::arg("norm_beta"),
        py::arg("norm_epsilon"), py::arg("output_kernel"), py::arg("output_bias"), py::arg("start_id"),
        py::arg("end_id"), py::arg("width"), py::arg("length_penalty"), py::arg("max_length"),
        py::arg("return_attention"), py::arg("batch_size") = 0,
        "Greedy decoding (width 1) or beam search (search.hpp) of a whole batch in one call over a decoder stack, "
        "batch_size inputs at a time (0: all; each batch a search of its own on its memory rows cut after their last "
        "real position, search_decoder_batches): "
        "x = embedding[id] * embedding_scale + positions[t] (an int8 embedding: its rows times "
        "embedding_row_scale[id]), the stack's cached step on the memory's cross keys / values (layers, B, S, D), "
        "logits = norm(x) output_kernel + output_bias (output_kernel None: norm(x) embedding^T); every kernel a "
        "float array or a packed int8 kernel (kernels.Int8Kernel). Returns (tokens (B, W, steps), lengths (B, W), scores (B, W), scores / length penalty "
        "(B, W), the last layer's cross-attention (B, W, heads, steps, S) or None, 0 past a batch's steps and keys), "
        "each input's beams best first.");
    m.def(
        "search_python_step",
        [](const py::object& decoder, const py::object& state, py::ssize_t batch, int64_t start_id, int64_t end_id, int width, double length_penalty, int max_length,
           bool return_attention) {
            SearchConfig search = search_config("search_python_step", batch, 0, start_id, end_id, width,
                                                length_penalty, max_length, return_attention);
            if (!py::hasattr(decoder, "step") || !PyCallable_Check(decoder.attr("step").ptr()))
                throw py::type_error("search_python_step: the decoder must have a step(ids, position, state, "
                                     "return_attention) method, got " + std::string(py::str(py::type::of(decoder))));
            PythonStep step{decoder.attr("step"), state, width, return_attention};
            SearchResult<double> result;
            {
                py::gil_scoped_release release;
                result = attnx::search(step, search);
            }
            py::tuple out = search_result_tuple(result, return_attention);
            if (out[4].is_none()) return out;
            // the attention in the decoder's dtype and shape: (B, W) + its middle axes + (steps, S)
            std::vector<py::ssize_t> shape{(py::ssize_t)batch, (py::ssize_t)width};
            shape.insert(shape.end(), step.middle.begin(), step.middle.end());
            shape.push_back(result.steps), shape.push_back(step.keys);
            py::array attention = out[4].cast<py::array>().attr("astype")(step.weights_dtype).attr("reshape")(shape);
            return py::tuple(py::make_tuple(out[0], out[1], out[2], out[3], attention));
        },
        py::arg("decoder"), py::arg("state"), py::arg("batch"), py::arg("start_id"),
        py::arg("end_id"), py::arg("width"), py::arg("length_penalty"), py::arg("max_length"),
        py::arg("return_attention"),
        "The search of search_decoder_stack over a Python decoder of attnx.decoding's step protocol "
        "(decoder.step(ids, position, state, return_attention) -> (logits, state, attention), state.select(rows)); "
        "the attention comes back as (B, W, ..., steps, S) in the step's dtype.");
}

}  // namespace attnx::bind
