#include "bindings.hpp"
#include "attnx/gemm.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_core, m) {
    m.doc() = "attnx C++ kernels (forward and backward) on NumPy buffers";
    m.def("set_num_threads", &attnx::set_blas_threads, py::arg("n"), "Threads used by OpenBLAS.");
    m.def("get_num_threads", &attnx::get_blas_threads);
    attnx::bind::init_core(m);
    attnx::bind::init_loss(m);
    attnx::bind::init_optim(m);
    attnx::bind::init_rnn(m);
    attnx::bind::init_attention(m);
    attnx::bind::init_transformer(m);
    attnx::bind::init_seq2seq(m);
}
