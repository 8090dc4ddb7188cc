// The one place kernels split work across threads, within the budget attnx.set_num_threads sets.
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

// While our threads split the work, each runs single-threaded BLAS: OpenBLAS' own workers would
// otherwise compete with ours for the cores (measured 30x slower on 2 cores). Only OpenBLAS'
// setting changes; the budget kernels read (thread_budget) stays as the user set it.
// Restoring the budget (not the value seen on entry) keeps two Python threads that overlap here
// from leaving OpenBLAS at 1 thread.
struct SingleThreadedBlas {
    SingleThreadedBlas() { openblas_set_num_threads(1); }
    ~SingleThreadedBlas() { openblas_set_num_threads(get_blas_threads()); }
};

// True on a thread while it runs a chunk of a parallel_for: a parallel_for nested inside one (a
// kernel called on a row range by an outer split) then runs serially instead of oversubscribing.
inline bool& inside_parallel_for() {
    thread_local bool inside = false;
    return inside;
}

// Runs fn(begin, end) over contiguous chunks of [0, count), on several threads when `work`
// (total multiply-adds) makes it pay. fn must write disjoint outputs per index.
template <class F> void parallel_for(size_t count, double work, F&& fn) {
    const bool nested = inside_parallel_for();
    const size_t threads = work < kParallelMinWork || nested ? 1 : std::min<size_t>(count, kernel_threads());
    if (threads <= 1) {
        fn(size_t(0), count);
        return;
    }
    SingleThreadedBlas blas_guard;
    auto chunk_of = [&fn](size_t lo, size_t hi) {
        inside_parallel_for() = true;
        fn(lo, hi);
        inside_parallel_for() = false;
    };
    std::vector<std::thread> pool;
    const size_t chunk = (count + threads - 1) / threads;
    for (size_t lo = chunk; lo < count; lo += chunk) pool.emplace_back(chunk_of, lo, std::min(count, lo + chunk));
    chunk_of(size_t(0), std::min(count, chunk));
    for (auto& t : pool) t.join();
}

}  // namespace attnx
