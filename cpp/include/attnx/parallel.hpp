// The one place kernels split work across threads. The thread budget is OpenBLAS' setting
// (attnx.set_num_threads), so a kernel that runs BLAS single-threaded inside its own threads
// (set_blas_threads(1)) also keeps nested parallel_for calls from oversubscribing the cores.
#pragma once
#include <algorithm>
#include <cstddef>
#include <thread>
#include <vector>

#include "attnx/gemm.hpp"

namespace attnx {

// Below this many multiply-adds (or element updates) a second thread costs more than it saves.
constexpr double kParallelMinWork = 1 << 17;

inline unsigned kernel_threads() { return (unsigned)std::max(1, get_blas_threads()); }

// Runs fn(begin, end) over contiguous chunks of [0, count), on several threads when `work`
// (total multiply-adds) makes it pay. fn must write disjoint outputs per index.
template <class F> void parallel_for(size_t count, double work, F&& fn) {
    const size_t threads = work < kParallelMinWork ? 1 : std::min<size_t>(count, kernel_threads());
    if (threads <= 1) {
        fn(size_t(0), count);
        return;
    }
    std::vector<std::thread> pool;
    const size_t chunk = (count + threads - 1) / threads;
    for (size_t lo = chunk; lo < count; lo += chunk) pool.emplace_back(fn, lo, std::min(count, lo + chunk));
    fn(size_t(0), std::min(count, chunk));
    for (auto& t : pool) t.join();
}

}  // namespace attnx
