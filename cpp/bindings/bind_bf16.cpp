// bfloat16 products (bf16.hpp): the `mixed_bfloat16` policy's kernels. Operands are float32 arrays
// (the master weights, the activations); the kernels round them to bf16 as they pack them.
#include <pybind11/stl.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "attnx/bf16.hpp"
#include "bindings.hpp"
#include "checks.hpp"

namespace attnx::bind {

// The block lists of dense_*_bf16_blocks: 1 to kMaxDenseBlocks kernels, and as many of each other list
static void check_dense_block_count(const char* fn, size_t count,
                                    std::initializer_list<std::pair<const char*, size_t>> others) {
    if (count < 1 || count > (size_t)kMaxDenseBlocks)
        throw py::value_error(std::string(fn) + ": kernels must hold 1 to " + std::to_string(kMaxDenseBlocks) +
                              " kernels, got " + std::to_string(count));
    for (const auto& [name, n] : others)
        if (n != count)
            throw py::value_error(std::string(fn) + ": " + name + " must hold one entry per kernel (" +
                                  std::to_string(count) + "), got " + std::to_string(n));
}

// Block j's kernel (C, OC) of a dense_*_bf16_blocks call: its data and OC
static std::pair<const float*, py::ssize_t> block_kernel(const char* fn, size_t j, const py::array& kernel,
                                                         py::ssize_t C) {
    const std::string what = std::string(fn) + ": kernels[" + std::to_string(j) + "]";
    check_rank(kernel, 2, what.c_str());
    check_shape(kernel, {C, -1}, what.c_str());
    return {in_ptr<float>(kernel, what.c_str()), kernel.shape(1)};
}

void init_bf16(py::module_& m) {
    m.def(
        "round_to_bfloat16",
        [](const py::array& x) {
            const float* px = in_ptr<float>(x, "round_to_bfloat16: x");
            std::vector<py::ssize_t> shape(x.shape(), x.shape() + x.ndim());
            const size_t n = (size_t)x.size();
            return released_result<float>(shape, [&](float* y) { round_to_bf16(y, px, n); });
        },
        py::arg("x"), "x (float32) rounded to the nearest bfloat16 (ties to even), as float32.");

    m.def(
        "bf16_matmul",
        [](const py::array& a, const py::array& b, bool transpose_a, bool transpose_b, const py::object& out) {
            check_rank(a, 2, "bf16_matmul: a");
            check_rank(b, 2, "bf16_matmul: b");
            const auto M = a.shape(transpose_a ? 1 : 0), K = a.shape(transpose_a ? 0 : 1);
            const auto N = b.shape(transpose_b ? 0 : 1);
            if (b.shape(transpose_b ? 1 : 0) != K)
                throw py::value_error("bf16_matmul: the inner sizes differ: op(a) is (" + std::to_string(M) + ", " +
                                      std::to_string(K) + "), op(b) " + shape_str(b) +
                                      (transpose_b ? " transposed" : ""));
            const float* pa = in_ptr<float>(a, "bf16_matmul: a");
            const float* pb = in_ptr<float>(b, "bf16_matmul: b");
            const bool accumulate = !out.is_none();
            py::array_t<float> c = accumulate ? py::array_t<float>() : new_array<float>({M, N});
            float* pc = accumulate ? optional_inout_ptr<float>(out, {M, N}, "bf16_matmul: out") : c.mutable_data();
            {
                py::gil_scoped_release release;
                bf16_gemm(pc, (size_t)N, pa, (size_t)a.shape(1), transpose_a, pb, (size_t)b.shape(1), transpose_b,
                          (int)M, (int)N, (int)K, accumulate);
            }
            if (accumulate) return py::reinterpret_borrow<py::object>(out);
            return py::object(std::move(c));
        },
        py::arg("a"), py::arg("b"), py::arg("transpose_a") = false, py::arg("transpose_b") = false,
        py::arg("out") = py::none(),
        "op(a) . op(b) for float32 a, b rounded to bfloat16, summed in float32; with `out`, added into it "
        "(returned).");

    m.def(
        "dense_forward_bf16",
        [](const py::array& x, const py::array& kernel, const py::object& bias, const std::string& activation) {
            const Activation act = parse_activation(activation);
            check_rank(x, 2, "dense_forward_bf16: x");
            check_rank(kernel, 2, "dense_forward_bf16: kernel");
            const auto N = x.shape(0), C = x.shape(1), OC = kernel.shape(1);
            check_shape(kernel, {C, -1}, "dense_forward_bf16: kernel");
            const float* px = in_ptr<float>(x, "dense_forward_bf16: x");
            const float* pw = in_ptr<float>(kernel, "dense_forward_bf16: kernel");
            const float* pb = optional_in_ptr<float>(bias, {OC}, "dense_forward_bf16: bias");
            auto z = new_array<float>({N, OC});
            // gelu's backward needs the pre-activation; every other activation works from y
            py::array_t<float> y = act == Activation::gelu ? new_array<float>({N, OC}) : z;
            float* pz = z.mutable_data();
            float* py_ = y.mutable_data();
            {
                py::gil_scoped_release release;
                bf16_dense_forward(py_, pz, px, pw, pb, (int)N, (int)C, (int)OC, act);
            }
            return py::make_tuple(y, z);
        },
        py::arg("x"), py::arg("kernel"), py::arg("bias"), py::arg("activation") = "linear",
        "dense_forward with the product in bfloat16 (float32 sums); returns (y, z).");

    m.def(
        "dense_backward_bf16",
        [](const py::array& dy, const py::array& x, const py::array& kernel, const py::array& y, const py::array& z,
           const std::string& activation, py::array& dkernel, const py::object& dbias, bool need_dx) -> py::object {
            const Activation act = parse_activation(activation);
            check_rank(x, 2, "dense_backward_bf16: x");
            check_rank(kernel, 2, "dense_backward_bf16: kernel");
            const auto N = x.shape(0), C = x.shape(1), OC = kernel.shape(1);
            check_shape(kernel, {C, OC}, "dense_backward_bf16: kernel");
            check_shape(dy, {N, OC}, "dense_backward_bf16: dy");
            check_shape(y, {N, OC}, "dense_backward_bf16: y");
            check_shape(z, {N, OC}, "dense_backward_bf16: z");
            check_shape(dkernel, {C, OC}, "dense_backward_bf16: dkernel");
            float* pdb = optional_inout_ptr<float>(dbias, {OC}, "dense_backward_bf16: dbias");
            const float* pdy = in_ptr<float>(dy, "dense_backward_bf16: dy");
            const float* px = in_ptr<float>(x, "dense_backward_bf16: x");
            const float* pw = in_ptr<float>(kernel, "dense_backward_bf16: kernel");
            const float* py_ = in_ptr<float>(y, "dense_backward_bf16: y");
            const float* pz = in_ptr<float>(z, "dense_backward_bf16: z");
            float* pdw = inout_ptr<float>(dkernel, "dense_backward_bf16: dkernel");
            const bool linear = act == Activation::linear;  // then dz is dy itself
            py::array_t<float> dz = linear ? py::array_t<float>() : new_array<float>({N, OC});
            py::array_t<float> dx = need_dx ? new_array<float>({N, C}) : py::array_t<float>();
            float* pdz = linear ? nullptr : dz.mutable_data();
            float* pdx = need_dx ? dx.mutable_data() : nullptr;
            {
                py::gil_scoped_release release;
                if (!linear) bf16_activation_backward(pdz, pdy, pz, py_, (int)N, (int)OC, act);
                bf16_dense_backward(pdx, pdw, pdb, linear ? pdy : pdz, px, pw, (int)N, (int)C, (int)OC);
            }
            if (!need_dx) return py::none();
            return std::move(dx);
        },
        py::arg("dy"), py::arg("x"), py::arg("kernel"), py::arg("y"), py::arg("z"), py::arg("activation"),
        py::arg("dkernel"), py::arg("dbias"), py::arg("need_dx") = true,
        "Backward of dense_forward_bf16 (products in bfloat16, the bias gradient in float32): accumulates into "
        "dkernel/dbias, returns dx (or None).");

    m.def(
        "dense_forward_bf16_blocks",
        [](const py::array& x, const std::vector<py::array>& kernels, const std::vector<py::object>& biases) {
            const char* fn = "dense_forward_bf16_blocks";
            check_rank(x, 2, "dense_forward_bf16_blocks: x");
            const auto N = x.shape(0), C = x.shape(1);
            check_dense_block_count(fn, kernels.size(), {{"biases", biases.size()}});
            const float* px = in_ptr<float>(x, "dense_forward_bf16_blocks: x");
            Bf16DenseBlock blocks[kMaxDenseBlocks];
            py::list outs;
            for (size_t j = 0; j < kernels.size(); ++j) {
                const auto [kernel, OC] = block_kernel(fn, j, kernels[j], C);
                const std::string bias = std::string(fn) + ": biases[" + std::to_string(j) + "]";
                auto y = new_array<float>({N, OC});
                blocks[j] = {kernel, optional_in_ptr<float>(biases[j], {OC}, bias.c_str()), (int)OC, y.mutable_data(), nullptr,
                             nullptr, nullptr};
                outs.append(y);
            }
            {
                py::gil_scoped_release release;
                bf16_dense_blocks_forward(px, (int)N, (int)C, blocks, (int)kernels.size());
            }
            return outs;
        },
        py::arg("x"), py::arg("kernels"), py::arg("biases"),
        "[x . kernel_j + bias_j for each block j] with the products in bfloat16 (float32 sums), x (N, C) paired "
        "once for all of them: a self-attention's query, key and value projections (1 to 4 kernels (C, OC_j), "
        "biases None or (OC_j,)), each output its own array (N, OC_j).");

    m.def(
        "dense_backward_bf16_blocks",
        [](const std::vector<py::array>& dys, const py::array& x, const std::vector<py::array>& kernels,
           std::vector<py::array> dkernels, const std::vector<py::object>& dbiases, bool need_dx) -> py::object {
            const char* fn = "dense_backward_bf16_blocks";
            check_rank(x, 2, "dense_backward_bf16_blocks: x");
            const auto N = x.shape(0), C = x.shape(1);
            check_dense_block_count(fn, kernels.size(),
                                    {{"dys", dys.size()}, {"dkernels", dkernels.size()}, {"dbiases", dbiases.size()}});
            const float* px = in_ptr<float>(x, "dense_backward_bf16_blocks: x");
            Bf16DenseBlock blocks[kMaxDenseBlocks];
            for (size_t j = 0; j < kernels.size(); ++j) {
                const auto [kernel, OC] = block_kernel(fn, j, kernels[j], C);
                const std::string at = "[" + std::to_string(j) + "]";
                const std::string dy = std::string(fn) + ": dys" + at, dkernel = std::string(fn) + ": dkernels" + at,
                                  dbias = std::string(fn) + ": dbiases" + at;
                check_shape(dys[j], {N, OC}, dy.c_str());
                check_shape(dkernels[j], {C, OC}, dkernel.c_str());
                blocks[j] = {kernel, nullptr, (int)OC, nullptr,
                             in_ptr<float>(dys[j], dy.c_str()), inout_ptr<float>(dkernels[j], dkernel.c_str()),
                             optional_inout_ptr<float>(dbiases[j], {OC}, dbias.c_str())};
            }
            py::array_t<float> dx = need_dx ? new_array<float>({N, C}) : py::array_t<float>();
            float* pdx = need_dx ? dx.mutable_data() : nullptr;
            {
                py::gil_scoped_release release;
                bf16_dense_blocks_backward(pdx, px, (int)N, (int)C, blocks, (int)kernels.size());
            }
            if (!need_dx) return py::none();
            return std::move(dx);
        },
        py::arg("dys"), py::arg("x"), py::arg("kernels"), py::arg("dkernels"), py::arg("dbiases"),
        py::arg("need_dx") = true,
        "Backward of dense_forward_bf16_blocks: accumulates each block's kernel and bias gradient into "
        "dkernels[j] / dbiases[j] (None: no bias), returns dx = sum_j dys[j] . kernels[j]^T (or None).");

    m.def("_bf16_config", [] {
        const Bf16Tiles t = bf16_tiles();
        py::dict d;
        d["instruction"] = t.native ? "vdpbf16ps" : "float lanes";
        d["cpu_avx512_bf16"] = cpu_has_avx512_bf16();
        d["lanes"] = t.W;
        return d;
    }, "What the bfloat16 products run on at the current SIMD level.");
    m.def(
        "_bf16_allow_dot_instruction", [](bool allowed) { bf16_dot_instruction_allowed() = allowed; },
        py::arg("allowed"), "Tests only: False runs the AVX-512 level's bfloat16 products on float lanes.");
}

}  // namespace attnx::bind
