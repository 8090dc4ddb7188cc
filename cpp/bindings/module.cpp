#include <algorithm>
#include <string>
#include <thread>

#include "bindings.hpp"
#include "attnx/activations.hpp"
#include "attnx/gemm.hpp"

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
        "_force_baseline_lanes", [](bool on) { attnx::force_baseline_lanes() = on; }, py::arg("on"),
        "Tests only: run the kernels' baseline x86-64 copies (4-float vectors, no FMA) even on an AVX2 CPU.");
    m.def("_uses_avx2", &attnx::use_avx2_fma, "Whether the kernels' AVX2 + FMA copies run.");
    attnx::bind::init_core(m);
    attnx::bind::init_loss(m);
    attnx::bind::init_optim(m);
    attnx::bind::init_rnn(m);
    attnx::bind::init_attention(m);
    attnx::bind::init_transformer(m);
    attnx::bind::init_seq2seq(m);
}
