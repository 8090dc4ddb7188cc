// The one search of every translator (ARCHITECTURE.md, "Where each layer's math lives", its
// paragraph Decoding): greedy decoding (width 1) and batched beam search over a step functor,
// CTranslate2's design (one decoder step, the search over it, all in C++). The inputs' `width`
// hypotheses run as rows of one step; an input leaves the batch once all its beams have ended, so
// the remaining steps run on fewer rows.
//
// The rule (python/attnx/decoding.py documents it for users): every step extends each live
// hypothesis by every word and keeps, per input, the `width` best totals (summed log
// probabilities), ties to the earliest beam, then the lowest id; a finished hypothesis stays in its
// beam, extended by padding (id 0) at no cost. The first step runs one row per input (all beams
// start identical). Final scores are divided by GNMT's length penalty ((5 + len) / 6) ** alpha, len
// counting the end token. Width 1 is greedy decoding: the argmax of each row, a row leaving at its
// end token.
//
// A step functor `Step` has
//   using logits_type, attention_type;
//   const logits_type* step(const int64_t* ids, int rows, int position);  // logits (rows, vocab) of
//       the next token of `rows` state rows fed `ids` at `position`, valid until the next call
//   int vocab() const;  // the logits' width (>= the search's width), valid after the first step
//   const attention_type* attention() const;  // the last step's (rows, heads, keys), when asked for
//   int attention_heads() const, attention_keys() const;  // valid after the first step
//   void select(const int32_t* rows, int count);  // the state keeps those rows in that order
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "attnx/loss.hpp"
#include "attnx/parallel.hpp"

namespace attnx {

// The longest decoding a search runs (CTranslate2's max_decoding_length default): a file or a call
// sets max_length, and the search allocates and runs that many steps. attnx.decoding.MAX_DECODING_LENGTH.
constexpr int kMaxDecodingLength = 1024;
// The most rows (inputs x beams) one search holds: far past any batch a decoder step can hold, it
// keeps a mistaken size (a Python step's vocabulary is known only after its first step) from
// allocating gigabytes before anything can check it.
constexpr int64_t kMaxSearchRows = int64_t(1) << 24;

struct SearchConfig {
    int batch = 0, width = 1, max_length = 0;
    int64_t start_id = 0, end_id = 0;
    double alpha = 0.0;      // GNMT's length penalty exponent
    bool attention = false;  // keep each hypothesis' attention
};

// Every hypothesis of every input, each input's `width` best first (by normalized score, a stable
// order). steps: positions decoded (the longest hypothesis).
template <class A> struct SearchResult {
    int batch = 0, width = 0, steps = 0, heads = 0, keys = 0;
    std::vector<int64_t> tokens;         // (batch, width, steps): ids (end token included), then 0
    std::vector<int32_t> lengths;        // (batch, width): tokens counting the end token
    std::vector<double> scores;          // (batch, width): summed log probabilities
    std::vector<double> normalized;      // (batch, width): scores / length_penalty(lengths)
    std::vector<A> attention;            // (batch, width, heads, steps, keys) when kept, zero after a length
};

// GNMT's ((5 + length) / 6) ** alpha
inline double length_penalty(int length, double alpha) { return std::pow((5.0 + length) / 6.0, alpha); }

// One row of logits l (V,): log p[v] = l[v] + offset with offset = -max - log sum_u exp(l[u] - max)
// (the sum in double; float logits through the vectorized exp, double ones through std::exp, as
// NumPy's), and its `width` best words by logit, ties to the lowest id, into best[0..width).
// `scratch` holds V values.
template <class L> double row_top_words(int32_t* best, const L* l, int V, int width, L* scratch) {
    const L top = row_max(l, (size_t)V);
    double sum = 0.0;
    if constexpr (sizeof(L) == sizeof(float)) sum = exp_shifted(scratch, l, (size_t)V, top);
    else for (int v = 0; v < V; ++v) sum += std::exp((double)l[v] - (double)top);
    if (width == 1) {  // row_argmax's word without its second pass for the maximum: the first at it, 0 for NaN
        const int at = (int)(std::find(l, l + V, top) - l);
        best[0] = at < V ? at : 0;
    } else if (width <= 16) {  // a sorted list of the best so far: one compare per word
        int kept = 0;
        for (int v = 0; v < V; ++v) {
            if (kept == width && v % 16 == 0 && v + 16 <= V) {  // 16 words none of which enters: one test
                bool enters = false;
                for (int u = v; u < v + 16; ++u) enters |= l[u] > l[best[kept - 1]];
                if (!enters) { v += 15; continue; }
            }
            if (kept == width && !(l[v] > l[best[kept - 1]])) continue;
            int j = kept < width ? kept++ : width - 1;
            for (; j > 0 && l[v] > l[best[j - 1]]; --j) best[j] = best[j - 1];
            best[j] = v;
        }
    } else {
        std::vector<int32_t> order((size_t)V);
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + width, order.end(),
                          [l](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
        std::copy(order.begin(), order.begin() + width, best);
    }
    return -(double)top - std::log(sum);
}

template <class Step>
SearchResult<typename Step::attention_type> search(Step& step, const SearchConfig& c) {
    using L = typename Step::logits_type;
    using A = typename Step::attention_type;
    const int B = c.batch, W = c.width;
    int V = 0;  // the step's vocabulary, known after its first step
    const size_t BW = (size_t)B * W;
    // sized after the first step, whose vocabulary bounds the width (a Python step's is known only
    // then): a width past the vocabulary is refused before anything of its size is allocated
    std::vector<double> score;
    std::vector<int32_t> length;
    std::vector<uint8_t> done;
    // per step, per input and beam: its parent beam, its token (0 once finished) and its attention;
    // the histories are read back through the parents at the end instead of gathered every step
    std::vector<int32_t> parents;
    std::vector<int64_t> words;
    std::vector<A> history;
    std::vector<int32_t> active(B), next_active, picks;
    std::iota(active.begin(), active.end(), 0);
    std::vector<int64_t> ids((size_t)B, c.start_id), next_ids;
    std::vector<std::pair<double, int64_t>> candidates;  // (total, beam * V + word)
    std::vector<double> offsets;
    std::vector<int32_t> best;
    std::vector<double> new_score;
    std::vector<int32_t> new_length, new_parent;
    std::vector<int64_t> new_word;
    std::vector<uint8_t> new_done;
    const auto better = [](const std::pair<double, int64_t>& a, const std::pair<double, int64_t>& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    int beams = 1, steps = 0, heads = 0, keys = 0;
    size_t span = 0;  // attention values per row
    for (int t = 0; t < c.max_length && !active.empty(); ++t) {
        const int rows = (int)active.size() * beams;
        const L* logits = step.step(ids.data(), rows, t);
        const A* weights = c.attention ? step.attention() : nullptr;
        if (t == 0) {
            V = step.vocab();
            score.assign(BW, -std::numeric_limits<double>::infinity());
            for (int b = 0; b < B; ++b) score[(size_t)b * W] = 0.0;
            length.assign(BW, 0), done.assign(BW, 0);
            new_score.resize((size_t)W), new_length.resize((size_t)W), new_parent.resize((size_t)W);
            new_word.resize((size_t)W), new_done.resize((size_t)W);
        }
        if (c.attention && t == 0) {
            heads = step.attention_heads(), keys = step.attention_keys();
            span = (size_t)heads * keys;
        }
        parents.resize((size_t)(t + 1) * BW);
        words.resize((size_t)(t + 1) * BW, 0);
        history.resize((size_t)(t + 1) * BW * span, A(0));
        for (size_t i = 0; i < BW; ++i) parents[(size_t)t * BW + i] = (int32_t)(i % W);  // inputs that left stay put
        next_active.clear(), picks.clear(), next_ids.clear();
        // every live row's log-softmax offset and best words, rows split across threads
        const int kept = W;  // words per row (a row's best W are the only ones of it among its input's W)
        offsets.resize((size_t)rows), best.resize((size_t)rows * kept);
        parallel_for((size_t)rows, (double)rows * V * 8, [&](size_t lo, size_t hi) {
            std::vector<L> scratch((size_t)V);
            for (size_t r = lo; r < hi; ++r) {
                const int b = active[r / beams], k = (int)(r % beams);
                if (!done[(size_t)b * W + k])
                    offsets[r] = row_top_words(best.data() + r * kept, logits + r * (size_t)V, V, kept,
                                               scratch.data());
            }
        });
        for (size_t i = 0; i < active.size(); ++i) {
            const int b = active[i];
            const size_t base = (size_t)b * W;
            candidates.clear();
            for (int k = 0; k < beams; ++k) {
                const size_t r = i * beams + k;
                if (done[base + k]) {  // padding at no cost
                    candidates.emplace_back(score[base + k], (int64_t)k * V);
                    continue;
                }
                const L* l = logits + r * (size_t)V;
                for (int j = 0; j < kept; ++j) {
                    const int32_t v = best[r * kept + j];
                    candidates.emplace_back(score[base + k] + offsets[r] + (double)l[v], (int64_t)k * V + v);
                }
            }
            std::partial_sort(candidates.begin(), candidates.begin() + W, candidates.end(), better);
            bool going = false;
            for (int j = 0; j < W; ++j) {
                const int k = (int)(candidates[j].second / V);
                const int64_t v = candidates[j].second % V;
                const bool was_done = done[base + k];
                new_score[j] = candidates[j].first;
                new_length[j] = length[base + k] + !was_done;
                new_word[j] = was_done ? 0 : v;
                new_done[j] = was_done || v == c.end_id;
                new_parent[j] = k;
                going = going || !new_done[j];
                const size_t at = (size_t)t * BW + base + j;
                parents[at] = k, words[at] = new_word[j];
                if (weights && !was_done) {
                    const A* w = weights + (i * beams + k) * span;
                    std::copy(w, w + span, history.begin() + at * span);
                }
            }
            for (int j = 0; j < W; ++j)
                score[base + j] = new_score[j], length[base + j] = new_length[j], done[base + j] = new_done[j];
            if (going) {
                next_active.push_back(b);
                for (int j = 0; j < W; ++j)
                    picks.push_back((int32_t)(i * beams + new_parent[j])), next_ids.push_back(new_word[j]);
            }
        }
        steps = t + 1;
        if (next_active.empty()) break;
        bool same = (int)picks.size() == rows;
        for (size_t r = 0; same && r < picks.size(); ++r) same = picks[r] == (int32_t)r;
        if (!same) step.select(picks.data(), (int)picks.size());
        active.swap(next_active), ids.swap(next_ids);
        beams = W;
    }
    // read the hypotheses back through the parents, each input's best first
    SearchResult<A> out;
    out.batch = B, out.width = W, out.steps = steps, out.heads = heads, out.keys = keys;
    out.tokens.assign(BW * steps, 0), out.lengths.resize(BW), out.scores.resize(BW), out.normalized.resize(BW);
    if (c.attention) out.attention.assign(BW * span * steps, A(0));
    std::vector<int32_t> rank((size_t)W);
    std::vector<double> normalized((size_t)W);
    for (int b = 0; b < B; ++b) {
        const size_t base = (size_t)b * W;
        for (int w = 0; w < W; ++w) normalized[w] = score[base + w] / length_penalty(length[base + w], c.alpha);
        std::iota(rank.begin(), rank.end(), 0);
        std::stable_sort(rank.begin(), rank.end(), [&](int32_t x, int32_t y) { return normalized[x] > normalized[y]; });
        for (int r = 0; r < W; ++r) {
            const int w = rank[r];
            const size_t o = base + r;
            out.lengths[o] = length[base + w], out.scores[o] = score[base + w], out.normalized[o] = normalized[w];
            int beam = w;
            for (int t = steps - 1; t >= 0; --t) {
                const size_t at = (size_t)t * BW + base + beam;
                out.tokens[o * steps + t] = words[at];
                if (c.attention)  // (heads, keys) of step t into (heads, steps, keys)
                    for (int h = 0; h < heads; ++h)
                        std::copy(history.begin() + at * span + (size_t)h * keys,
                                  history.begin() + at * span + (size_t)(h + 1) * keys,
                                  out.attention.begin() + ((o * heads + h) * steps + t) * keys);
                beam = parents[at];
            }
        }
    }
    return out;
}

}  // namespace attnx
