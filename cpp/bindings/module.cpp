#include <algorithm>
#include <string>
#include <thread>

#include "bindings.hpp"
#include "attnx/activations.hpp"
#include "attnx/amx.hpp"
#include "attnx/gemm.hpp"
#include "attnx/parallel.hpp"
#include "attnx/search.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_core, m) {
    m.doc() = "attnx C++ kernels (forward and backward) on NumPy buffers";
    m.def(
        "set_num_threads",
        [](int n) {
            // more threads than CPUs only adds switching, and each is an OS thread kept for the process
            const int cpus = (int)std::max(1u, std::thread::hardware_concurrency());
            if (n < 1 || n > cpus)
                throw py::value_error("set_num_threads: n must lie in [1, " + std::to_string(cpus) +
                                      "] (this machine's CPUs), got " + std::to_string(n));
            attnx::set_blas_threads(n);
        },
        py::arg("n"), "Threads the kernels and OpenBLAS use, at most the machine's CPU count.");
    m.def("get_num_threads", &attnx::get_blas_threads);
    m.def(
        "_set_serial_kernels", [](bool serial) { attnx::serial_kernels() = serial; }, py::arg("serial"),
        "Kernels called from this thread run on it alone (True) or split across the thread budget (False).");
    m.def(
        "_set_single_threaded_blas",
        [](bool single) { openblas_set_num_threads(single ? 1 : attnx::get_blas_threads()); }, py::arg("single"),
        "OpenBLAS on one thread (True) or on the thread budget again (False), the budget unchanged.");
    m.def(
        "_force_simd_level",
        [](const std::string& level) {
            for (auto l : {attnx::SimdLevel::baseline, attnx::SimdLevel::avx2, attnx::SimdLevel::avx512})
                if (level == attnx::simd_level_name(l)) return void(attnx::simd_level_cap() = (int)l);
            throw py::value_error("_force_simd_level: expected 'avx512', 'avx2' or 'baseline', got '" + level + "'");
        },
        py::arg("level"),
        "Tests only: run the kernels' copies for at most `level` ('avx512' restores the CPU's widest).");
    m.def(
        "_amx_allow", [](bool allowed) { attnx::amx_allowed() = allowed; }, py::arg("allowed"),
        "Tests only: False runs the AVX-512 level's bfloat16 and int8 products where AMX tiles would.");
    m.def("_config", [] {
        py::dict d;
        d["simd_level"] = attnx::simd_level_name(attnx::simd_level());
        d["cpu_simd_level"] = attnx::simd_level_name(attnx::cpu_simd_level());
        d["cpu_amx_bf16"] = attnx::cpu_amx_support().bf16;
        d["cpu_amx_int8"] = attnx::cpu_amx_support().int8;
        d["amx_bf16"] = attnx::amx_bf16_active();
        d["amx_int8"] = attnx::amx_int8_active();
        d["openblas_config"] = std::string(openblas_get_config());
        d["openblas_core"] = std::string(openblas_get_corename());
        d["threads"] = attnx::get_blas_threads();
        return d;
    }, "What runs: SIMD level, OpenBLAS build and core, thread budget.");
    m.attr("MAX_DECODING_LENGTH") = attnx::kMaxDecodingLength;  // search.hpp's bound on max_length
    attnx::bind::init_core(m);
    attnx::bind::init_loss(m);
    attnx::bind::init_optim(m);
    attnx::bind::init_rnn(m);
    attnx::bind::init_attention(m);
    attnx::bind::init_transformer(m);
    attnx::bind::init_seq2seq(m);
    attnx::bind::init_conv(m);
    attnx::bind::init_lstmn(m);
    attnx::bind::init_draw(m);
    attnx::bind::init_random(m);
    attnx::bind::init_quantized(m);
    attnx::bind::init_bf16(m);
    attnx::bind::init_plan(m);
    attnx::bind::init_batch_norm(m);
}
