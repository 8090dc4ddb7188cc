// Embedding lookup: out[n, :] = table[ids[n], :]. Indices are validated by the caller.
#pragma once
#include <cstdint>
#include <cstring>

namespace attnx {

// reference: cpp/reference/embedding.hpp, embedding_forward
template <class T>
void embedding_forward(T* out, const int64_t* ids, const T* table, size_t N, size_t D) {
    for (size_t n = 0; n < N; ++n) std::memcpy(out + n * D, table + (size_t)ids[n] * D, D * sizeof(T));
}

// reference: cpp/reference/embedding.hpp, embedding_backward
// dtable[ids[n], :] += dout[n, :]  (repeated ids accumulate)
template <class T>
void embedding_backward(T* dtable, const T* dout, const int64_t* ids, size_t N, size_t D) {
    for (size_t n = 0; n < N; ++n) {
        T* row = dtable + (size_t)ids[n] * D;
        const T* g = dout + n * D;
        for (size_t d = 0; d < D; ++d) row[d] += g[d];
    }
}

}  // namespace attnx
