// search.hpp against brute force: greedy decoding and beam search on a toy step functor (a table
// of logits per sentence, position and previous token, with ties), in float and double on every
// SIMD level and thread split; the hypotheses' tokens, lengths, scores, attention, and rows leaving
// the batch. Then the search over DecoderSearchStep (decoder_step.hpp) against the same brute
// force run on the reference decoder stack (cpp/reference/decoder_step.hpp) in double, with float
// and with int8 kernels (a quantized model).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attnx/decoder_step.hpp"
#include "attnx/search.hpp"
#include "reference/decoder_step.hpp"
#include "reference/quantized.hpp"
#include "int8_check.hpp"
#include "reference_check.hpp"

using namespace attnx;
using namespace attnx::test;

namespace {

// a failed check, named; the first 20 printed
#define CHECK_MSG(cond, what)                                                                       \
    do {                                                                                            \
        if (!(cond)) {                                                                              \
            if (attnx::test::failures() < 20) std::printf("FAIL %s\n", std::string(what).c_str()); \
            ++attnx::test::failures();                                                              \
        }                                                                                           \
    } while (0)

// logits = table[sentence, position, previous token, :]; attention: one-hot of the previous token
// over V "source" positions (one head). Records the rows of each step.
template <class L> struct TableStep {
    using logits_type = L;
    using attention_type = L;
    const std::vector<double>& table;  // (sentences, positions, V, V)
    int positions, V;
    std::vector<int32_t> sentence;  // each state row's
    std::vector<L> logits, weights;
    std::vector<int> rows_per_step;

    TableStep(const std::vector<double>& t, int sentences, int positions_, int V_)
        : table(t), positions(positions_), V(V_), sentence(sentences) {
        for (int s = 0; s < sentences; ++s) sentence[s] = s;
    }
    const L* step(const int64_t* ids, int rows, int position) {
        rows_per_step.push_back(rows);
        logits.assign((size_t)rows * V, L(0)), weights.assign((size_t)rows * V, L(0));
        for (int r = 0; r < rows; ++r) {
            const double* row = table.data() + (((size_t)sentence[r] * positions + position) * V + ids[r]) * V;
            for (int v = 0; v < V; ++v) logits[(size_t)r * V + v] = L(row[v]);
            weights[(size_t)r * V + ids[r]] = L(1);
        }
        return logits.data();
    }
    const L* attention() const { return weights.data(); }
    int attention_heads() const { return 1; }
    int attention_keys() const { return V; }
    int vocab() const { return V; }
    void select(const int32_t* rows, int count) {
        std::vector<int32_t> picked((size_t)count);
        for (int j = 0; j < count; ++j) picked[j] = sentence[rows[j]];
        sentence.swap(picked);
    }
};

struct Hyp {
    std::vector<int64_t> tokens;  // the start token, then the words (0 after the end token)
    double score;
    bool done;
};

// The plain beam search of one input (the rule of search.hpp's header): logp(t, prev) gives the
// log probabilities of the next word; returns the width hypotheses as (words with the end token,
// length, score, normalized), best first.
template <class LogP>
std::vector<std::pair<Hyp, int>> brute_force(LogP&& logp, int64_t start, int64_t end, int width, int max_length) {
    std::vector<Hyp> beams{{{start}, 0.0, false}};
    for (int t = 0; t < max_length; ++t) {
        std::vector<Hyp> candidates;
        for (const Hyp& h : beams) {
            if (h.done) {
                Hyp next = h;
                next.tokens.push_back(0);
                candidates.push_back(next);
                continue;
            }
            const std::vector<double> lp = logp(t, h.tokens);
            for (size_t v = 0; v < lp.size(); ++v) {
                Hyp next = h;
                next.tokens.push_back((int64_t)v);
                next.score += lp[v];
                next.done = (int64_t)v == end;
                candidates.push_back(next);
            }
        }
        std::stable_sort(candidates.begin(), candidates.end(), [](const Hyp& a, const Hyp& b) { return a.score > b.score; });
        candidates.resize(width);
        beams = candidates;
        if (std::all_of(beams.begin(), beams.end(), [](const Hyp& h) { return h.done; })) break;
    }
    std::vector<std::pair<Hyp, int>> out;
    for (const Hyp& h : beams) {
        int length = (int)h.tokens.size() - 1;
        for (size_t i = 1; i < h.tokens.size(); ++i)
            if (h.tokens[i] == end) {
                length = (int)i;
                break;
            }
        out.emplace_back(h, length);
    }
    return out;
}

std::vector<double> log_softmax(const std::vector<double>& logits) {
    double top = -INFINITY, sum = 0;
    for (double l : logits) top = std::max(top, l);
    for (double l : logits) sum += std::exp(l - top);
    std::vector<double> out;
    for (double l : logits) out.push_back(l - top - std::log(sum));
    return out;
}

// search's result against brute force for every input: tokens, lengths, scores (normalized too),
// and the attention (the table step's one-hot of each step's previous token)
template <class A, class LogP>
void check_against_brute_force(const SearchResult<A>& got, LogP&& logp_of, const SearchConfig& c, double tol,
                               bool with_attention, const std::string& where) {
    for (int b = 0; b < c.batch; ++b) {
        auto want = brute_force([&](int t, const std::vector<int64_t>& history) { return logp_of(b, t, history); },
                                c.start_id, c.end_id, c.width, c.max_length);
        std::vector<double> normalized;
        for (auto& [h, n] : want) normalized.push_back(h.score / length_penalty(n, c.alpha));
        std::vector<int> rank(want.size());
        for (size_t i = 0; i < rank.size(); ++i) rank[i] = (int)i;
        std::stable_sort(rank.begin(), rank.end(), [&](int x, int y) { return normalized[x] > normalized[y]; });
        for (int r = 0; r < c.width; ++r) {
            const auto& [h, n] = want[rank[r]];
            const size_t o = (size_t)b * c.width + r;
            const std::string at = where + " input " + std::to_string(b) + " beam " + std::to_string(r);
            CHECK_MSG(got.lengths[o] == n, at + " length");
            for (int t = 0; t < n && t < got.steps; ++t)
                CHECK_MSG(got.tokens[o * got.steps + t] == h.tokens[t + 1], at + " token " + std::to_string(t));
            for (int t = n; t < got.steps; ++t) CHECK_MSG(got.tokens[o * got.steps + t] == 0, at + " padding");
            CHECK_MSG(std::abs(got.scores[o] - h.score) <= tol * (1 + std::abs(h.score)), at + " score");
            CHECK_MSG(std::abs(got.normalized[o] - normalized[rank[r]]) <= tol * (1 + std::abs(normalized[rank[r]])),
                      at + " normalized score");
            if (!with_attention) continue;
            // (heads = 1, steps, keys): the one-hot of the previous token at each of its steps, 0 after
            for (int t = 0; t < got.steps; ++t)
                for (int k = 0; k < got.keys; ++k) {
                    const double w = t < n && h.tokens[t] == k ? 1.0 : 0.0;
                    CHECK_MSG((double)got.attention[(o * got.steps + t) * got.keys + k] == w, at + " attention");
                }
        }
    }
}

std::vector<double> random_table(std::mt19937& rng, int sentences, int positions, int V, bool ties) {
    std::vector<double> table((size_t)sentences * positions * V * V);
    std::normal_distribution<double> normal(0.0, 2.0);
    std::uniform_int_distribution<int> small(0, 2);
    for (auto& e : table) e = ties ? small(rng) : (double)(float)normal(rng);  // floats hold them exactly
    return table;
}

void test_table(int sentences, int V, int width, double alpha, int max_length, bool ties, int64_t end, unsigned seed) {
    std::mt19937 rng(seed);
    const int positions = max_length;
    auto table = random_table(rng, sentences, positions, V, ties);
    if (!ties)  // some inputs end early: their rows leave the batch
        for (int s = 0; s < sentences / 2; ++s)
            for (int p = 1; p < positions; ++p)
                for (int prev = 0; prev < V; ++prev)
                    if (end < V) table[(((size_t)s * positions + p) * V + prev) * V + end] += 6;
    SearchConfig c;
    c.batch = sentences, c.width = width, c.max_length = max_length, c.start_id = 1, c.end_id = end, c.alpha = alpha;
    auto logp_of = [&](int b, int t, const std::vector<int64_t>& history) {
        const double* row = table.data() + (((size_t)b * positions + t) * V + history.back()) * V;
        return log_softmax(std::vector<double>(row, row + V));
    };
    char where[160];
    std::snprintf(where, sizeof where, "search table B=%d V=%d width=%d alpha=%.1f L=%d%s", sentences, V, width, alpha,
                  max_length, ties ? " ties" : "");
    on_every_level_and_split([&](const std::string& level) {
        for (bool with_attention : {true, false}) {
            c.attention = with_attention;
            TableStep<double> exact(table, sentences, positions, V);
            check_against_brute_force(search(exact, c), logp_of, c, 1e-12, with_attention,
                                      std::string(where) + " double " + level);
            TableStep<float> rounded(table, sentences, positions, V);
            check_against_brute_force(search(rounded, c), logp_of, c, 1e-5, with_attention,
                                      std::string(where) + " float " + level);
            // the first step runs one row per input, then width per input still decoding
            CHECK_MSG(exact.rows_per_step[0] == sentences, std::string(where) + " first step rows");
            for (size_t t = 2; t < exact.rows_per_step.size(); ++t)
                CHECK_MSG(exact.rows_per_step[t] <= exact.rows_per_step[t - 1] && exact.rows_per_step[t] % width == 0,
                          std::string(where) + " rows leave the batch");
        }
    });
}

// ------------------------------------------------------------------------ the decoder stack's search
struct StackModel {
    int layers, D, H, F, S, V, B, capacity;
    std::vector<std::vector<double>> arrays;  // per layer 22 (empty: null)
    std::vector<double> cross_keys, cross_values, embedding, positions, gamma, beta, kernel, bias;
    std::vector<uint8_t> mask;
    // a quantized model (make_int8): the kernels int8 (per layer 22 slots, null for the others), the
    // output kernel too, the embedding int8 per row (`embedding` then holds q s as the kernel reads it)
    std::vector<std::shared_ptr<Int8Kernel>> owned;
    std::vector<const Int8Kernel*> int8;
    const Int8Kernel* output_int8 = nullptr;
    std::vector<int8_t> embedding_q;
    std::vector<float> embedding_scale;
};

StackModel make_stack(std::mt19937& rng, int layers, int D, int H, int F, int S, int V, int B, int capacity) {
    StackModel m{layers, D, H, F, S, V, B, capacity, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}};
    const double scale = 1.0 / std::sqrt((double)D);
    auto gamma = [&]() {
        auto g = random_values(rng, D, 0.1);
        for (auto& e : g) e = (double)(float)(e + 1.0);
        return g;
    };
    for (int l = 0; l < layers; ++l) {
        m.arrays.push_back(gamma()), m.arrays.push_back(random_values(rng, D, 0.1));
        for (int i = 0; i < 4; ++i) m.arrays.push_back(random_values(rng, (size_t)D * D, scale)), m.arrays.push_back(random_values(rng, D, 0.1));
        m.arrays.push_back(gamma()), m.arrays.push_back(random_values(rng, D, 0.1));
        for (int i = 0; i < 2; ++i) m.arrays.push_back(random_values(rng, (size_t)D * D, scale)), m.arrays.push_back(random_values(rng, D, 0.1));
        m.arrays.push_back(gamma()), m.arrays.push_back(random_values(rng, D, 0.1));
        m.arrays.push_back(random_values(rng, (size_t)D * F, scale)), m.arrays.push_back(random_values(rng, F, 0.1));
        m.arrays.push_back(random_values(rng, (size_t)F * D, 1.0 / std::sqrt((double)F))), m.arrays.push_back(random_values(rng, D, 0.1));
    }
    m.cross_keys = random_values(rng, (size_t)layers * B * S * D);
    m.cross_values = random_values(rng, (size_t)layers * B * S * D);
    m.embedding = random_values(rng, (size_t)V * D, 0.5);
    m.positions = random_values(rng, (size_t)capacity * D, 0.5);
    m.gamma = gamma(), m.beta = random_values(rng, D, 0.1);
    m.kernel = random_values(rng, (size_t)D * V, 3 * scale), m.bias = random_values(rng, V, 0.5);
    m.mask.assign((size_t)B * S, 1);
    for (int s = S / 2; s < S; ++s) m.mask[s] = 0;  // input 0: padded
    if (B > 2) m.mask[(size_t)S + S - 1] = 0;        // input 1: its last position (another batch's cut)
    return m;
}

// m quantized as Model.quantize("int8") does: every kernel and the output per column, the embedding per row
void make_int8(StackModel& m) {
    m.int8.assign(m.arrays.size(), nullptr);
    for (int l = 0; l < m.layers; ++l)
        for (int slot : {2, 4, 6, 8, 12, 14, 18, 20}) {
            const int K = slot == 20 ? m.F : m.D, N = slot == 18 ? m.F : m.D;
            m.owned.push_back(quantize_kernel(m.arrays[(size_t)l * 22 + slot], K, N));
            m.int8[(size_t)l * 22 + slot] = m.owned.back().get();
        }
    m.owned.push_back(quantize_kernel(m.kernel, m.D, m.V));
    m.output_int8 = m.owned.back().get();
    m.embedding_q.resize(m.embedding.size()), m.embedding_scale.resize(m.V);
    std::vector<float> row(m.D);
    for (int v = 0; v < m.V; ++v) {
        for (int d = 0; d < m.D; ++d) row[d] = (float)m.embedding[(size_t)v * m.D + d];
        m.embedding_scale[v] = reference::quantize_row_int8(m.embedding_q.data() + (size_t)v * m.D, row.data(), m.D);
        for (int d = 0; d < m.D; ++d)
            m.embedding[(size_t)v * m.D + d] = (float)m.embedding_q[(size_t)v * m.D + d] * m.embedding_scale[v];
    }
}

template <class T>
std::vector<DecoderLayerWeights<T>> layer_pointers(const std::vector<std::vector<T>>& arrays,
                                                   const std::vector<const Int8Kernel*>& int8) {
    std::vector<DecoderLayerWeights<T>> out(arrays.size() / 22);
    for (size_t l = 0; l < out.size(); ++l) {
        const T* p[22];
        for (int i = 0; i < 22; ++i) p[i] = arrays[l * 22 + i].empty() ? nullptr : arrays[l * 22 + i].data();
        out[l] = decoder_layer_weights<T>(p, int8.empty() ? nullptr : int8.data() + l * 22);
    }
    return out;
}

// log p of the next word of input b after `history` (the start token first), by the reference
// stack in double: every position of the history run again from an empty cache
std::vector<double> reference_logp(const StackModel& m, const DecoderStepConfig& base, bool tied, int b,
                                   const std::vector<int64_t>& history) {
    const auto layers = layer_pointers<double>(m.arrays, m.int8);
    const int D = m.D, t_end = (int)history.size();
    std::vector<double> keys((size_t)m.layers * m.capacity * D), values(keys.size()), x(D), h(D), logits(m.V);
    int32_t row = b;
    for (int t = 0; t < t_end; ++t) {
        for (int d = 0; d < D; ++d)
            x[d] = m.embedding[(size_t)history[t] * D + d] * std::sqrt((double)D) + m.positions[(size_t)t * D + d];
        DecoderStepConfig c = base;
        c.N = 1, c.position = t, c.memory_rows = &row, c.memory_batch = m.B;
        reference::decoder_stack_step(x.data(), keys.data(), values.data(), nullptr, m.cross_keys.data(),
                                      m.cross_values.data(), m.mask.data(), layers.data(), c);
    }
    double mean, rstd;
    reference::layernorm_forward(h.data(), &mean, &rstd, x.data(), m.gamma.data(), m.beta.data(), 1, D, 1e-5);
    if (m.output_int8) {
        reference::step_product(logits.data(), h.data(), StepLinear<double>{nullptr, m.output_int8, m.bias.data()}, 1,
                                D, m.V);
        return log_softmax(logits);
    }
    for (int v = 0; v < m.V; ++v) {
        double z = tied ? 0.0 : m.bias[v];
        for (int d = 0; d < D; ++d) z += h[d] * (tied ? m.embedding[(size_t)v * D + d] : m.kernel[(size_t)d * m.V + v]);
        logits[v] = z;
    }
    return log_softmax(logits);
}

// int8: the model quantized (make_int8; not tied: a quantized Transformer refuses tie_output), in float only
void test_decoder_stack_search(int layers, int D, int H, int F, int S, int V, int B, int width, int max_length,
                               bool norm_first, bool tied, unsigned seed, bool int8 = false) {
    std::mt19937 rng(seed);
    StackModel m = make_stack(rng, layers, D, H, F, S, V, B, max_length);
    if (int8) make_int8(m);
    DecoderStepConfig c;
    c.layers = layers, c.D = D, c.H = H, c.F = F, c.S = S, c.capacity = max_length, c.norm_first = norm_first;
    c.N = B * width, c.memory_batch = B;
    SearchConfig sc;
    sc.batch = B, sc.width = width, sc.max_length = max_length, sc.start_id = 1, sc.end_id = 2, sc.alpha = 0.6;
    char where[160];
    std::snprintf(where, sizeof where, "search decoder stack layers=%d D=%d V=%d B=%d width=%d%s%s%s", layers, D, V, B,
                  width, norm_first ? " pre-norm" : "", tied ? " tied" : "", int8 ? " int8" : "");
    auto logp_of = [&](int b, int, const std::vector<int64_t>& history) { return reference_logp(m, c, tied, b, history); };
    on_every_level_and_split([&](const std::string& level) {
        auto run = [&](auto tag) {
            using T = decltype(tag);
            std::vector<std::vector<T>> arrays;
            for (size_t i = 0; i < m.arrays.size(); ++i)
                arrays.push_back(int8 && m.int8[i] ? std::vector<T>{} : cast<T>(m.arrays[i]));
            const auto fast_layers = layer_pointers<T>(arrays, m.int8);
            const auto ck = cast<T>(m.cross_keys), cv = cast<T>(m.cross_values), e = cast<T>(m.embedding);
            const auto p = cast<T>(m.positions), g = cast<T>(m.gamma), be = cast<T>(m.beta);
            const auto k = cast<T>(m.kernel), bi = cast<T>(m.bias);
            DecoderEnds<T> ends;
            ends.embedding = e.data(), ends.embedding_scale = T(std::sqrt((double)D)), ends.positions = p.data();
            ends.norm_gamma = g.data(), ends.norm_beta = be.data(), ends.vocab = V;
            if (!tied) ends.output = {k.data(), nullptr, bi.data()};
            if (int8) {
                ends.embedding = nullptr, ends.embedding_int8 = m.embedding_q.data();
                ends.embedding_row_scale = m.embedding_scale.data();
                ends.output = {nullptr, m.output_int8, bi.data()};
            }
            const std::string at = std::string(where) + (sizeof(T) == 4 ? " float " : " double ") + level;
            auto make_step = [&] {
                return std::make_unique<DecoderSearchStep<T>>(fast_layers.data(), c, ck.data(), cv.data(),
                                                              m.mask.data(), ends, false);
            };
            const SearchResult<T> alone = search(*make_step(), sc);
            check_against_brute_force(alone, logp_of, sc, sizeof(T) == 4 ? 1e-3 : 1e-9, false, at);
            // two searches alive at once on the thread (a nested one, as a Python step's, runs on caches of
            // its own; the first on the thread's kept ones, last written by another search): the same bits
            auto outer = make_step(), inner = make_step();
            for (const SearchResult<T>& again : {search(*inner, sc), search(*outer, sc)}) {
                CHECK_MSG(again.tokens == alone.tokens, at + " tokens of two searches at once");
                CHECK_MSG(again.scores == alone.scores, at + " scores of two searches at once");
            }
            // the inputs `batch` at a time in one call (search_decoder_batches): each batch's results those of
            // a search of its own on its memory rows cut after their last real position, bit for bit
            for (int batch : {1, 2, B}) {  // B: every row in one search (16 rows and more read packed kernels)
                SearchConfig with = sc;
                with.attention = true;
                const SearchResult<T> all =
                    search_decoder_batches<T>(fast_layers.data(), c, ck.data(), cv.data(), m.mask.data(), ends, with, batch);
                const std::string in = at + " batches of " + std::to_string(batch);
                CHECK_MSG(all.batch == B && all.keys == S && (int)all.scores.size() == B * width, in + " sizes");
                for (int b0 = 0; b0 < B; b0 += batch) {
                    const int n = std::min(batch, B - b0);
                    int cut = 1;
                    for (int b = b0; b < b0 + n; ++b)
                        for (int s = 0; s < S; ++s)
                            if (m.mask[(size_t)b * S + s]) cut = std::max(cut, s + 1);
                    std::vector<T> keys, values;
                    std::vector<uint8_t> mask;
                    for (int l = 0; l < layers; ++l)
                        for (int b = b0; b < b0 + n; ++b)
                            for (int s = 0; s < cut; ++s)
                                for (int d = 0; d < D; ++d) {
                                    keys.push_back(ck[(((size_t)l * B + b) * S + s) * D + d]);
                                    values.push_back(cv[(((size_t)l * B + b) * S + s) * D + d]);
                                }
                    for (int b = b0; b < b0 + n; ++b)
                        for (int s = 0; s < cut; ++s) mask.push_back(m.mask[(size_t)b * S + s]);
                    DecoderStepConfig cc = c;
                    cc.N = n * width, cc.memory_batch = n, cc.S = cut;
                    SearchConfig one = with;
                    one.batch = n;
                    DecoderSearchStep<T> step(fast_layers.data(), cc, keys.data(), values.data(), mask.data(), ends,
                                              true);
                    const SearchResult<T> part = search(step, one);
                    for (int r = 0; r < n * width; ++r) {
                        const size_t row = (size_t)b0 * width + r;
                        CHECK_MSG(all.scores[row] == part.scores[r] && all.normalized[row] == part.normalized[r] &&
                                      all.lengths[row] == part.lengths[r], in + " scores");
                        for (int t = 0; t < all.steps; ++t) {
                            CHECK_MSG(all.tokens[row * all.steps + t] == (t < part.steps ? part.tokens[r * part.steps + t] : 0),
                                      in + " tokens");
                            for (int h = 0; h < H; ++h)
                                for (int s = 0; s < S; ++s) {
                                    const T want = t < part.steps && s < cut
                                        ? part.attention[(((size_t)r * H + h) * part.steps + t) * cut + s] : T(0);
                                    CHECK_MSG(all.attention[(((row * H) + h) * all.steps + t) * S + s] == want,
                                              in + " attention");
                                }
                        }
                    }
                }
            }
        };
        run(float{});
        if (!int8) run(double{});
    });
}

}  // namespace

int main() {
    unsigned seed = 1;
    for (bool ties : {false, true})
        for (int width : {1, 2, 3, 5}) test_table(4, 5, width, width == 3 ? 0.6 : 0.0, 6, ties, 2, seed++);
    test_table(1, 4, 4, 0.0, 2, true, 3, seed++);   // every word equally likely: the lowest ids of the earliest beams
    test_table(3, 3, 3, 0.0, 2, false, 8, seed++);  // no end token in the vocabulary: cut at max_length
    test_table(7, 40, 4, 1.0, 5, false, 2, seed++); // a wider vocabulary (the vectorized rows)
    test_table(2, 20, 18, 0.2, 3, false, 2, seed++); // width > 16: the partial sort
    // the decoder stack: odd sizes (BLAS products) and whole vectors (the in-place tiles)
    test_decoder_stack_search(2, 12, 3, 17, 5, 11, 3, 1, 5, false, false, seed++);
    test_decoder_stack_search(2, 12, 3, 17, 5, 11, 3, 3, 5, true, true, seed++);
    test_decoder_stack_search(1, 32, 4, 48, 6, 64, 2, 4, 4, true, false, seed++);
    test_decoder_stack_search(2, 16, 2, 32, 4, 48, 5, 2, 4, false, false, seed++);
    // 18 rows a step: search_decoder_batches packs the float kernels once (kPackedStepRows), bit for bit
    // the in-place steps (D 64: a narrowed last panel)
    test_decoder_stack_search(1, 64, 4, 96, 5, 96, 6, 3, 4, true, false, seed++);
    // quantized: int8 kernels, output projection and embedding rows (the int8 Transformer's search)
    test_decoder_stack_search(2, 32, 4, 48, 6, 64, 2, 1, 5, true, false, seed++, true);
    test_decoder_stack_search(2, 32, 4, 48, 5, 48, 3, 3, 4, false, false, seed++, true);
    return attnx::test::report("test_search");
}
