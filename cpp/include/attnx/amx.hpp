// Intel AMX (Advanced Matrix Extensions: Sapphire Rapids and later Xeons): eight register tiles of up
// to 16 rows x 64 bytes and one instruction that multiplies two of them into a third:
//   tdpbf16ps  C (16 x 16 float32) += A (16 x 16 bf16 pairs) . B (16 pair rows x 16 columns)
//   tdpbusd    C (16 x 16 int32)   += A (16 x 64 uint8)      . B (16 rows of 4 int8 x 16 columns)
// 16 x 16 x 32 bf16 multiply-adds per instruction, one instruction per 16 cycles: ~15x the float32
// FMA rate of the same core (benchmarks/fma_peak.c measures it). B's layout is the pair (or quad)
// rows that vdpbf16ps and vpdpbusd read, so the packed panels of bf16.hpp and quantized.hpp are
// already B tiles, read with a row stride.
//
// Linux hands a process the tiles' 8 KiB of state only after it asks (arch_prctl
// ARCH_REQ_XCOMP_PERM), once; each thread then loads a tile configuration (the tiles' shapes) before
// its first tile instruction and releases the tiles after its last one, so that the kernel does not
// save 8 KiB per context switch of a thread that has finished.
#pragma once
#include <atomic>
#include <cpuid.h>
#include <cstdint>
#include <cstring>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "attnx/activations.hpp"

namespace attnx {

// What this CPU and its OS give: the tile instructions and the permission to use them
struct AmxSupport {
    bool bf16 = false, int8 = false;
};

inline AmxSupport cpu_amx_support() {
    static const AmxSupport support = [] {
        AmxSupport s;
        unsigned eax, ebx, ecx, edx;
        if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return s;
        const bool tile = edx & (1u << 24), bf16 = edx & (1u << 22), int8 = edx & (1u << 25);
        if (!tile || cpu_simd_level() != SimdLevel::avx512) return s;
        constexpr long kReqXcompPerm = 0x1023, kXfeatureTileData = 18;  // asm/prctl.h, not in glibc's headers
        if (syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureTileData) != 0) return s;  // an old kernel or a VM without it
        s.bf16 = bf16;
        s.int8 = int8;
        return s;
    }();
    return support;
}

// Tests only: false runs the AVX-512 level's kernels where AMX would (_core._amx_allow), so that both
// are tested on a CPU that has AMX
inline std::atomic<bool>& amx_allowed() {
    static std::atomic<bool> allowed{true};
    return allowed;
}

// Whether the bf16 / int8 products take the tiles now: the CPU and OS have them, the SIMD level is
// not capped below AVX-512, and the tests allow them
inline bool amx_bf16_active() {
    return cpu_amx_support().bf16 && simd_level() == SimdLevel::avx512 && amx_allowed().load(std::memory_order_relaxed);
}
inline bool amx_int8_active() {
    return cpu_amx_support().int8 && simd_level() == SimdLevel::avx512 && amx_allowed().load(std::memory_order_relaxed);
}

// ldtilecfg's 64-byte operand (palette 1)
struct alignas(64) AmxTileConfig {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t bytes_per_row[16] = {};
    uint8_t rows[16] = {};
};
static_assert(sizeof(AmxTileConfig) == 64);

// gcc 12's tile intrinsics are asm statements that do not tell the compiler they read or write memory
// (ldtilecfg's operand is declared 8 bytes; tileloadd and tilestored take bare addresses): without this
// barrier before each tile load and after each tile store, the stores that fill a configuration or an
// edge tile are dropped as dead, and reads after a tile store see stale values
#define ATTNX_AMX_MEMORY_BARRIER() __asm__ __volatile__("" ::: "memory")

// Every tile full: 16 rows of 64 bytes (16 float32 / int32 sums, 16 bf16 pairs or int8 quads per row).
// Loading a configuration zeroes the tiles.
__attribute__((target("amx-tile"))) inline void amx_load_full_tiles() {
    AmxTileConfig config;
    for (int t = 0; t < 8; ++t) config.bytes_per_row[t] = 64, config.rows[t] = 16;
    ATTNX_AMX_MEMORY_BARRIER();
    _tile_loadconfig(&config);
}

__attribute__((target("amx-tile"))) inline void amx_release_tiles() { _tile_release(); }

// The tiles configured for the scope of one thread's share of a product, released after it. Scopes nest:
// only the outermost of a thread configures and releases (every scope's configuration is the same), so
// a time loop that holds one around its steps pays ldtilecfg once, not once per step's product (67 ns
// a configuration here, as much as 20 of the step's tdpbf16ps). `active` false (no AMX): no scope.
struct AmxTileScope {
    explicit AmxTileScope(bool active = true) : active_(active) {
        if (active_ && depth()++ == 0) amx_load_full_tiles();
    }
    ~AmxTileScope() {
        if (active_ && --depth() == 0) amx_release_tiles();
    }
    AmxTileScope(const AmxTileScope&) = delete;
    AmxTileScope& operator=(const AmxTileScope&) = delete;

  private:
    static int& depth() {
        thread_local int scopes = 0;
        return scopes;
    }
    bool active_;
};

}  // namespace attnx
