// attnx's one random stream (ARCHITECTURE.md, "Randomness"): every random number a training step
// draws (dropout masks, hard attention's samples, the epoch shuffle) is a pure function of a 64-bit
// key and a position, JAX's PRNGKey / fold_in idea. Python folds the seed, the training step, the
// layer and its call into the key (`fold_in`); the kernels fold in the global row, so a batch cut
// into shards (data-parallel ranks, any thread split) draws exactly the rows of the whole batch.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "attnx/activations.hpp"
#include "attnx/parallel.hpp"

namespace attnx {

constexpr uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ull;  // splitmix64's increment, 2^64 / golden ratio

// splitmix64's finalizer: a bijection of 64-bit words that mixes every input bit into every output bit
inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// reference: cpp/reference/random.hpp, fold_in
// The key of a sub-stream: fold_in(key, data) = mix64(key ^ mix64(data + gamma)); a bijection in
// `key` for each `data` and in `data` for each `key`, so distinct steps / layers / rows get distinct keys.
inline uint64_t fold_in(uint64_t key, uint64_t data) { return mix64(key ^ mix64(data + kGoldenGamma)); }

// reference: cpp/reference/random.hpp, stream_word
// Word w of the stream `key`: splitmix64 seeded with `key`, mix64(key + (w + 1) gamma).
inline uint64_t stream_word(uint64_t key, uint64_t w) { return mix64(key + (w + 1) * kGoldenGamma); }

// Rows are drawn in blocks of words: one loop hashes the block's counters, one consumes them, so
// both run on the copy's widest vectors (one loop doing both stayed scalar).
constexpr size_t kRandomBlockWords = 256;

// Calls body(row, first_word, words, z) for every block of `words_per_row` words of `rows` rows,
// z[k] = stream_word(fold_in(key, first_row + row), first_word + k), blocks split across threads.
template <class T, class Body>
void for_each_word_block(size_t rows, size_t words_per_row, uint64_t key, uint64_t first_row, double work,
                         Body&& body) {
    const size_t blocks_per_row = (words_per_row + kRandomBlockWords - 1) / kRandomBlockWords;
    parallel_for(rows * blocks_per_row, work, [&](size_t lo, size_t hi) {
        on_widest_lanes<T>([&](auto) __attribute__((always_inline)) {
            uint64_t z[kRandomBlockWords];
            for (size_t block = lo; block < hi; ++block) {
                const size_t row = block / blocks_per_row, w0 = (block % blocks_per_row) * kRandomBlockWords;
                const size_t words = std::min(kRandomBlockWords, words_per_row - w0);
                const uint64_t row_key = fold_in(key, first_row + row);
                for (size_t k = 0; k < words; ++k) z[k] = stream_word(row_key, w0 + k);
                body(row, w0, words, z);
            }
        });
    });
}

// reference: cpp/reference/random.hpp, random_keep
// A scaled dropout keep mask of `rows` rows of `cols` entries (the rows of the batch starting at
// global row `first_row`):
//   keep[r, i] = 1 / (1 - rate) if u[r, i] >= round(rate 65536), else 0,
//   u[r, i] = 16-bit word i % 4 (low first) of stream_word(fold_in(key, first_row + r), i / 4)
// so the rate is honoured to 1/65536 and four entries share one hash. KeepRule draws any span of a
// row, so a kernel can draw the part of a mask it is about to use (KeepStream, below) and never
// write the whole mask out.
template <class T> struct KeepRule {
    uint32_t threshold;  // P(u16 < threshold) ~ rate
    T scale;
    explicit KeepRule(double rate)
        : threshold((uint32_t)std::llround(rate * 65536.0)), scale(T(1.0 / (1.0 - rate))) {}

    // keep[j] = entry first + j of the row whose key is row_key = fold_in(key, first_row + r), j < count
    ATTNX_ALWAYS_INLINE void span(T* keep, uint64_t row_key, size_t first, size_t count) const {
        uint64_t z[kRandomBlockWords];
        uint16_t uniforms[4 * kRandomBlockWords];
        for (size_t done = 0; done < count;) {
            const size_t w0 = (first + done) / 4, skip = (first + done) % 4;
            const size_t n = std::min(count - done, 4 * kRandomBlockWords - skip), words = (skip + n + 3) / 4;
            for (size_t k = 0; k < words; ++k) z[k] = stream_word(row_key, w0 + k);
            std::memcpy(uniforms, z, words * sizeof(uint64_t));  // little-endian: low word first
            // a product, not a select: the select compiled to a branch per entry
            for (size_t i = 0; i < n; ++i) keep[done + i] = scale * T(uniforms[skip + i] >= threshold);
            done += n;
        }
    }
};

// A dropout keep mask drawn in the kernel as it is used, never written out: the (rows, cols) mask
// random_keep(keep, rows, cols, key, first_row, rate) would write. rate 0: none.
struct KeepStream {
    uint64_t key = 0, first_row = 0;
    double rate = 0;
};

// fn(row, c0, n, keep) for every block of up to 4 kRandomBlockWords entries of the (rows, cols) mask
// that `drawn` stands for: keep[j] = its entry (row, c0 + j), j < n, in this thread's buffer; blocks
// split across threads. fn is inlined into each level's copy (always_inline), where its loops vectorize.
template <class T, class Fn> void for_keep_blocks(size_t rows, size_t cols, const KeepStream& drawn, Fn&& fn) {
    const KeepRule<T> rule(drawn.rate);
    constexpr size_t block = 4 * kRandomBlockWords;  // entries per block of one row
    const size_t blocks_per_row = (cols + block - 1) / block;
    parallel_for(rows * blocks_per_row, double(rows) * cols, [&](size_t lo, size_t hi) {
        on_widest_lanes<T>([&](auto) __attribute__((always_inline)) {
            alignas(64) T keep[block];
            for (size_t b = lo; b < hi; ++b) {
                const size_t row = b / blocks_per_row, c0 = (b % blocks_per_row) * block, n = std::min(block, cols - c0);
                rule.span(keep, fold_in(drawn.key, drawn.first_row + row), c0, n);
                fn(row, c0, n, (const T*)keep);
            }
        });
    });
}

template <class T>
void random_keep(T* keep, size_t rows, size_t cols, uint64_t key, uint64_t first_row, double rate) {
    for_keep_blocks<T>(rows, cols, KeepStream{key, first_row, rate},
                       [&](size_t row, size_t c0, size_t n, const T* drawn) __attribute__((always_inline)) {
                           std::memcpy(keep + row * cols + c0, drawn, n * sizeof(T));
                       });
}

// reference: cpp/reference/random.hpp, random_uniform
// Uniforms in [0, 1) of `rows` rows of `cols` entries from global row `first_row` on:
//   u[r, i] = (stream_word(fold_in(key, first_row + r), i) >> 11) 2^-53, in float rounded down to 24 bits
template <class T> void random_uniform(T* u, size_t rows, size_t cols, uint64_t key, uint64_t first_row) {
    constexpr int bits = sizeof(T) == sizeof(double) ? 53 : 24;
    const T unit = T(std::ldexp(1.0, -bits));
    for_each_word_block<T>(rows, cols, key, first_row, double(rows) * cols * 4,
                           [&](size_t row, size_t w0, size_t words, const uint64_t* z) __attribute__((always_inline)) {
                               T* out = u + row * cols + w0;
                               for (size_t k = 0; k < words; ++k) out[k] = T(z[k] >> (64 - bits)) * unit;
                           });
}

}  // namespace attnx
