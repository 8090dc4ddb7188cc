// The compiled inference plan (plan.hpp): python/attnx/models/plan.py adds a model's ops once per input
// signature, every slot size and weight checked here as it is added; `run` then checks only the input.
#include <memory>
#include <string>

#include <pybind11/stl.h>

#include "attnx/plan.hpp"
#include "bindings.hpp"
#include "checks.hpp"

namespace attnx::bind {

namespace {

// The plan with the weight arrays it points into (kept alive) and the input it takes.
struct PlanHandle {
    InferencePlan plan;
    std::vector<py::object> weights;
    std::vector<py::ssize_t> input_shape;
    bool token_ids = false;  // the input is int64 token ids (an embedding reads slot 0)

    template <class T = float>
    const T* weight(const py::object& a, const std::vector<py::ssize_t>& shape, const std::string& what) {
        if (a.is_none()) return nullptr;
        py::array arr = shaped_array_arg(a, shape, what.c_str());
        const T* p = in_ptr<T>(arr, what.c_str());
        weights.push_back(arr);
        return p;
    }

    void check_slot(int s, size_t size, const std::string& what, bool written = true) const {
        const bool input = s == 0 && !written && !token_ids;
        const size_t have = input ? input_size() : plan.slot_size(s);
        if ((s == 0 && (written || token_ids)) || (!input && (s <= 0 || s >= plan.slot_count())) || have != size)
            throw py::value_error("InferencePlan." + what + ": slot " + std::to_string(s) + " holds " +
                                  std::to_string(have) + " floats, the op needs " + std::to_string(size) +
                                  (s == 0 && (written || token_ids) ? " (slot 0 is the read-only input)" : ""));
    }
    void check_mask(int m, size_t size, const std::string& what) const {
        if (m >= plan.mask_count() || (m >= 0 && plan_mask_sizes[m] != size))
            throw py::value_error("InferencePlan." + what + ": mask slot " + std::to_string(m) + " does not hold " +
                                  std::to_string(size) + " flags");
    }
    size_t input_size() const {
        size_t n = 1;
        for (auto s : input_shape) n *= (size_t)s;
        return n;
    }
    std::vector<size_t> plan_mask_sizes;
};

void positive(std::initializer_list<int> sizes, const char* what) {
    for (int s : sizes)
        if (s <= 0) throw py::value_error(std::string("InferencePlan.") + what + ": sizes must be positive");
}

// A packed int8 kernel (attnx.quantization.packed) of K inputs (-1: any) split as the op's kernel needs
// (split 0: unsplit, its N)
std::shared_ptr<const Int8Kernel> int8_kernel(const std::shared_ptr<Int8Kernel>& w, int K, int split,
                                              const std::string& what) {
    if (!w) throw py::type_error("InferencePlan." + what + ": expected a packed Int8Kernel (kernels.pack_int8), got None");
    if ((K >= 0 && w->K != K) || w->split != (split ? split : w->N))
        throw py::value_error("InferencePlan." + what + ": a kernel packed as (" + std::to_string(w->K) + ", " +
                              std::to_string(w->N) + ") split at " + std::to_string(w->split) + ", the op needs " +
                              (K >= 0 ? std::to_string(K) : std::string("any")) + " inputs split at " +
                              (split ? std::to_string(split) : std::string("its columns")));
    return w;
}

// The recurrent cell, activations and sizes of an rnn op (float or int8)
RNNConfig rnn_config(const std::string& cell, bool reverse, bool reset_after, const std::string& activation,
                     const std::string& recurrent_activation, int batch, int steps, int C, int H, const char* what) {
    RNNConfig cfg;
    if (cell == "simple") cfg.cell = RNNCell::simple;
    else if (cell == "gru") cfg.cell = RNNCell::gru;
    else if (cell == "lstm") cfg.cell = RNNCell::lstm;
    else throw py::value_error(std::string("InferencePlan.") + what + ": unknown cell '" + cell + "'");
    cfg.reverse = reverse, cfg.reset_after = reset_after;
    cfg.activation = parse_activation(activation);
    cfg.recurrent_activation = parse_activation(recurrent_activation);
    if (!rnn_activation_ok(cfg.activation) || !rnn_activation_ok(cfg.recurrent_activation))
        throw py::value_error(std::string("InferencePlan.") + what +
                              ": activations must be tanh, sigmoid, relu or linear");
    cfg.B = batch, cfg.T = steps, cfg.C = C, cfg.H = H;
    positive({cfg.B, cfg.T, cfg.C, cfg.H}, what);
    return cfg;
}

}  // namespace

void init_plan(py::module_& m) {
    // the class in a submodule, made by the function inference_plan: _core's callables are its kernels
    py::module_ sub = m.def_submodule("plan", "The compiled inference plan's class.");
    m.def(
        "inference_plan",
        [](std::vector<py::ssize_t> input_shape, bool token_ids) {
            auto h = std::make_unique<PlanHandle>();
            for (auto s : input_shape)
                if (s <= 0 || s > kMaxIndex) throw py::value_error("inference_plan: input axes must be positive");
            h->input_shape = std::move(input_shape);
            h->token_ids = token_ids;
            return h;
        },
        py::arg("input_shape"), py::arg("token_ids"),
        "An empty InferencePlan for inputs of `input_shape`: float32, or int64 token ids (token_ids=True).");
    py::class_<PlanHandle>(sub, "InferencePlan",
                           "A model's kernels in order over buffers allocated once, for one input signature "
                           "(python/attnx/models/plan.py builds it; cpp/include/attnx/plan.hpp runs it).")
        .def("add_slot", [](PlanHandle& h, py::ssize_t size) {
                 if (size <= 0 || size > kMaxIndex) throw py::value_error("InferencePlan.add_slot: size out of range");
                 return h.plan.add_slot((size_t)size);
             }, py::arg("size"))
        .def("add_mask_slot", [](PlanHandle& h, py::ssize_t size) {
                 if (size <= 0 || size > kMaxIndex) throw py::value_error("InferencePlan.add_mask_slot: size out of range");
                 h.plan_mask_sizes.push_back((size_t)size);
                 return h.plan.add_mask_slot((size_t)size);
             }, py::arg("size"))
        .def("embedding", [](PlanHandle& h, int out, const py::array& table) {
                 check_rank(table, 2, "InferencePlan.embedding: table");
                 if (!h.token_ids) throw py::value_error("InferencePlan.embedding: the plan's input is not token ids");
                 PlanOp op;
                 op.kind = PlanOpKind::embedding;
                 op.rows = (int)h.input_size(), op.cols = (int)table.shape(1), op.vocab = table.shape(0);
                 op.w[0] = h.weight(table, {-1, -1}, "embedding: table");
                 h.check_slot(out, (size_t)op.rows * op.cols, "embedding");
                 op.out = out;
                 h.plan.add_op(std::move(op));
             }, py::arg("out"), py::arg("table"))
        .def("padding_mask", [](PlanHandle& h, int mask) {
                 if (!h.token_ids) throw py::value_error("InferencePlan.padding_mask: the plan's input is not token ids");
                 PlanOp op;
                 op.kind = PlanOpKind::padding_mask;
                 op.rows = (int)h.input_size(), op.mask = mask;
                 h.check_mask(mask, (size_t)op.rows, "padding_mask");
                 if (mask < 0) throw py::value_error("InferencePlan.padding_mask: needs a mask slot");
                 h.plan.add_op(std::move(op));
             }, py::arg("mask"))
        .def("dense", [](PlanHandle& h, int out, int in, const py::array& kernel, const py::object& bias,
                         const std::string& activation, int rows) {
                 check_rank(kernel, 2, "InferencePlan.dense: kernel");
                 PlanOp op;
                 op.kind = PlanOpKind::dense;
                 op.rows = rows, op.cols = (int)kernel.shape(0), op.units = (int)kernel.shape(1);
                 positive({op.rows, op.cols, op.units}, "dense");
                 op.act = parse_activation(activation);
                 op.w[0] = h.weight(kernel, {-1, -1}, "dense: kernel");
                 op.w[1] = h.weight(bias, {op.units}, "dense: bias");
                 h.check_slot(in, (size_t)rows * op.cols, "dense", false);
                 h.check_slot(out, (size_t)rows * op.units, "dense");
                 op.in = in, op.out = out;
                 h.plan.add_op(std::move(op));
             }, py::arg("out"), py::arg("in_"), py::arg("kernel"), py::arg("bias"), py::arg("activation"), py::arg("rows"))
        .def("feed_forward", [](PlanHandle& h, int out, int in, const py::array& kernel1, const py::object& bias1,
                                const py::array& kernel2, const py::object& bias2, const std::string& activation,
                                int rows) {
                 check_rank(kernel1, 2, "InferencePlan.feed_forward: kernel1");
                 check_rank(kernel2, 2, "InferencePlan.feed_forward: kernel2");
                 PlanOp op;
                 op.kind = PlanOpKind::feed_forward;
                 op.rows = rows, op.cols = (int)kernel1.shape(0), op.inner = (int)kernel1.shape(1);
                 op.units = (int)kernel2.shape(1);
                 positive({op.rows, op.cols, op.inner, op.units}, "feed_forward");
                 op.act = parse_activation(activation);
                 op.w[0] = h.weight(kernel1, {-1, -1}, "feed_forward: kernel1");
                 op.w[1] = h.weight(bias1, {op.inner}, "feed_forward: bias1");
                 op.w[2] = h.weight(kernel2, {op.inner, op.units}, "feed_forward: kernel2");
                 op.w[3] = h.weight(bias2, {op.units}, "feed_forward: bias2");
                 h.check_slot(in, (size_t)rows * op.cols, "feed_forward", false);
                 h.check_slot(out, (size_t)rows * op.units, "feed_forward");
                 op.in = in, op.out = out;
                 h.plan.add_op(std::move(op));
             }, py::arg("out"), py::arg("in_"), py::arg("kernel1"), py::arg("bias1"), py::arg("kernel2"),
             py::arg("bias2"), py::arg("activation"), py::arg("rows"))
        .def("rnn", [](PlanHandle& h, int out, int in, const std::string& cell, const py::array& kernel,
                       const py::array& recurrent_kernel, const py::object& bias, const py::object& recurrent_bias,
                       int mask, bool reverse, bool reset_after, const std::string& activation,
                       const std::string& recurrent_activation, int batch, int steps, bool return_sequences,
                       const py::object& embedding) {
                 PlanOp op;
                 op.kind = PlanOpKind::rnn;
                 check_rank(kernel, 2, "InferencePlan.rnn: kernel");
                 check_rank(recurrent_kernel, 2, "InferencePlan.rnn: recurrent_kernel");
                 op.rnn = rnn_config(cell, reverse, reset_after, activation, recurrent_activation, batch, steps,
                                     (int)kernel.shape(0), (int)recurrent_kernel.shape(0), "rnn");
                 RNNConfig& cfg = op.rnn;
                 const py::ssize_t G = cfg.G();
                 op.w[0] = h.weight(kernel, {cfg.C, G}, "rnn: kernel");
                 op.w[1] = h.weight(recurrent_kernel, {cfg.H, G}, "rnn: recurrent_kernel");
                 op.w[2] = h.weight(bias, {G}, "rnn: bias");
                 if (!recurrent_bias.is_none() && !(cfg.cell == RNNCell::gru && reset_after))
                     throw py::value_error("InferencePlan.rnn: recurrent_bias is only GRU's with reset_after=True");
                 op.w[3] = h.weight(recurrent_bias, {G}, "rnn: recurrent_bias");
                 h.check_mask(mask, (size_t)batch * steps, "rnn");
                 if (embedding.is_none()) {
                     h.check_slot(in, (size_t)batch * steps * cfg.C, "rnn", false);
                 } else {  // the input projection from a table of embedding . kernel + bias (plan.hpp)
                     if (!h.token_ids || in != 0 || h.input_size() != (size_t)batch * steps)
                         throw py::value_error("InferencePlan.rnn: an embedding reads the input's (batch, steps) "
                                               "token ids (in_=0)");
                     op.w[4] = h.weight(embedding, {-1, cfg.C}, "rnn: embedding");
                     const py::ssize_t V = py::cast<py::array>(embedding).shape(0);
                     if (V <= 0) throw py::value_error("InferencePlan.rnn: an empty embedding");
                     op.vocab = V;
                     op.embedded = std::make_unique<EmbeddedProjection>((size_t)V, (size_t)cfg.C, (size_t)G);
                 }
                 h.check_slot(out, (size_t)batch * (return_sequences ? steps : 1) * cfg.H, "rnn");
                 op.units = return_sequences;
                 op.in = in, op.out = out, op.mask = mask;
                 h.plan.add_op(std::move(op));
             }, py::arg("out"), py::arg("in_"), py::arg("cell"), py::arg("kernel"), py::arg("recurrent_kernel"),
             py::arg("bias"), py::arg("recurrent_bias"), py::arg("mask"), py::arg("reverse"), py::arg("reset_after"),
             py::arg("activation"), py::arg("recurrent_activation"), py::arg("batch"), py::arg("steps"),
             py::arg("return_sequences"), py::arg("embedding") = py::none(),
             "A recurrent op; with `embedding` (V, C) it reads the input's token ids (in_=0) and takes its input "
             "projection from a table of embedding . kernel + bias (plan.hpp's EmbeddedProjection).")
        .def("merge", [](PlanHandle& h, int out, int a, int b, const std::string& mode, int rows, int width) {
                 PlanOp op;
                 op.kind = PlanOpKind::merge;
                 if (mode == "concat") op.merge = PlanMerge::concat;
                 else if (mode == "sum") op.merge = PlanMerge::sum;
                 else if (mode == "mul") op.merge = PlanMerge::mul;
                 else if (mode == "ave") op.merge = PlanMerge::ave;
                 else throw py::value_error("InferencePlan.merge: unknown mode '" + mode + "'");
                 positive({rows, width}, "merge");
                 const size_t n = (size_t)rows * width;
                 h.check_slot(a, n, "merge", false);
                 h.check_slot(b, n, "merge", false);
                 h.check_slot(out, op.merge == PlanMerge::concat ? 2 * n : n, "merge");
                 op.rows = rows, op.cols = width, op.in = a, op.in2 = b, op.out = out;
                 h.plan.add_op(std::move(op));
             }, py::arg("out"), py::arg("a"), py::arg("b"), py::arg("mode"), py::arg("rows"), py::arg("width"))
        .def("attention_pooling", [](PlanHandle& h, int out, int in, const py::array& kernel, const py::array& bias,
                                     int mask, int batch, int steps, bool return_sequences) {
                 check_rank(kernel, 2, "InferencePlan.attention_pooling: kernel");
                 PlanOp op;
                 op.kind = PlanOpKind::attention_pooling;
                 const int C = (int)kernel.shape(0);
                 positive({batch, steps, C}, "attention_pooling");
                 op.w[0] = h.weight(kernel, {C, 1}, "attention_pooling: kernel");
                 check_rank(bias, 2, "InferencePlan.attention_pooling: bias");
                 if (!(bias.shape(0) == 1 || bias.shape(0) == steps))
                     throw py::value_error("InferencePlan.attention_pooling: bias must have 1 or `steps` rows");
                 op.w[1] = h.weight(bias, {-1, 1}, "attention_pooling: bias");
                 op.pool = PoolingConfig{batch, steps, C, bias.shape(0) == steps && steps != 1, return_sequences};
                 h.check_mask(mask, (size_t)batch * steps, "attention_pooling");
                 h.check_slot(in, (size_t)batch * steps * C, "attention_pooling", false);
                 h.check_slot(out, (size_t)batch * (return_sequences ? steps : 1) * C, "attention_pooling");
                 op.in = in, op.out = out, op.mask = mask;
                 h.plan.add_op(std::move(op));
             }, py::arg("out"), py::arg("in_"), py::arg("kernel"), py::arg("bias"), py::arg("mask"), py::arg("batch"),
             py::arg("steps"), py::arg("return_sequences"))
        .def("add_positions", [](PlanHandle& h, int out, int in, const py::array& table, int batch, int steps) {
                 check_rank(table, 2, "InferencePlan.add_positions: table");
                 PlanOp op;
                 op.kind = PlanOpKind::add_positions;
                 const int D = (int)table.shape(1);
                 positive({batch, steps, D}, "add_positions");
                 if (table.shape(0) < steps) throw py::value_error("InferencePlan.add_positions: table too short");
                 op.w[0] = h.weight(table, {-1, D}, "add_positions: table");
                 op.attend.B = batch, op.attend.Tq = steps, op.cols = D;
                 h.check_slot(in, (size_t)batch * steps * D, "add_positions", false);
                 h.check_slot(out, (size_t)batch * steps * D, "add_positions");
                 op.in = in, op.out = out;
                 h.plan.add_op(std::move(op));
             }, py::arg("out"), py::arg("in_"), py::arg("table"), py::arg("batch"), py::arg("steps"))
        .def("layernorm", [](PlanHandle& h, int out, int in, const py::object& gamma, const py::object& beta, double eps,
                             int rows, int cols) {
                 PlanOp op;
                 op.kind = PlanOpKind::layernorm;
                 positive({rows, cols}, "layernorm");
                 op.rows = rows, op.cols = cols, op.scalar = (float)eps;
                 op.w[0] = h.weight(gamma, {cols}, "layernorm: gamma");
                 op.w[1] = h.weight(beta, {cols}, "layernorm: beta");
                 h.check_slot(in, (size_t)rows * cols, "layernorm", false);
                 h.check_slot(out, (size_t)rows * cols, "layernorm");
                 op.in = in, op.out = out;
                 h.plan.add_op(std::move(op));
             }, py::arg("out"), py::arg("in_"), py::arg("gamma"), py::arg("beta"), py::arg("eps"), py::arg("rows"),
             py::arg("cols"))
        .def("sdpa", [](PlanHandle& h, int out, int q, int k, int v, int mask, int heads, int batch, int steps,
                        int key_dim, int value_dim, double scale) {
                 PlanOp op;
                 op.kind = PlanOpKind::sdpa;
                 positive({heads, batch, steps, key_dim, value_dim}, "sdpa");
                 op.attend = AttendShape{batch, heads, steps, steps, key_dim, value_dim};
                 const size_t rows = (size_t)batch * steps;
                 h.check_slot(q, rows * heads * key_dim, "sdpa", false);
                 h.check_slot(k, rows * heads * key_dim, "sdpa", false);
                 h.check_slot(v, rows * heads * value_dim, "sdpa", false);
                 h.check_slot(out, rows * heads * value_dim, "sdpa");
                 h.check_mask(mask, (size_t)batch * steps, "sdpa");
                 op.in = q, op.in2 = k, op.in3 = v, op.out = out, op.mask = mask, op.scalar = (float)scale;
                 h.plan.add_op(std::move(op));
             }, py::arg("out"), py::arg("query"), py::arg("key"), py::arg("value"), py::arg("mask"), py::arg("heads"),
             py::arg("batch"), py::arg("steps"), py::arg("key_dim"), py::arg("value_dim"), py::arg("scale"))
        .def("residual_add", [](PlanHandle& h, int out, int a, int b) {
                 PlanOp op;
                 op.kind = PlanOpKind::residual_add;
                 const size_t n = h.plan.slot_size(out);
                 h.check_slot(out, n, "residual_add");
                 h.check_slot(a, n, "residual_add", false);
                 h.check_slot(b, n, "residual_add", false);
                 op.in = a, op.in2 = b, op.out = out;
                 h.plan.add_op(std::move(op));
             }, py::arg("out"), py::arg("a"), py::arg("b"))
        .def("mean_pool", [](PlanHandle& h, int out, int in, int mask, int batch, int steps, int features) {
                 PlanOp op;
                 op.kind = PlanOpKind::mean_pool;
                 positive({batch, steps, features}, "mean_pool");
                 h.check_slot(in, (size_t)batch * steps * features, "mean_pool", false);
                 h.check_slot(out, (size_t)batch * features, "mean_pool");
                 h.check_mask(mask, (size_t)batch * steps, "mean_pool");
                 op.attend.B = batch, op.attend.Tq = steps, op.cols = features;
                 op.in = in, op.out = out, op.mask = mask;
                 h.plan.add_op(std::move(op));
             }, py::arg("out"), py::arg("in_"), py::arg("mask"), py::arg("batch"), py::arg("steps"), py::arg("features"))
        .def("activation", [](PlanHandle& h, int out, int in, const std::string& activation, int rows, int cols) {
                 PlanOp op;
                 op.kind = PlanOpKind::activation;
                 positive({rows, cols}, "activation");
                 op.act = parse_activation(activation);
                 h.check_slot(in, (size_t)rows * cols, "activation", false);
                 h.check_slot(out, (size_t)rows * cols, "activation");
                 op.rows = rows, op.cols = cols, op.in = in, op.out = out;
                 h.plan.add_op(std::move(op));
             }, py::arg("out"), py::arg("in_"), py::arg("activation"), py::arg("rows"), py::arg("cols"))
        .def("embedding_int8", [](PlanHandle& h, int out, const py::array& table, const py::array& scale) {
                 check_rank(table, 2, "InferencePlan.embedding_int8: table");
                 if (!h.token_ids)
                     throw py::value_error("InferencePlan.embedding_int8: the plan's input is not token ids");
                 PlanOp op;
                 op.kind = PlanOpKind::embedding_int8;
                 op.rows = (int)h.input_size(), op.cols = (int)table.shape(1), op.vocab = table.shape(0);
                 op.table = h.weight<int8_t>(table, {-1, -1}, "embedding_int8: table");
                 op.w[0] = h.weight(scale, {op.vocab}, "embedding_int8: scale");
                 h.check_slot(out, (size_t)op.rows * op.cols, "embedding_int8");
                 op.out = out;
                 h.plan.add_op(std::move(op));
             }, py::arg("out"), py::arg("table"), py::arg("scale"),
             "An int8 Embedding's rows of the input's ids: table (V, D) int8 times its per-row scale (V).")
        .def("dense_int8", [](PlanHandle& h, const std::vector<int>& outs, const std::vector<int>& widths, int in,
                              const std::shared_ptr<Int8Kernel>& kernel, const std::vector<py::object>& biases,
                              const std::string& activation, int rows) {
                 PlanOp op;
                 op.kind = PlanOpKind::dense_int8;
                 op.int8[0] = int8_kernel(kernel, -1, 0, "dense_int8: kernel");
                 op.rows = rows, op.cols = kernel->K, op.units = kernel->N;
                 positive({op.rows, op.cols, op.units}, "dense_int8");
                 if (outs.empty() || outs.size() != widths.size() || outs.size() != biases.size() ||
                     (int)outs.size() > Int8ColumnBlocks::kMax)
                     throw py::value_error("InferencePlan.dense_int8: 1 to " + std::to_string(Int8ColumnBlocks::kMax) +
                                           " output slots, one width and one bias (or None) each");
                 int end = 0;
                 for (size_t i = 0; i < outs.size(); ++i) {
                     positive({widths[i]}, "dense_int8");
                     h.check_slot(outs[i], (size_t)rows * widths[i], "dense_int8");
                     op.block_bias[i] = h.weight(biases[i], {widths[i]}, "dense_int8: bias");
                     if (!op.block_bias[i] != !op.block_bias[0])
                         throw py::value_error("InferencePlan.dense_int8: a bias for every block or none");
                     end += widths[i];
                     op.block_out[i] = outs[i], op.block_end[i] = end;
                 }
                 if (end != op.units)
                     throw py::value_error("InferencePlan.dense_int8: widths sum to " + std::to_string(end) +
                                           ", the kernel has " + std::to_string(op.units) + " columns");
                 op.blocks = (int)outs.size();
                 op.act = parse_activation(activation);
                 h.check_slot(in, (size_t)rows * op.cols, "dense_int8", false);
                 op.in = in;
                 h.plan.add_op(std::move(op));
             }, py::arg("outs"), py::arg("widths"), py::arg("in_"), py::arg("kernel"), py::arg("biases"),
             py::arg("activation"), py::arg("rows"),
             "act(in . kernel + bias) on a packed int8 kernel (dense_forward_int8), its columns written to the slots "
             "`outs` in blocks of `widths`, block i's bias biases[i] (all None or none): a self-attention's query, "
             "key and value from one product.")
        .def("feed_forward_int8", [](PlanHandle& h, int out, int in, const std::shared_ptr<Int8Kernel>& kernel1,
                                     const py::object& bias1, const std::shared_ptr<Int8Kernel>& kernel2,
                                     const py::object& bias2, const std::string& activation, int rows) {
                 PlanOp op;
                 op.kind = PlanOpKind::feed_forward_int8;
                 op.int8[0] = int8_kernel(kernel1, -1, 0, "feed_forward_int8: kernel1");
                 op.int8[1] = int8_kernel(kernel2, kernel1->N, 0, "feed_forward_int8: kernel2");
                 op.rows = rows, op.cols = kernel1->K, op.inner = kernel1->N, op.units = kernel2->N;
                 positive({op.rows, op.cols, op.inner, op.units}, "feed_forward_int8");
                 op.act = parse_activation(activation);
                 op.w[0] = h.weight(bias1, {op.inner}, "feed_forward_int8: bias1");
                 op.w[1] = h.weight(bias2, {op.units}, "feed_forward_int8: bias2");
                 h.check_slot(in, (size_t)rows * op.cols, "feed_forward_int8", false);
                 h.check_slot(out, (size_t)rows * op.units, "feed_forward_int8");
                 op.in = in, op.out = out;
                 h.plan.add_op(std::move(op));
             }, py::arg("out"), py::arg("in_"), py::arg("kernel1"), py::arg("bias1"), py::arg("kernel2"),
             py::arg("bias2"), py::arg("activation"), py::arg("rows"),
             "FeedForward on packed int8 kernels (feed_forward_forward_int8).")
        .def("rnn_int8", [](PlanHandle& h, int out, int in, const std::string& cell,
                            const std::shared_ptr<Int8Kernel>& kernel, const std::shared_ptr<Int8Kernel>& recurrent_kernel,
                            const py::object& bias, const py::object& recurrent_bias, int mask, bool reverse,
                            bool reset_after, const std::string& activation, const std::string& recurrent_activation,
                            int batch, int steps, bool return_sequences) {
                 PlanOp op;
                 op.kind = PlanOpKind::rnn_int8;
                 if (!kernel || !recurrent_kernel)
                     throw py::type_error("InferencePlan.rnn_int8: expected packed Int8Kernels, got None");
                 op.rnn = rnn_config(cell, reverse, reset_after, activation, recurrent_activation, batch, steps,
                                     kernel->K, recurrent_kernel->K, "rnn_int8");
                 const RNNConfig& cfg = op.rnn;
                 const int G = cfg.G();
                 const bool classic = cfg.cell == RNNCell::gru && !reset_after;
                 op.int8[0] = int8_kernel(kernel, cfg.C, 0, "rnn_int8: kernel");
                 op.int8[1] = int8_kernel(recurrent_kernel, cfg.H, classic ? 2 * cfg.H : 0, "rnn_int8: recurrent_kernel");
                 if (kernel->N != G || recurrent_kernel->N != G)
                     throw py::value_error("InferencePlan.rnn_int8: kernels of " + std::to_string(G) + " columns needed");
                 op.w[0] = h.weight(bias, {G}, "rnn_int8: bias");
                 if (!recurrent_bias.is_none() && !(cfg.cell == RNNCell::gru && reset_after))
                     throw py::value_error("InferencePlan.rnn_int8: recurrent_bias is only GRU's with reset_after=True");
                 op.w[1] = h.weight(recurrent_bias, {G}, "rnn_int8: recurrent_bias");
                 h.check_mask(mask, (size_t)batch * steps, "rnn_int8");
                 h.check_slot(in, (size_t)batch * steps * cfg.C, "rnn_int8", false);
                 h.check_slot(out, (size_t)batch * (return_sequences ? steps : 1) * cfg.H, "rnn_int8");
                 op.units = return_sequences;
                 op.in = in, op.out = out, op.mask = mask;
                 h.plan.add_op(std::move(op));
             }, py::arg("out"), py::arg("in_"), py::arg("cell"), py::arg("kernel"), py::arg("recurrent_kernel"),
             py::arg("bias"), py::arg("recurrent_bias"), py::arg("mask"), py::arg("reverse"), py::arg("reset_after"),
             py::arg("activation"), py::arg("recurrent_activation"), py::arg("batch"), py::arg("steps"),
             py::arg("return_sequences"),
             "A quantized recurrent level (rnn_forward_int8) on packed int8 kernels (recurrent_kernel split at 2 H "
             "for a classic GRU) from zero states.")
        .def("run", [](PlanHandle& h, const py::array& x, int result, const std::vector<py::ssize_t>& shape) -> py::object {
                 // the one check per call: the input is the signature the plan was built for
                 bool ok = x.ndim() == (py::ssize_t)h.input_shape.size();
                 for (size_t i = 0; ok && i < h.input_shape.size(); ++i) ok = x.shape(i) == h.input_shape[i];
                 if (!ok) throw py::value_error("InferencePlan.run: input of shape " + shape_str(x) +
                                                ", the plan's is another");
                 // the ids' range is the embedding op's check (run gives None, and the eager path names the id)
                 const void* px = h.token_ids ? static_cast<const void*>(in_ptr<int64_t>(x, "InferencePlan.run: x"))
                                              : static_cast<const void*>(in_ptr<float>(x, "InferencePlan.run: x"));
                 auto y = new_array<float>(shape);
                 if (result <= 0 || (size_t)y.size() != h.plan.slot_size(result))
                     throw py::value_error("InferencePlan.run: result slot " + std::to_string(result) +
                                           " does not hold the output shape's " + std::to_string(y.size()) + " floats");
                 float* py_ = y.mutable_data();
                 bool done;
                 {
                     py::gil_scoped_release release;
                     done = h.plan.run(px, result, py_);
                 }
                 if (!done) return py::none();
                 return std::move(y);
             }, py::arg("x"), py::arg("result"), py::arg("shape"),
             "Runs the plan on x (the signature it was built for) and returns a new array of `shape` holding slot "
             "`result`; None when a token id lies outside an embedding's table (the eager path then says which).");
}

}  // namespace attnx::bind
