// What the bindings of the one search (search.hpp) share: its checked arguments and its result as
// NumPy arrays. bind_transformer.cpp runs it over a decoder stack and over a Python step,
// bind_seq2seq.cpp over an attention decoder.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "attnx/search.hpp"

namespace attnx::bind {
namespace py = pybind11;

// The search's arguments every searcher shares, checked: a ValueError names `fn` and the argument.
// A vocab of 0: known after the first step only (a Python step's), which checks the width then.
inline SearchConfig search_config(const std::string& fn, py::ssize_t batch, py::ssize_t vocab, int64_t start_id,
                                  int64_t end_id, int width, double length_penalty, int max_length,
                                  bool return_attention) {
    if (batch < 1) throw py::value_error(fn + ": the batch is empty");
    const int64_t ids = vocab > 0 ? vocab : std::numeric_limits<int64_t>::max();
    if (start_id < 0 || start_id >= ids || end_id < 0 || end_id >= ids)
        throw py::value_error(fn + ": start_id and end_id must be token ids in [0, " + std::to_string(vocab) + ")");
    if (width < 1 || width > ids)
        throw py::value_error(fn + ": width must be in [1, " + std::to_string(vocab) + "] (the vocabulary size), got " +
                              std::to_string(width));
    if ((int64_t)batch * width > kMaxSearchRows)
        throw py::value_error(fn + ": batch x width must be <= " + std::to_string(kMaxSearchRows) + " rows, got " +
                              std::to_string(batch) + " x " + std::to_string(width));
    if (!(length_penalty >= 0) || std::isinf(length_penalty))
        throw py::value_error(fn + ": length_penalty must be a finite number >= 0");
    if (max_length < 1 || max_length > kMaxDecodingLength)
        throw py::value_error(fn + ": max_length must be in [1, " + std::to_string(kMaxDecodingLength) + "], got " +
                              std::to_string(max_length));
    SearchConfig c;
    c.batch = (int)batch, c.width = width, c.max_length = max_length;
    c.start_id = start_id, c.end_id = end_id, c.alpha = length_penalty, c.attention = return_attention;
    return c;
}

// A SearchResult as (tokens (B, W, steps) int64, lengths (B, W) int64, scores (B, W), normalized
// scores (B, W), attention (B, W, heads, steps, keys), without the heads axis for a step of one
// attention row, or None), each input's beams best first.
template <class A> py::tuple search_result_tuple(const SearchResult<A>& r, bool with_attention, bool heads_axis = true) {
    const py::ssize_t B = r.batch, W = r.width, steps = r.steps;
    py::array_t<int64_t> tokens({B, W, steps});
    std::copy(r.tokens.begin(), r.tokens.end(), tokens.mutable_data());
    py::array_t<int64_t> lengths({B, W});
    std::copy(r.lengths.begin(), r.lengths.end(), lengths.mutable_data());
    py::array_t<double> scores({B, W}), normalized({B, W});
    std::copy(r.scores.begin(), r.scores.end(), scores.mutable_data());
    std::copy(r.normalized.begin(), r.normalized.end(), normalized.mutable_data());
    py::object attention = py::none();
    if (with_attention) {
        std::vector<py::ssize_t> shape{B, W, (py::ssize_t)r.heads, steps, (py::ssize_t)r.keys};
        if (!heads_axis) shape.erase(shape.begin() + 2);
        py::array_t<A> a(shape);
        std::copy(r.attention.begin(), r.attention.end(), a.mutable_data());
        attention = std::move(a);
    }
    return py::make_tuple(tokens, lengths, scores, normalized, attention);
}

}  // namespace attnx::bind
