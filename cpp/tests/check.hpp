// A tiny assertion harness for the C++ unit tests (ctest runs each test_*.cpp binary).
#pragma once
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace attnx::test {
inline int& failures() { static int n = 0; return n; }

inline void check_close(double got, double want, double tol, const char* what, int line) {
    if (!(std::abs(got - want) <= tol * (1.0 + std::abs(want)))) {
        std::printf("FAIL line %d: %s: got %.10g, want %.10g\n", line, what, got, want);
        ++failures();
    }
}

inline int report(const char* suite) {
    std::printf("%s: %s\n", suite, failures() ? "FAILED" : "ok");
    return failures() ? EXIT_FAILURE : EXIT_SUCCESS;
}
}  // namespace attnx::test

#define CHECK_CLOSE(got, want, tol) attnx::test::check_close((got), (want), (tol), #got, __LINE__)
#define CHECK(cond) \
    do { if (!(cond)) { std::printf("FAIL line %d: %s\n", __LINE__, #cond); ++attnx::test::failures(); } } while (0)
