// Fused attention decoders (Bahdanau, Luong) for seq2seq: teacher-forced forward over all target
// steps, its backward, and (T = 1) one inference step.
#include <algorithm>
#include <cstdint>
#include <string>

#include "attnx/seq2seq.hpp"
#include "bindings.hpp"
#include "checks.hpp"
#include "search_bindings.hpp"

namespace attnx::bind {

static DecoderConfig decoder_config(const std::string& kind, const std::string& score, const std::string& cell,
                                    int local_window, const std::string& local_mode, bool gated = false,
                                    bool hard = false) {
    DecoderConfig cfg;
    if (kind == "bahdanau") cfg.kind = DecoderKind::bahdanau;
    else if (kind == "luong") cfg.kind = DecoderKind::luong;
    else throw py::value_error("decoder: unknown kind '" + kind + "'; expected bahdanau or luong");
    // the ScoreKind names; python/attnx/layers/scores.py maps each attention score to one of them
    if (score == "additive") cfg.score = ScoreKind::additive;
    else if (score == "general") cfg.score = ScoreKind::general;
    else if (score == "dot") cfg.score = ScoreKind::dot;
    else throw py::value_error("decoder: unknown score kind '" + score + "'; expected additive, general or dot");
    if (cell == "gru") cfg.cell = RNNCell::gru;
    else if (cell == "lstm") cfg.cell = RNNCell::lstm;
    else throw py::value_error("decoder: unknown cell '" + cell + "'; expected gru or lstm");
    if (cfg.kind == DecoderKind::bahdanau && cfg.score != ScoreKind::additive)
        throw py::value_error("decoder: the Bahdanau decoder uses the additive score, got '" + score + "'");
    if (local_window >= 0 && cfg.kind != DecoderKind::luong)
        throw py::value_error("decoder: local attention is a Luong option");
    cfg.local_window = local_window;
    if (local_mode == "m") cfg.local_mode = LocalMode::monotonic;
    else if (local_mode == "p") cfg.local_mode = LocalMode::predictive;
    else throw py::value_error("decoder: unknown local_mode '" + local_mode + "'; expected m or p");
    if ((gated || hard) && cfg.kind != DecoderKind::bahdanau)
        throw py::value_error("decoder: gated and hard attention are Bahdanau options (Show, Attend and Tell)");
    cfg.gated = gated, cfg.hard = hard;
    return cfg;
}

// params[name] checked against `shape`; null when the variant does not use it.
template <class T, class P>
static P param(const py::dict& params, const char* name, const std::vector<py::ssize_t>& shape, bool used,
               const char* fn) {
    if (!used) return nullptr;
    const std::string what = std::string(fn) + ": " + name;
    if (!params.contains(name)) throw py::value_error(what + ": missing");
    py::array a = array_arg(params[name], what.c_str());
    check_shape(a, shape, what.c_str());
    if constexpr (std::is_const_v<std::remove_pointer_t<P>>) return in_ptr<T>(a, what.c_str());
    else return inout_ptr<T>(a, what.c_str());
}

// Sizes from the parameters: E, H, U, V (K, B, S, T come from the inputs).
template <class T, class P>
static DecoderParams<P> decoder_params(const DecoderConfig& cfg, const py::dict& params, const char* fn) {
    const bool luong = cfg.kind == DecoderKind::luong, additive = cfg.score == ScoreKind::additive;
    const py::ssize_t E = cfg.E, F = cfg.F(), G = cfg.G(), H = cfg.H, K = cfg.K, U = cfg.U, V = cfg.V;
    DecoderParams<P> p;
    p.embeddings = param<T, P>(params, "embeddings", {-1, E}, true, fn);
    p.kernel = param<T, P>(params, "kernel", {E + F, G}, true, fn);
    p.recurrent_kernel = param<T, P>(params, "recurrent_kernel", {H, G}, true, fn);
    if (cfg.cell == RNNCell::gru) {
        P bias = param<T, P>(params, "bias", {2, G}, true, fn);  // [input bias, recurrent bias] as GRU stores it
        p.bias_in = bias, p.bias_rec = bias + G;
    } else {
        p.bias_in = param<T, P>(params, "bias", {G}, true, fn);
    }
    p.query_kernel = param<T, P>(params, "query_kernel", {H, U}, additive, fn);
    p.query_bias = param<T, P>(params, "query_bias", {U}, additive, fn);
    p.key_kernel = param<T, P>(params, "key_kernel", {K, cfg.Dk()}, cfg.score != ScoreKind::dot, fn);
    p.score_vector = param<T, P>(params, "score_vector", {U}, additive, fn);
    p.attentional_kernel = param<T, P>(params, "attentional_kernel", {K + H, H}, luong, fn);
    p.position_kernel = param<T, P>(params, "position_kernel", {H, cfg.P}, cfg.predictive(), fn);
    p.position_vector = param<T, P>(params, "position_vector", {cfg.P}, cfg.predictive(), fn);
    p.gate_kernel = param<T, P>(params, "gate_kernel", {H}, cfg.gated, fn);
    p.gate_bias = param<T, P>(params, "gate_bias", {1}, cfg.gated, fn);
    p.output_kernel = param<T, P>(params, "output_kernel", {H, V}, true, fn);
    p.output_bias = param<T, P>(params, "output_bias", {V}, true, fn);
    return p;
}

static void size_config(DecoderConfig& cfg, const py::dict& params, const py::array& enc, const char* fn) {
    auto dim = [&](const char* name, int axis) -> int {
        const std::string what = std::string(fn) + ": " + name;
        if (!params.contains(name)) throw py::value_error(what + ": missing");
        py::array a = array_arg(params[name], what.c_str());
        if (a.ndim() <= axis) throw py::value_error(what + ": bad rank, shape " + shape_str(a));
        check_index_range(a, what.c_str());
        return (int)a.shape(axis);
    };
    check_index_range(enc, (std::string(fn) + ": enc").c_str());
    cfg.B = (int)enc.shape(0), cfg.S = (int)enc.shape(1), cfg.K = (int)enc.shape(2);
    cfg.E = dim("embeddings", 1), cfg.H = dim("recurrent_kernel", 0), cfg.V = dim("output_kernel", 1);
    cfg.U = cfg.score == ScoreKind::additive ? dim("score_vector", 0) : 0;
    cfg.P = cfg.predictive() ? dim("position_vector", 0) : 0;
    if (cfg.score == ScoreKind::dot && cfg.K != cfg.H)
        throw py::value_error(std::string(fn) + ": the dot score needs encoder outputs of the decoder's size " +
                              std::to_string(cfg.H) + ", got " + std::to_string(cfg.K));
}

// cache[name] as the cache's entry, a ValueError naming it when missing or not an array.
static py::array cache_entry(const py::dict& cache, const char* name) {
    const std::string what = std::string("decoder_backward: cache[\"") + name + "\"]";
    if (!cache.contains(name)) throw py::value_error(what + ": missing (not a decoder_forward cache)");
    const py::object entry = cache[name];
    if (!py::isinstance<py::array>(entry))
        throw py::value_error(what + ": expected an array, got " + py::str(py::type::of(entry)).cast<std::string>());
    return entry.cast<py::array>();
}

// Allocates (into `dict`) or looks up every cache buffer the configuration uses. A looked-up
// buffer must have exactly the shape and dtype the configuration gives it (a crafted or stale cache,
// e.g. from a call with other sizes, is refused instead of read or written out of bounds).
template <class T> static DecoderCache<T> decoder_cache(const DecoderConfig& cfg, py::dict& dict, bool allocate) {
    return decoder_cache_layout<T>(cfg, dict.contains("has_step_mask"),
                                   [&](const char* name, const std::vector<size_t>& shape, auto tag) {
                                       using E = decltype(tag);
                                       const std::vector<py::ssize_t> dims(shape.begin(), shape.end());
                                       if (allocate) dict[name] = new_array<E>(dims);
                                       py::array a = cache_entry(dict, name);
                                       const std::string what = std::string("decoder_backward: cache[\"") + name + "\"]";
                                       check_shape(a, dims, what.c_str());
                                       return inout_ptr<E>(a, what.c_str());
                                   });
}

// first_step + t, the target position of step t, must stay an int.
static void check_first_step(int first_step, py::ssize_t steps, const char* fn) {
    if (first_step < 0 || first_step > kMaxIndex - steps)
        throw py::value_error(std::string(fn) + ": first_step must lie in [0, 2**31 - 1 - T] for T = " +
                              std::to_string(steps) + " target steps, got " + std::to_string(first_step));
}

// A fresh (B, H) copy of an initial state (zeros when not given); (0, H) when the variant has none.
template <class T>
static py::array_t<T> state_copy(const py::object& given, py::ssize_t B, py::ssize_t H, bool used, const char* what) {
    py::array_t<T> out = new_array<T>({used ? B : 0, H});
    T* po = out.mutable_data();
    std::fill(po, po + out.size(), T(0));
    if (used && !given.is_none()) {
        py::array a = array_arg(given, what);
        check_shape(a, {B, H}, what);
        const T* pa = in_ptr<T>(a, what);
        std::copy(pa, pa + B * H, po);
    }
    return out;
}

// A search feeds each step's words to the next step: the output vocabulary must fit the embedding table
static void check_words_are_inputs(const DecoderConfig& cfg, const py::dict& params, const char* fn) {
    const py::ssize_t vocab = params["embeddings"].cast<py::array>().shape(0);
    if (cfg.V > vocab)
        throw py::value_error(std::string(fn) + ": the output vocabulary (output_kernel's " + std::to_string(cfg.V) +
                              " columns) exceeds the embedding table's " + std::to_string(vocab) + " rows");
}

void init_seq2seq(py::module_& m) {
    m.def(
        "decoder_forward",
        [](const std::string& kind, const std::string& score, const std::string& cell, const py::array& ids,
           const py::array& enc, const py::object& source_mask, const py::object& target_mask, const py::array& h0,
           const py::object& c0, const py::object& feed0, const py::dict& params, const py::object& keys,
           int local_window, const std::string& local_mode, int first_step, bool gated, bool hard,
           const py::object& uniforms, bool bf16) {
            DecoderConfig cfg = decoder_config(kind, score, cell, local_window, local_mode, gated, hard);
            cfg.first_step = first_step;
            check_bf16_operands(bf16, enc, "decoder_forward");
            cfg.bf16 = bf16;
            if (!hard && !uniforms.is_none())
                throw py::value_error("decoder_forward: uniforms draw hard attention's regions; give hard=True");
            cfg.sample = !uniforms.is_none();
            return dispatch_float(enc, "decoder_forward: enc", [&](auto tag) -> py::tuple {
                using T = decltype(tag);
                const char* fn = "decoder_forward";
                check_rank(enc, 3, "decoder_forward: enc");
                check_rank(ids, 2, "decoder_forward: ids");
                check_index_range(ids, "decoder_forward: ids");
                size_config(cfg, params, enc, fn);
                check_first_step(first_step, ids.shape(1), fn);
                cfg.T = (int)ids.shape(1);
                const py::ssize_t B = cfg.B, Tn = cfg.T, S = cfg.S, H = cfg.H;
                if (B == 0 || Tn == 0 || S == 0)
                    throw py::value_error("decoder_forward: empty batch, target or source (ids " + shape_str(ids) +
                                          ", enc " + shape_str(enc) + ")");
                check_shape(ids, {B, Tn}, "decoder_forward: ids (batch must match enc's)");
                const DecoderParams<const T*> w = decoder_params<T, const T*>(cfg, params, fn);
                const py::ssize_t vocab = params["embeddings"].cast<py::array>().shape(0);
                const int64_t* pids = ids_ptr(ids, vocab, fn, "ids");
                const T* penc = in_ptr<T>(enc, "decoder_forward: enc");
                const MaskRows source_rows = parse_position_mask(source_mask, B, S, "decoder_forward", "source_mask");
                const uint8_t* psm = source_rows.data;
                const MaskRows target_rows = parse_position_mask(target_mask, B, Tn, "decoder_forward", "target_mask");
                const uint8_t* ptm = target_rows.data;
                const bool lstm = cfg.cell == RNNCell::lstm, luong = cfg.kind == DecoderKind::luong;
                if (lstm == c0.is_none())
                    throw py::value_error("decoder_forward: c0 is given exactly for an LSTM cell");
                if (!luong && !feed0.is_none()) throw py::value_error("decoder_forward: feed0 is a Luong input");
                py::dict cache;
                if (ptm) cache["has_step_mask"] = true;
                DecoderCache<T> c = decoder_cache<T>(cfg, cache, true);
                if (c.uniforms) {
                    py::array u = array_arg(uniforms, "decoder_forward: uniforms");
                    check_shape(u, {B, Tn}, "decoder_forward: uniforms (batch, steps)");
                    const T* pu = in_ptr<T>(u, "decoder_forward: uniforms");
                    for (py::ssize_t i = 0; i < B * Tn; ++i)
                        if (!(pu[i] >= T(0) && pu[i] < T(1)))
                            throw py::value_error("decoder_forward: uniforms must lie in [0, 1), got " +
                                                  std::to_string(pu[i]));
                    for (py::ssize_t b = 0; b < B; ++b)  // time-major, as the kernel reads them
                        for (py::ssize_t t = 0; t < Tn; ++t) c.uniforms[t * B + b] = pu[b * Tn + t];
                }
                bool keys_ready = false;
                if (!keys.is_none() && c.keys) {
                    py::array k = array_arg(keys, "decoder_forward: keys");
                    check_shape(k, {B, S, cfg.Dk()}, "decoder_forward: keys");
                    const T* pk = in_ptr<T>(k, "decoder_forward: keys");
                    std::copy(pk, pk + k.size(), c.keys);
                    keys_ready = true;
                }
                py::array_t<T> h = state_copy<T>(h0, B, H, true, "decoder_forward: h0");
                py::array_t<T> cs = state_copy<T>(c0, B, H, lstm, "decoder_forward: c0");
                py::array_t<T> feed = state_copy<T>(feed0, B, H, luong, "decoder_forward: feed0");
                auto logits = new_array<T>({B, Tn, cfg.V});
                auto weights = new_array<T>({B, Tn, S});
                auto hu = new_array<T>({B, cfg.G()});
                T *pl = logits.mutable_data(), *ph = h.mutable_data(), *pc = lstm ? cs.mutable_data() : nullptr;
                T *pf = luong ? feed.mutable_data() : nullptr, *pw = weights.mutable_data(), *phu = hu.mutable_data();
                {
                    py::gil_scoped_release release;
                    decoder_forward<T>(cfg, pl, ph, pc, pf, c, w, pids, penc, psm, ptm, keys_ready, phu);
                    time_to_batch_major(pw, c.weights, (int)Tn, (int)B, (int)S);  // (B, T, S) for users
                }
                cache["config"] =
                    py::make_tuple(kind, score, cell, local_window, local_mode, first_step, gated, hard, cfg.sample, bf16);
                py::object keys_out = c.keys ? py::object(cache["keys"]) : py::object(py::none());
                py::object c_out = lstm ? py::object(cs) : py::none();
                py::object feed_out = luong ? py::object(feed) : py::none();
                return py::make_tuple(logits, h, c_out, feed_out, weights, keys_out, cache);
            });
        },
        py::arg("kind"), py::arg("score"), py::arg("cell"), py::arg("ids"), py::arg("enc"),
        py::arg("source_mask") = py::none(), py::arg("target_mask") = py::none(), py::arg("h0"),
        py::arg("c0") = py::none(), py::arg("feed0") = py::none(), py::arg("params"), py::arg("keys") = py::none(),
        py::arg("local_window") = -1, py::arg("local_mode") = "m", py::arg("first_step") = 0,
        py::arg("gated") = false, py::arg("hard") = false, py::arg("uniforms") = py::none(), py::arg("bf16") = false,
        "Attention decoder over all target steps (teacher forcing) or one step (T = 1). kind bahdanau|luong, score "
        "additive|general|dot (the ScoreKind), cell gru|lstm. ids (B, T) int64 previous words, enc (B, S, K), masks bool "
        "(True = real), h0 (B, H), c0 (B, H) for LSTM, feed0 (B, H) Luong's previous attentional state, params the "
        "layer's dict, keys: enc W_k from an earlier call (decoding steps), first_step: the target position of "
        "ids[:, 0], local_mode m (p_t = t) or p (predicted from h_t by position_kernel, position_vector). Bahdanau "
        "only: gated multiplies the context by sigmoid(s_{t-1} . gate_kernel + gate_bias); hard attends to one "
        "region per step, drawn with uniforms (B, T) in [0, 1) or the argmax without (cache[\"positions\"] (T, B)). "
        "bf16 (float32 only, mixed_bfloat16): the products over all B * T rows (keys, input gates, logits, and their "
        "gradients in decoder_backward) on bf16 operands with float32 sums. "
        "Returns (logits (B, T, V), h, c, feed, weights (B, T, S), keys, cache).");

    m.def(
        "decoder_backward",
        [](const py::dict& cache, const py::array& dlogits, const py::object& dweights, const py::object& dh,
           const py::object& dc, const py::array& enc, const py::dict& params, const py::dict& grads) {
            const py::object conf = cache.contains("config") ? py::object(cache["config"]) : py::none();
            if (!py::isinstance<py::tuple>(conf) || py::len(conf) != 10)
                throw py::value_error("decoder_backward: cache[\"config\"]: missing or not the 10-tuple of a "
                                      "decoder_forward cache");
            DecoderConfig cfg;
            try {
                cfg = decoder_config(conf[py::int_(0)].cast<std::string>(), conf[py::int_(1)].cast<std::string>(),
                                     conf[py::int_(2)].cast<std::string>(), conf[py::int_(3)].cast<int>(),
                                     conf[py::int_(4)].cast<std::string>(), conf[py::int_(6)].cast<bool>(),
                                     conf[py::int_(7)].cast<bool>());
                cfg.first_step = conf[py::int_(5)].cast<int>();
                cfg.sample = conf[py::int_(8)].cast<bool>();
                cfg.bf16 = conf[py::int_(9)].cast<bool>();
            } catch (const py::cast_error&) {
                throw py::value_error("decoder_backward: cache[\"config\"]: expected (kind, score, cell, "
                                      "local_window, local_mode, first_step, gated, hard, sample, bf16) as decoder_forward "
                                      "writes it");
            }
            return dispatch_float(enc, "decoder_backward: enc", [&](auto tag) -> py::tuple {
                using T = decltype(tag);
                const char* fn = "decoder_backward";
                check_rank(enc, 3, "decoder_backward: enc");
                size_config(cfg, params, enc, fn);
                const py::array cached_ids = cache_entry(cache, "ids");
                check_rank(cached_ids, 2, "decoder_backward: cache[\"ids\"]");
                check_index_range(cached_ids, "decoder_backward: cache[\"ids\"]");
                check_first_step(cfg.first_step, cached_ids.shape(0), fn);
                cfg.T = (int)cached_ids.shape(0);
                const py::ssize_t B = cfg.B, Tn = cfg.T, S = cfg.S, H = cfg.H, K = cfg.K;
                const bool lstm = cfg.cell == RNNCell::lstm;
                const DecoderParams<const T*> w = decoder_params<T, const T*>(cfg, params, fn);
                const DecoderParams<T*> dw = decoder_params<T, T*>(cfg, grads, "decoder_backward: grads");
                py::dict cache_mut = cache;
                DecoderCache<T> c = decoder_cache<T>(cfg, cache_mut, false);
                const py::ssize_t vocab = params["embeddings"].cast<py::array>().shape(0);
                ids_ptr(cached_ids, vocab, fn, "cache[\"ids\"]");
                // the ids index the gradient's rows too (a smaller table was written past its end)
                check_shape(grads["embeddings"].cast<py::array>(), {vocab, cfg.E}, "decoder_backward: grads: embeddings");
                check_shape(dlogits, {B, Tn, cfg.V}, "decoder_backward: dlogits");
                const T* pdl = in_ptr<T>(dlogits, "decoder_backward: dlogits");
                const T* pdw = optional_in_ptr<T>(dweights, {B, Tn, S}, "decoder_backward: dweights");
                const T* penc = in_ptr<T>(enc, "decoder_backward: enc");
                py::array_t<T> dh0 = state_copy<T>(dh, B, H, true, "decoder_backward: dh");
                py::array_t<T> dc0 = state_copy<T>(dc, B, H, lstm, "decoder_backward: dc");
                auto denc = new_array<T>({B, S, K});
                T *pde = denc.mutable_data(), *pdh = dh0.mutable_data(), *pdc = lstm ? dc0.mutable_data() : nullptr;
                {
                    py::gil_scoped_release release;
                    decoder_backward<T>(cfg, pde, pdh, pdc, dw, pdl, pdw, c, w, penc);
                }
                return py::make_tuple(denc, dh0, lstm ? py::object(dc0) : py::none());
            });
        },
        py::arg("cache"), py::arg("dlogits"), py::arg("dweights") = py::none(), py::arg("dh") = py::none(),
        py::arg("dc") = py::none(), py::arg("enc"), py::arg("params"), py::arg("grads"),
        "Backward of decoder_forward: dweights (B, T, S) is a gradient of the attention weights (or None). Returns "
        "(denc (B, S, K), dh0 (B, H), dc0 or None); parameter gradients accumulate into grads.");

    m.def(
        "search_attention_decoder",
        [](const std::string& kind, const std::string& score, const std::string& cell, const py::array& enc,
           const py::object& source_mask, const py::array& h0, const py::object& c0, const py::dict& params,
           int local_window, const std::string& local_mode, bool gated, bool hard, int64_t start_id, int64_t end_id,
           int width, double length_penalty, int max_length, bool return_attention, bool exact_scores) {
            DecoderConfig cfg = decoder_config(kind, score, cell, local_window, local_mode, gated, hard);
            return dispatch_float(enc, "search_attention_decoder: enc", [&](auto tag) -> py::tuple {
                using T = decltype(tag);
                const char* fn = "search_attention_decoder";
                check_rank(enc, 3, "search_attention_decoder: enc");
                size_config(cfg, params, enc, fn);
                cfg.T = 1;
                const py::ssize_t B = cfg.B, S = cfg.S, H = cfg.H;
                if (B == 0 || S == 0)
                    throw py::value_error("search_attention_decoder: empty batch or source, enc " + shape_str(enc));
                const DecoderParams<const T*> w = decoder_params<T, const T*>(cfg, params, fn);
                check_words_are_inputs(cfg, params, fn);
                const SearchConfig search = search_config(fn, B, cfg.V, start_id, end_id, width, length_penalty,
                                                          max_length, return_attention);
                const T* penc = in_ptr<T>(enc, "search_attention_decoder: enc");
                const MaskRows source_rows = parse_position_mask(source_mask, B, S, fn, "source_mask");
                const bool lstm = cfg.cell == RNNCell::lstm;
                if (lstm == c0.is_none())
                    throw py::value_error("search_attention_decoder: c0 is given exactly for an LSTM cell");
                py::array_t<T> h = state_copy<T>(h0, B, H, true, "search_attention_decoder: h0");
                py::array_t<T> cs = state_copy<T>(c0, B, H, lstm, "search_attention_decoder: c0");
                const T* ph = h.data();
                const T* pc = lstm ? cs.data() : nullptr;
                SearchResult<T> result;
                {
                    py::gil_scoped_release release;
                    AttentionDecoderSearchStep<T> step(cfg, (int)B * width, w, ph, pc, penc, source_rows.data,
                                                      width == 1 && !exact_scores);
                    result = attnx::search(step, search);
                }
                return search_result_tuple(result, return_attention, false);
            });
        },
        py::arg("kind"), py::arg("score"), py::arg("cell"), py::arg("enc"), py::arg("source_mask") = py::none(),
        py::arg("h0"), py::arg("c0") = py::none(), py::arg("params"), py::arg("local_window") = -1,
        py::arg("local_mode") = "m", py::arg("gated") = false, py::arg("hard") = false, py::arg("start_id"),
        py::arg("end_id"), py::arg("width"), py::arg("length_penalty"), py::arg("max_length"),
        py::arg("return_attention"), py::arg("exact_scores") = true,
        "Greedy decoding (width 1) or beam search (search.hpp) of a whole batch in one call over an attention "
        "decoder's steps (decoder_forward, T = 1; hard attention attends to each step's most likely region). Returns "
        "(tokens (B, W, steps), lengths (B, W), scores (B, W), scores / length penalty (B, W), attention "
        "(B, W, steps, S) or None), each input's beams best first. exact_scores=False (greedy decoding that "
        "discards the scores): a float32 row's output layer is screened in int8 (seq2seq.hpp's OutputScreen), "
        "the words unchanged, the scores within its bound.");
    m.def(
        "seq2seq_greedy",
        [](const py::array& source, const py::array& encoder_embeddings, const py::array& encoder_kernel,
           const py::array& encoder_recurrent_kernel, const py::array& encoder_bias, bool encoder_bf16,
           const std::string& kind, const std::string& score, const std::string& cell, const py::dict& params,
           int local_window, const std::string& local_mode, bool gated, bool hard, int64_t start_id, int64_t end_id,
           int max_length) {
            const char* fn = "seq2seq_greedy";
            DecoderConfig cfg = decoder_config(kind, score, cell, local_window, local_mode, gated, hard);
            RNNConfig encoder;  // Seq2Seq's Encoder: tanh / sigmoid, GRU reset_after, the decoder's cell
            encoder.cell = cfg.cell;
            return dispatch_float(encoder_embeddings, "seq2seq_greedy: encoder_embeddings", [&](auto tag) -> py::tuple {
                using T = decltype(tag);
                check_rank(source, 2, "seq2seq_greedy: source");
                check_rank(encoder_embeddings, 2, "seq2seq_greedy: encoder_embeddings");
                check_rank(encoder_recurrent_kernel, 2, "seq2seq_greedy: encoder_recurrent_kernel");
                const py::ssize_t B = source.shape(0), S = source.shape(1), E = encoder_embeddings.shape(1);
                const py::ssize_t H = encoder_recurrent_kernel.shape(0), G = (py::ssize_t)encoder.gates() * H;
                if (B == 0 || S == 0)
                    throw py::value_error("seq2seq_greedy: empty batch or source, source " + shape_str(source));
                encoder.B = (int)B, encoder.T = (int)S, encoder.C = (int)E, encoder.H = (int)H;
                check_shape(encoder_kernel, {E, G}, "seq2seq_greedy: encoder_kernel");
                check_shape(encoder_recurrent_kernel, {H, G}, "seq2seq_greedy: encoder_recurrent_kernel");
                const bool gru = cfg.cell == RNNCell::gru, lstm = !gru;
                check_shape(encoder_bias, gru ? std::vector<py::ssize_t>{2, G} : std::vector<py::ssize_t>{G},
                            "seq2seq_greedy: encoder_bias");
                const int64_t* pids = ids_ptr(source, encoder_embeddings.shape(0), fn, "source");
                const T* pe = in_ptr<T>(encoder_embeddings, "seq2seq_greedy: encoder_embeddings");
                const T* pw = in_ptr<T>(encoder_kernel, "seq2seq_greedy: encoder_kernel");
                const T* pu = in_ptr<T>(encoder_recurrent_kernel, "seq2seq_greedy: encoder_recurrent_kernel");
                const T* pb = in_ptr<T>(encoder_bias, "seq2seq_greedy: encoder_bias");
                if (encoder_bf16 && !std::is_same_v<T, float>)
                    throw py::type_error("seq2seq_greedy: encoder_bf16 needs float32 weights");
                py::array_t<T> enc = new_array<T>({B, S, H});  // the decoder's sizes read its shape
                size_config(cfg, params, enc, fn);
                cfg.T = 1;
                if (cfg.H != H)
                    throw py::value_error("seq2seq_greedy: the encoder's state (" + std::to_string(H) +
                                          " units) must have the decoder's size " + std::to_string(cfg.H));
                const DecoderParams<const T*> w = decoder_params<T, const T*>(cfg, params, fn);
                check_words_are_inputs(cfg, params, fn);
                const SearchConfig search = search_config(fn, B, cfg.V, start_id, end_id, 1, 0.0, max_length, true);
                std::vector<T> h((size_t)B * H), c(lstm ? (size_t)B * H : 0);
                std::vector<uint8_t> mask((size_t)B * S);
                T* penc = enc.mutable_data();
                SearchResult<T> result;
                {
                    py::gil_scoped_release release;
                    encode_source<T>(encoder, encoder_bf16, penc, h.data(), lstm ? c.data() : nullptr, mask.data(),
                                     pids, pe, pw, pu, pb, gru ? pb + G : nullptr);
                    AttentionDecoderSearchStep<T> step(cfg, (int)B, w, h.data(), lstm ? c.data() : nullptr, penc,
                                                      mask.data(), true);
                    result = attnx::search(step, search);
                }
                return search_result_tuple(result, true, false);
            });
        },
        py::arg("source"), py::arg("encoder_embeddings"), py::arg("encoder_kernel"),
        py::arg("encoder_recurrent_kernel"), py::arg("encoder_bias"), py::arg("encoder_bf16") = false,
        py::arg("kind"), py::arg("score"), py::arg("cell"), py::arg("params"), py::arg("local_window") = -1,
        py::arg("local_mode") = "m", py::arg("gated") = false, py::arg("hard") = false, py::arg("start_id"),
        py::arg("end_id"), py::arg("max_length"),
        "Seq2Seq's greedy translation of source ids (B, S) int64 (0 = padding) in one call: its encoder (the "
        "embedding, then a GRU (reset_after) or LSTM, the decoder's cell, with tanh / sigmoid, over the real "
        "steps; encoder_bias (2, G) for GRU, (G,) for LSTM; encoder_bf16: its products in bf16 as under "
        "mixed_bfloat16) and the decoder's greedy search (search_attention_decoder with width 1 and "
        "exact_scores=False). Returns search_attention_decoder's tuple.");
}

}  // namespace attnx::bind
