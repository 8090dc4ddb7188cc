// OpenBLAS sgemm throughput (GFLOP/s, one thread, operands warm in cache) on the products attnx's
// recurrent layers run per thread in the benchmarks' (a) and (b) models, to set against the FMA
// peak of benchmarks/fma_peak.c: what a tuned general library reaches on exactly these shapes, the
// time step products with no gate math around them.
// On the OpenBLAS the Python module links (scipy-openblas32, symbols prefixed scipy_):
//   D=$(python -c "import scipy_openblas32 as s; print(s.get_lib_dir())")
//   gcc -O2 -DATTNX_SCIPY_OPENBLAS -o /tmp/gemm_shapes benchmarks/gemm_shapes.c -L$D -lscipy_openblas -Wl,-rpath,$D
//   /tmp/gemm_shapes
// or on the system's: gcc -O2 -o /tmp/gemm_shapes benchmarks/gemm_shapes.c -lopenblas
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#ifdef ATTNX_SCIPY_OPENBLAS
#define cblas_sgemm scipy_cblas_sgemm
#define openblas_set_num_threads scipy_openblas_set_num_threads
#define openblas_get_corename scipy_openblas_get_corename
#endif
enum { CblasRowMajor = 101 };
enum { CblasNoTrans = 111, CblasTrans = 112 };
void cblas_sgemm(int order, int trans_a, int trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc);
void openblas_set_num_threads(int);
char* openblas_get_corename(void);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

// C (M, N) += op(A) . B (K, N), row-major, A (M, K) or with transA (K, M); best of 5 timings of `reps` calls
static double gflops_t(const char* name, int transA, int M, int K, int N, int reps) {
    float* A = malloc(sizeof(float) * M * K);
    float* B = malloc(sizeof(float) * K * N);
    float* C = malloc(sizeof(float) * M * N);
    for (long i = 0; i < (long)M * K; ++i) A[i] = (float)(i % 7) * 0.01f;
    for (long i = 0; i < (long)K * N; ++i) B[i] = (float)(i % 5) * 0.01f;
    double best = 1e30;
    for (int r = 0; r < 6; ++r) {
        double t0 = now();
        for (int i = 0; i < reps; ++i)
            cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, CblasNoTrans, M, N, K, 1.f, A, transA ? M : K, B, N, 1.f, C, N);
        double t = (now() - t0) / reps;
        if (r > 0 && t < best) best = t;  // the first round warms the caches
    }
    double g = 2.0 * M * N * K / best * 1e-9;
    printf("%-44s M=%5d K=%5d N=%5d  %8.2f us  %6.1f GFLOP/s\n", name, M, K, N, best * 1e6, g);
    free(A), free(B), free(C);
    return g;
}
static double gflops(const char* n, int M, int K, int N, int reps) { return gflops_t(n, 0, M, K, N, reps); }

int main(void) {
    openblas_set_num_threads(1);
    printf("OpenBLAS core %s, one thread\n", openblas_get_corename());
    gflops("(a) LSTM(100) step, one thread's 16 rows", 16, 132, 400, 20000);
    gflops("(a) its reverse step (dgates . [U^T|0|W^T])", 16, 400, 144, 20000);
    gflops_t("(a) dW = x^T dgates, one thread's rows", 1, 32, 512, 400, 2000);
    gflops_t("(a) dU = h^T dgates", 1, 100, 512, 400, 2000);
    gflops_t("(a) [dW; dU] = [x | h]^T dgates", 1, 132, 512, 400, 2000);
    gflops("(b) LSTM(256) step, one thread's 32 rows", 32, 384, 1024, 2000);
    gflops("(b) its reverse step", 32, 1024, 384, 2000);
    gflops_t("(b) dW = x^T dgates, one thread's rows", 1, 128, 4096, 1024, 20);
    gflops_t("(b) dU = h^T dgates", 1, 256, 4096, 1024, 20);
    gflops_t("(b) [dW; dU] = [x | h]^T dgates", 1, 384, 4096, 1024, 20);
    gflops("square 2048", 2048, 2048, 2048, 3);
    return 0;
}
