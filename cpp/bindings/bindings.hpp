// One init function per binding file; module.cpp calls them all.
#pragma once
#include <pybind11/pybind11.h>

namespace attnx::bind {
void init_core(pybind11::module_& m);
void init_loss(pybind11::module_& m);
void init_optim(pybind11::module_& m);
void init_rnn(pybind11::module_& m);
void init_attention(pybind11::module_& m);
void init_transformer(pybind11::module_& m);
void init_seq2seq(pybind11::module_& m);
void init_conv(pybind11::module_& m);
void init_lstmn(pybind11::module_& m);
void init_draw(pybind11::module_& m);
void init_quantized(pybind11::module_& m);
void init_bf16(pybind11::module_& m);
void init_random(pybind11::module_& m);
void init_plan(pybind11::module_& m);
void init_batch_norm(pybind11::module_& m);
}  // namespace attnx::bind
