#include "bindings.hpp"
#include "attnx/activations.hpp"
#include "attnx/gemm.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_core, m) {
    m.doc() = "attnx C++ kernels (forward and backward) on NumPy buffers";
    m.def("set_num_threads", &attnx::set_blas_threads, py::arg("n"), "Threads used by OpenBLAS.");
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
