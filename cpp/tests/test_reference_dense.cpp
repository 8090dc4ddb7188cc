// dense.hpp against cpp/reference/dense.hpp: both forward paths (OpenBLAS below kPackedMinWork, the
// register tiles with W packed above, split across threads from kParallelProductMinWork on), every
// activation (relu fused into the tiles when y aliases z), with and without bias; the backward with
// and without dx, on odd sizes that leave vector and tile tails. One row: W streamed, the same bits on
// every thread count.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attnx/dense.hpp"
#include "reference/dense.hpp"
#include "reference_check.hpp"

using namespace attnx;
using namespace attnx::test;

namespace {

void test_dense(int N, int C, int OC, Activation act, bool bias, bool alias, unsigned seed) {
    std::mt19937 rng(seed);
    const auto x = random_values(rng, (size_t)N * C), W = random_values(rng, (size_t)C * OC, 0.3);
    const auto b = random_values(rng, OC), dz = random_values(rng, (size_t)N * OC);
    const auto dW0 = random_values(rng, (size_t)C * OC), db0 = random_values(rng, OC);
    std::vector<double> y((size_t)N * OC), z(y.size()), dx(x.size()), dW = dW0, db = db0;
    reference::dense_forward(y.data(), z.data(), x.data(), W.data(), bias ? b.data() : nullptr, N, C, OC, act);
    reference::dense_backward(dx.data(), dW.data(), db.data(), dz.data(), x.data(), W.data(), N, C, OC);
    Named want{{"y", y}};
    if (!alias) want.push_back({"z", z});
    want.insert(want.end(), {{"dx", dx}, {"dW", dW}, {"db", db}});
    char where[96];
    std::snprintf(where, sizeof where, "dense N=%d C=%d OC=%d %s%s%s", N, C, OC, activation_name(act), bias ? " bias" : "",
                  alias ? " y=z" : "");
    check_every_level(where, want, [&](auto tag) {
        using T = decltype(tag);
        const auto x_ = cast<T>(x), W_ = cast<T>(W), b_ = cast<T>(b), dz_ = cast<T>(dz);
        std::vector<T> y_(y.size()), z_(z.size()), dx_(dx.size()), dW_ = cast<T>(dW0), db_ = cast<T>(db0);
        dense_forward_rows<T>(y_.data(), alias ? y_.data() : z_.data(), x_.data(), W_.data(), bias ? b_.data() : nullptr,
                              N, C, OC, act);
        dense_backward<T>(dx_.data(), dW_.data(), db_.data(), dz_.data(), x_.data(), W_.data(), N, C, OC);
        Named got{{"y", to_double(y_)}};
        if (!alias) got.push_back({"z", to_double(z_)});
        got.insert(got.end(), {{"dx", to_double(dx_)}, {"dW", to_double(dW_)}, {"db", to_double(db_)}});
        return got;
    });
    // without dx (the first layer's backward)
    std::vector<double> dW2 = dW0;
    reference::dense_backward(nullptr, dW2.data(), nullptr, dz.data(), x.data(), W.data(), N, C, OC);
    check_every_level(std::string(where) + " no dx", {{"dW", dW2}}, [&](auto tag) {
        using T = decltype(tag);
        const auto x_ = cast<T>(x), W_ = cast<T>(W), dz_ = cast<T>(dz);
        std::vector<T> dW_ = cast<T>(dW0);
        dense_backward<T>(nullptr, dW_.data(), nullptr, dz_.data(), x_.data(), W_.data(), N, C, OC);
        return Named{{"dW", to_double(dW_)}};
    });
}

// one row through dense_rows_in_place (the decoder step's call), which streams W (dense_row_streamed)
void test_row_streamed(int C, int OC, Activation act, bool bias, unsigned seed) {
    std::mt19937 rng(seed);
    const auto x = random_values(rng, C), W = random_values(rng, (size_t)C * OC, 0.3), b = random_values(rng, OC);
    std::vector<double> y(OC), z(OC);
    reference::dense_forward(y.data(), z.data(), x.data(), W.data(), bias ? b.data() : nullptr, 1, C, OC, act);
    char where[96];
    std::snprintf(where, sizeof where, "one row C=%d OC=%d %s%s", C, OC, activation_name(act), bias ? " bias" : "");
    check_every_level(where, {{"y", y}}, [&](auto tag) {
        using T = decltype(tag);
        const auto x_ = cast<T>(x), W_ = cast<T>(W), b_ = cast<T>(b);
        std::vector<T> y_(y.size());
        dense_rows_in_place<T>(y_.data(), x_.data(), W_.data(), bias ? b_.data() : nullptr, 1, C, OC, act);
        return Named{{"y", to_double(y_)}};
    });
}

// dense_row_streamed gives the same bits on 1 and 2 threads at every level, and wherever W begins in a
// cache line: each column sums its c in one order whichever thread takes it and wherever its block
// begins (the split and the blocks fitted to the lines only move columns)
void test_row_split_exact(int C, int OC, unsigned seed) {
    std::mt19937 rng(seed);
    const auto x = cast<float>(random_values(rng, C)), W = cast<float>(random_values(rng, (size_t)C * OC, 0.3));
    const auto b = cast<float>(random_values(rng, OC));
    const int threads = get_blas_threads();
    for (int level = 0; level <= (int)cpu_simd_level(); ++level) {
        simd_level_cap() = level;
        std::vector<float> z[2];
        for (int n : {1, 2}) {
            set_blas_threads(n);
            z[n - 1].assign(OC, -1.0f);
            dense_row_streamed<float>(z[n - 1].data(), x.data(), W.data(), b.data(), C, OC);
        }
        if (z[0] != z[1]) {
            std::printf("FAIL dense_row_streamed C=%d OC=%d %s: 2 threads differ from 1\n", C, OC,
                        simd_level_name((SimdLevel)level));
            ++failures();
        }
        // W copied to begin 0..16 floats into a 64-byte line (a row of 16 floats keeps that offset in
        // every row; other widths move it from row to row)
        std::vector<float> lines(W.size() + 32 + 16);
        const size_t to_line = (16 - (reinterpret_cast<uintptr_t>(lines.data()) / sizeof(float)) % 16) % 16;
        for (size_t offset = 0; offset <= 16; ++offset) {
            float* moved = lines.data() + to_line + offset;
            std::copy(W.begin(), W.end(), moved);
            for (int n : {1, 2}) {
                set_blas_threads(n);
                std::vector<float> z_moved(OC, -1.0f);
                dense_row_streamed<float>(z_moved.data(), x.data(), moved, b.data(), C, OC);
                if (z_moved != z[0]) {
                    std::printf("FAIL dense_row_streamed C=%d OC=%d %s: W %zu floats into a line, %d threads, differs\n",
                                C, OC, simd_level_name((SimdLevel)level), offset, n);
                    ++failures();
                }
            }
        }
    }
    simd_level_cap() = (int)SimdLevel::avx512;
    set_blas_threads(threads);
}

}  // namespace

int main() {
    unsigned seed = 1;
    const Activation acts[] = {Activation::linear, Activation::relu, Activation::tanh, Activation::sigmoid,
                               Activation::gelu, Activation::softmax};
    for (Activation act : acts) {
        test_dense(7, 5, 3, act, true, false, seed++);       // OpenBLAS path
        test_dense(97, 61, 45, act, true, false, seed++);    // packed tiles, one thread (2.7e5 multiply-adds)
        test_dense(301, 67, 53, act, false, false, seed++);  // packed tiles split across threads (1.07e6)
        test_dense(37, 83, 96, act, true, false, seed++);    // few rows: W read in place, one thread (2.9e5)
        test_dense(200, 71, 48, act, false, false, seed++);  // few rows of a small W, in place, split (6.8e5)
        test_dense(1, 301, 1000, act, true, false, seed++);  // one row: W streamed, blocks split (3.0e5)
    }
    test_dense(97, 61, 45, Activation::relu, true, true, seed++);  // relu fused into the tiles
    test_dense(301, 67, 53, Activation::relu, true, true, seed++);
    test_dense(37, 83, 96, Activation::relu, true, true, seed++);  // relu fused into the in-place tiles
    test_dense(37, 83, 96, Activation::gelu, true, true, seed++);
    test_dense(1, 301, 1000, Activation::relu, false, true, seed++);
    test_dense(13, 11, 9, Activation::tanh, true, true, seed++);
    // one row as the decoder step runs it (dense_rows_in_place): a step's 256 x 256 product, column
    // blocks with tails, a product split across threads (67 x 1001) and small ones
    const std::pair<int, int> rows[] = {{256, 256}, {301, 200}, {1024, 40}, {67, 1001}, {37, 80}, {5, 3},
                                        {64, 1536}, {256, 1024}};
    for (auto [C, OC] : rows) {
        test_row_streamed(C, OC, Activation::linear, true, seed++);
        test_row_streamed(C, OC, Activation::relu, false, seed++);
        test_row_split_exact(C, OC, seed++);
    }
    return attnx::test::report("test_reference_dense");
}
