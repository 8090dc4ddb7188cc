// Plain reference of attnx/random.hpp: one entry at a time, as the equations read.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace attnx::reference {

inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// fold_in(key, data) = mix64(key ^ mix64(data + gamma))
inline uint64_t fold_in(uint64_t key, uint64_t data) { return mix64(key ^ mix64(data + 0x9E3779B97F4A7C15ull)); }

// word w of the stream key = mix64(key + (w + 1) gamma)
inline uint64_t stream_word(uint64_t key, uint64_t w) { return mix64(key + (w + 1) * 0x9E3779B97F4A7C15ull); }

// keep[r, i] = 1 / (1 - rate) if u >= round(rate 65536) else 0,
// u = 16-bit word i % 4 of stream_word(fold_in(key, first_row + r), i / 4)
inline void random_keep(double* keep, size_t rows, size_t cols, uint64_t key, uint64_t first_row, double rate) {
    const uint64_t threshold = (uint64_t)std::llround(rate * 65536.0);
    for (size_t r = 0; r < rows; ++r)
        for (size_t i = 0; i < cols; ++i) {
            const uint64_t u = (stream_word(fold_in(key, first_row + r), i / 4) >> (16 * (i % 4))) & 0xFFFF;
            keep[r * cols + i] = u >= threshold ? 1 / (1 - rate) : 0;
        }
}

// u[r, i] = (stream_word(fold_in(key, first_row + r), i) >> 11) 2^-53
inline void random_uniform(double* u, size_t rows, size_t cols, uint64_t key, uint64_t first_row) {
    for (size_t r = 0; r < rows; ++r)
        for (size_t i = 0; i < cols; ++i)
            u[r * cols + i] = std::ldexp((double)(stream_word(fold_in(key, first_row + r), i) >> 11), -53);
}

}  // namespace attnx::reference
