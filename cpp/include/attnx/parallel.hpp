// The one place kernels split work across threads, within the budget attnx.set_num_threads sets.
#pragma once
#include <pthread.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "attnx/gemm.hpp"

namespace attnx {

// Below this many multiply-adds (or element updates) a second thread costs more than it saves.
constexpr double kParallelMinWork = 1 << 17;
// Products (dense.hpp) of this many multiply-adds and more pay for packing their right operand for the
// register tiles (OpenBLAS runs smaller ones on one thread, unpacked); from the second figure on
// (4 us on one core) for a second thread, whose wake-up a smaller one does not repay.
constexpr double kPackedMinWork = 1 << 18, kParallelProductMinWork = 1 << 20;

// How long a thread that waits for another spins before it sleeps (WorkerPool) or yields (SpinBarrier)
constexpr int kSpinMicroseconds = 100;

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

// True on a thread whose kernels run on it alone: while it runs a chunk of a parallel_for (a
// parallel_for nested inside one, a kernel called on a row range by an outer split, then runs
// serially instead of oversubscribing), and while it runs one of the tasks attnx runs side by side
// on the thread budget (backend.run_side_by_side, through _core._set_serial_kernels).
inline bool& serial_kernels() {
    thread_local bool serial = false;
    return serial;
}

// The threads parallel_for runs chunks on, started once: starting a thread per call cost ~28 us,
// which a layer with ten parallel regions pays ten times. Between calls a worker spins for
// kSpinMicroseconds, then sleeps on a condition variable; the caller waits for the workers the same
// way. Waking a sleeping thread on this class of VM costs up to milliseconds after an idle spell
// (the vCPU was halted), and a training step's regions come a few microseconds of Python apart, so
// the short spin catches the next one; a longer one would take a core from OpenBLAS' threads or
// another process between steps. One call holds the pool at a time; a caller that finds it busy
// (another Python thread inside a kernel) runs its chunks itself. Never destroyed, so exit never
// waits on a sleeping worker; a forked child starts a fresh pool (its parent's workers are gone).
class WorkerPool {
  public:
    static WorkerPool& get() {
        static bool registered = (pthread_atfork(nullptr, nullptr, [] { current() = new WorkerPool(); }), true);
        (void)registered;
        return *current();
    }

    // task(i) for every i < n: i = 0 on the calling thread, the rest on workers; returns when all
    // are done, rethrowing the first exception a task threw. False (nothing run) if the pool is busy.
    template <class Task> bool run(size_t n, Task& task) {
        std::unique_lock<std::mutex> job(job_lock_, std::try_to_lock);
        if (!job.owns_lock()) return false;
        {
            std::lock_guard<std::mutex> lock(state_lock_);
            for (; workers_ + 1 < n; ++workers_)
                std::thread([this, index = workers_ + 1, seen = generation_.load()] { work(index, seen); }).detach();
            call_ = [](void* t, size_t i) { (*static_cast<Task*>(t))(i); };
            task_ = &task;
            active_ = n;
            pending_.store(n - 1);
            error_ = nullptr;
            generation_.fetch_add(1);
        }
        wake_.notify_all();
        std::exception_ptr error;
        try {
            task(0);
        } catch (...) {
            error = std::current_exception();
        }
        spin_until([this] { return pending_.load(std::memory_order_acquire) == 0; });
        std::unique_lock<std::mutex> lock(state_lock_);
        done_.wait(lock, [this] { return pending_.load() == 0; });
        if (!error) error = error_;
        lock.unlock();
        if (error) std::rethrow_exception(error);
        return true;
    }

  private:
    static WorkerPool*& current() {
        static WorkerPool* pool = new WorkerPool();
        return pool;
    }

    // Returns when done() is true or after kSpinMicroseconds, whichever comes first
    template <class Done> static void spin_until(Done&& done) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicroseconds);
        for (unsigned i = 1; !done(); ++i) {
            _mm_pause();
            if (i % 64 == 0 && std::chrono::steady_clock::now() > until) return;
        }
    }

    // Worker `index` (from 1): runs task(index) of every call after generation `seen` that has one;
    // only a worker that just ran a task spins, and not while OpenBLAS runs a product on its own
    // threads (the pool never shrinks: workers past a smaller budget go straight back to sleep)
    void work(size_t index, uint64_t seen) {
        std::unique_lock<std::mutex> lock(state_lock_);
        for (bool ran = false;;) {
            if (ran && generation_.load() == seen) {
                lock.unlock();
                spin_until([&] {
                    return generation_.load(std::memory_order_acquire) != seen ||
                           blas_threaded_products().load(std::memory_order_relaxed) > 0;
                });
                lock.lock();
            }
            wake_.wait(lock, [&] { return generation_.load() != seen; });
            seen = generation_.load();
            ran = index < active_;
            if (!ran) continue;
            lock.unlock();
            std::exception_ptr error;
            try {
                call_(task_, index);
            } catch (...) {
                error = std::current_exception();
            }
            lock.lock();
            if (error && !error_) error_ = error;
            if (pending_.fetch_sub(1) == 1) done_.notify_one();
        }
    }

    std::mutex job_lock_;    // held by the one call running
    // guards everything below; generation_ and pending_ are written under it and also read without it,
    // by the spins
    std::mutex state_lock_;
    std::condition_variable wake_, done_;
    size_t workers_ = 0;         // started so far, with indices 1 .. workers_
    std::atomic<uint64_t> generation_{0};  // bumped per call: what wakes the workers
    std::atomic<size_t> pending_{0};       // workers' tasks of this call not yet done
    size_t active_ = 0;
    void (*call_)(void*, size_t) = nullptr;
    void* task_ = nullptr;
    std::exception_ptr error_;
};

// Runs fn(begin, end) over contiguous chunks of [0, count), on several threads when `work`
// (total multiply-adds) makes it pay. fn must write disjoint outputs per index.
template <class F> void parallel_for(size_t count, double work, F&& fn) {
    const bool nested = serial_kernels();
    const size_t threads = work < kParallelMinWork || nested ? 1 : std::min<size_t>(count, kernel_threads());
    if (threads <= 1) {
        fn(size_t(0), count);
        return;
    }
    SingleThreadedBlas blas_guard;
    const size_t chunk = (count + threads - 1) / threads, chunks = (count + chunk - 1) / chunk;
    auto run_chunk = [&](size_t i) {
        serial_kernels() = true;
        fn(i * chunk, std::min(count, (i + 1) * chunk));
        serial_kernels() = false;
    };
    if (!WorkerPool::get().run(chunks, run_chunk))
        for (size_t i = 0; i < chunks; ++i) run_chunk(i);
}

// The meeting point of a team's members (run_team) between the parts of their task that depend on
// each other's results: each arrival spins on the phase its last member bumps. A member that waits
// longer than kSpinMicroseconds (its partner was descheduled: the cores are shared) yields its core
// between looks instead of taking it from the one it waits for.
class SpinBarrier {
  public:
    explicit SpinBarrier(unsigned members) : members_(members) {}

    void wait() {
        if (members_ <= 1) return;
        const unsigned phase = phase_.load(std::memory_order_acquire);
        if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == members_) {
            arrived_.store(0, std::memory_order_relaxed);  // before the phase: the next wait counts from 0
            phase_.store(phase + 1, std::memory_order_release);
            return;
        }
        const auto start = std::chrono::steady_clock::now();
        for (unsigned i = 1; phase_.load(std::memory_order_acquire) == phase; ++i) {
            _mm_pause();
            if (i % 256 == 0 && std::chrono::steady_clock::now() - start > std::chrono::microseconds(kSpinMicroseconds))
                std::this_thread::yield();
        }
    }

  private:
    const unsigned members_;
    alignas(64) std::atomic<unsigned> arrived_{0};
    alignas(64) std::atomic<unsigned> phase_{0};
};

// One member of a team: its index among `members`, and the barrier all of them meet at (sync)
struct TeamMember {
    unsigned index = 0, members = 1;
    SpinBarrier* barrier = nullptr;
    void sync() const {
        if (members > 1) barrier->wait();
    }
};

// Runs task(TeamMember) on a team of up to `members` threads at once (the caller and the pool's
// workers), each member on its share of the work, meeting at member.sync() where a part needs the
// others' results: one pool call for a whole chain of dependent parts (a decoding step's products)
// where a parallel_for per part costs a wake-up and a join each. A team of one (one thread, inside
// another parallel region, or the pool busy) runs the task alone, whose syncs do nothing. The task
// must not throw between syncs (its partners would wait for it forever): allocate before the call.
template <class Task> void run_team(unsigned members, Task&& task) {
    members = serial_kernels() ? 1 : std::min(members, kernel_threads());
    if (members > 1) {
        SingleThreadedBlas blas_guard;
        SpinBarrier barrier(members);
        auto run_member = [&](size_t i) {
            serial_kernels() = true;
            task(TeamMember{(unsigned)i, members, &barrier});
            serial_kernels() = false;
        };
        if (WorkerPool::get().run(members, run_member)) return;
    }
    task(TeamMember{});
}

}  // namespace attnx
