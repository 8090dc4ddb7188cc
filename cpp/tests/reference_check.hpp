// What the reference tests share: random operands, every SIMD level and thread split of the fast
// kernels, and the comparison with the reference (cpp/reference/) computed in double.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "attnx/activations.hpp"
#include "attnx/gemm.hpp"
#include "check.hpp"

namespace attnx::test {

// The activation's name, for the failure messages
inline const char* activation_name(Activation a) {
    switch (a) {
        case Activation::relu: return "relu";
        case Activation::tanh: return "tanh";
        case Activation::sigmoid: return "sigmoid";
        case Activation::softmax: return "softmax";
        case Activation::gelu: return "gelu";
        default: return "linear";
    }
}

// Random normal values that floats hold exactly, so that the float kernels and the double
// reference read the same operands
inline std::vector<double> random_values(std::mt19937& rng, size_t n, double scale = 1.0) {
    std::normal_distribution<double> normal(0.0, scale);
    std::vector<double> v(n);
    for (auto& e : v) e = (double)(float)normal(rng);
    return v;
}

template <class T> std::vector<T> cast(const std::vector<double>& v) { return std::vector<T>(v.begin(), v.end()); }

// fn(context) on every SIMD level this CPU runs and on thread budgets 1 and 2 (a kernel splits
// when its work is above kParallelMinWork: the tests' shapes make at least one case do so)
template <class F> void on_every_level_and_split(F&& fn) {
    const int threads = get_blas_threads();
    for (int level = 0; level <= (int)cpu_simd_level(); ++level)
        for (int n : {1, 2}) {
            simd_level_cap() = level;
            set_blas_threads(n);
            fn(std::string(simd_level_name((SimdLevel)level)) + (n == 1 ? " 1 thread" : " 2 threads"));
        }
    simd_level_cap() = (int)SimdLevel::avx512;
    set_blas_threads(threads);
}

// Every got[i] within tol (1 + |want[i]|) of the reference; reports the first miss
template <class T>
bool expect_near(const std::vector<T>& got, const std::vector<double>& want, double tol, const std::string& what) {
    if (got.size() != want.size()) {
        std::printf("FAIL %s: %zu values, want %zu\n", what.c_str(), got.size(), want.size());
        ++failures();
        return false;
    }
    for (size_t i = 0; i < got.size(); ++i)
        if (!(std::abs((double)got[i] - want[i]) <= tol * (1 + std::abs(want[i])))) {
            std::printf("FAIL %s[%zu]: got %.9g, reference %.9g\n", what.c_str(), i, (double)got[i], want[i]);
            ++failures();
            return false;
        }
    return true;
}

// Tolerances: double kernels agree with the reference to rounding; float kernels to float
// rounding through a few dozen operations
template <class T> constexpr double tolerance() { return sizeof(T) == sizeof(double) ? 1e-10 : 2e-4; }

// Named results of one kernel call, in double: {"dx", values}, ...
using Named = std::vector<std::pair<std::string, std::vector<double>>>;

template <class T> std::vector<double> to_double(const std::vector<T>& v) { return std::vector<double>(v.begin(), v.end()); }

inline void compare_all(const Named& got, const Named& want, double tol, const std::string& where) {
    for (size_t i = 0; i < want.size(); ++i)
        if (!expect_near(got[i].second, want[i].second, tol, where + " " + want[i].first)) return;
}

// run(T{}) -> Named, the fast kernel on operands of type T, against the reference's `want`: in
// float on every SIMD level and in double, each on one thread and on two
template <class Run> void check_every_level(const std::string& where, const Named& want, Run&& run, double float_tol = tolerance<float>()) {
    on_every_level_and_split([&](const std::string& level) {
        compare_all(run(float{}), want, float_tol, where + " float " + level);
        compare_all(run(double{}), want, tolerance<double>(), where + " double " + level);
    });
}

}  // namespace attnx::test
