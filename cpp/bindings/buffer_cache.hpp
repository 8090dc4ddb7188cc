// The allocator of the bindings' large result arrays (new_array in checks.hpp): freed blocks kept by
// size for the next array of that size.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <list>
#include <mutex>
#include <new>
#include <thread>
#include <unordered_map>
#include <vector>

namespace attnx::bind {

// Freed result buffers of 64 KiB and more, kept by size for the next array of that size: training
// and inference loops allocate the same shapes call after call, and every fresh page costs a page
// fault (2500 faults, 10 MB, per transformer encoder-layer inference call without the cache).
// It keeps kMinCachedBytes or, if more, as many bytes as one thread ever had live at once, up to
// kMaxCachedBytes: what a training loop needs from one step to the next (a seq2seq step with
// V = 8000 frees about 150 MiB of results, and a fixed cap of 128 MiB left it 12,000 page faults and
// 12 ms per step), while a burst of threads, each holding little, does not grow it. Past that the least recently
// freed blocks go back to the OS, so the shapes of the model running now displace those of one that
// ran before (keeping the old ones instead left a BiLSTM step at 900 page faults and 7 ms, from
// 4.8, after an LSTM(256) had filled the cache). The cache is never destroyed (arrays may outlive
// static destruction).
class BufferCache {
  public:
    static constexpr size_t kMinBytes = size_t(1) << 16, kMinCachedBytes = size_t(128) << 20,
                            kMaxCachedBytes = size_t(1) << 30;
    // the block's size and taker, keeping the data 64-byte aligned (blocks are pages)
    static constexpr size_t kHeader = 64;

    static BufferCache& instance() {
        static BufferCache* cache = new BufferCache;
        return *cache;
    }

    // A block for `bytes` of data; returns the data pointer.
    void* take(size_t bytes) {
        {
            std::lock_guard<std::mutex> guard(lock_);
            auto it = free_.find(bytes);
            if (it != free_.end() && !it->second.empty()) {  // the most recently freed block of this size
                auto freed = it->second.back();
                void* data = freed->data;
                count_taken(data);  // first: if it throws, the block stays cached
                it->second.pop_back();
                by_age_.erase(freed);
                cached_bytes_ -= bytes;
                return data;
            }
        }
        // straight from the OS and back to it in give(): malloc would keep freed blocks in the arena
        // of the thread that freed them (32 inference threads held 600 MiB after they ended)
        void* mapped = mmap(nullptr, kHeader + bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (mapped == MAP_FAILED) throw std::bad_alloc();
        char* block = static_cast<char*>(mapped);
        *reinterpret_cast<size_t*>(block) = bytes;
        try {
            std::lock_guard<std::mutex> guard(lock_);
            count_taken(block + kHeader);
        } catch (...) {
            munmap(mapped, kHeader + bytes);
            throw;
        }
        return block + kHeader;
    }

    // The capsule destructor of arrays made by new_array.
    static void give(void* data) {
        BufferCache& cache = instance();
        const size_t bytes = block_bytes(data);
        std::vector<void*> evicted;
        {
            std::lock_guard<std::mutex> guard(cache.lock_);
            auto live = cache.live_by_thread_.find(taker(data));
            if ((live->second -= bytes) == 0) cache.live_by_thread_.erase(live);
            const size_t cap = std::clamp(cache.peak_thread_live_bytes_, kMinCachedBytes, kMaxCachedBytes);
            if (bytes > cap) {
                evicted.push_back(data);
            } else {
                cache.free_[bytes].push_back(cache.by_age_.insert(cache.by_age_.end(), {bytes, data}));
                cache.cached_bytes_ += bytes;
                while (cache.cached_bytes_ > cap) {  // the oldest block is the first of its size
                    const Freed oldest = cache.by_age_.front();
                    auto& same_size = cache.free_[oldest.bytes];
                    same_size.erase(same_size.begin());
                    cache.by_age_.pop_front();
                    cache.cached_bytes_ -= oldest.bytes;
                    evicted.push_back(oldest.data);
                }
            }
        }
        for (void* block : evicted) munmap(static_cast<char*>(block) - kHeader, kHeader + block_bytes(block));
    }

  private:
    struct Freed {
        size_t bytes;
        void* data;
    };
    static size_t block_bytes(void* data) { return *reinterpret_cast<size_t*>(static_cast<char*>(data) - kHeader); }
    // the thread that took the block, in the header after its size
    static_assert(sizeof(size_t) + sizeof(std::thread::id) <= kHeader, "the header holds a size and a thread id");
    static std::thread::id& taker(void* data) {
        return *std::launder(reinterpret_cast<std::thread::id*>(static_cast<char*>(data) - kHeader + sizeof(size_t)));
    }
    // under lock_: data now belongs to this thread's live bytes
    void count_taken(void* data) {
        new (static_cast<char*>(data) - kHeader + sizeof(size_t)) std::thread::id(std::this_thread::get_id());
        const size_t live = live_by_thread_[taker(data)] += block_bytes(data);
        peak_thread_live_bytes_ = std::max(peak_thread_live_bytes_, live);
    }

    std::mutex lock_;
    std::list<Freed> by_age_;  // cached blocks, least recently freed first
    std::unordered_map<size_t, std::vector<std::list<Freed>::iterator>> free_;  // by size, oldest first
    size_t cached_bytes_ = 0;
    std::unordered_map<std::thread::id, size_t> live_by_thread_;  // bytes taken and not yet given back
    size_t peak_thread_live_bytes_ = 0;
};

}  // namespace attnx::bind
