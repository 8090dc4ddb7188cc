// The bf16 paths the C++ tests run a check on
#pragma once
#include <string>

#include "attnx/bf16.hpp"
#include "reference_check.hpp"

namespace attnx::test {

// fn(where) on every level, the AVX-512 one on AMX tiles where the CPU has them, then on vdpbf16ps,
// then on float lanes (neither allowed), on 1 and 2 threads
template <class F> void on_every_bf16_path(F&& fn) {
    on_every_level_and_split([&](const std::string& level) {
        const bool avx512 = simd_level() == SimdLevel::avx512;
        if (avx512 && cpu_amx_support().bf16) {
            fn(level + " amx");
            amx_allowed() = false;
        }
        fn(level);
        if (avx512 && cpu_has_avx512_bf16()) {
            bf16_dot_instruction_allowed() = false;
            fn(level + " float lanes");
            bf16_dot_instruction_allowed() = true;
        }
        amx_allowed() = true;
    });
}

}  // namespace attnx::test
