// The one place the CPU code talks to BLAS. Callers think in row-major PyTorch tensors;
// BLAS is column-major, so a row-major C = op(A)·op(B) is computed as the column-major
// Cᵀ = op(B)ᵀ·op(A)ᵀ: the operands (and their transposes) swap, M and N swap, and the
// leading dimensions stay the row strides.
//
// We call the BLAS that libtorch itself links (MKL on x86-64 builds) directly, with no
// ATen dispatch per call: the time loop issues one small GEMM per step, and dispatch
// would cost more than the arithmetic at small batch. Half-precision inputs accumulate
// and write in float32 (MKL's *gemm_bf16bf16f32 / *gemm_f16f16f32).
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include "seqkernels/error_format.h"

#include <cstdint>
#include <limits>

extern "C" {
// Weak: resolved from libtorch_cpu at load time; a torch built without them gets a clear
// error at the first call instead of an unloadable extension.
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
            const int* ldc) __attribute__((weak));
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const double* alpha,
            const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
            const int* ldc) __attribute__((weak));
// MKL's CBLAS enums are plain ints: ColMajor 102, NoTrans 111, Trans 112.
void cblas_gemm_bf16bf16f32(int layout, int transa, int transb, int m, int n, int k, float alpha,
                            const uint16_t* a, int lda, const uint16_t* b, int ldb, float beta, float* c, int ldc)
    __attribute__((weak));
void cblas_gemm_f16f16f32(int layout, int transa, int transb, int m, int n, int k, float alpha, const uint16_t* a,
                          int lda, const uint16_t* b, int ldb, float beta, float* c, int ldc) __attribute__((weak));
}

namespace seqkernels::cpu {

enum class Trans : bool { No = false, Yes = true };

namespace detail {
inline int to_int(int64_t v) {
  // LP64 BLAS: every dimension and leading dimension must fit in 32 bits.
  TORCH_CHECK(v <= std::numeric_limits<int>::max(), "seqkernels: matrix dimension ", seqkernels::num(v),
              " exceeds the BLAS limit");
  return static_cast<int>(v);
}
inline const char* fortran(Trans t) { return t == Trans::Yes ? "T" : "N"; }
inline int cblas(Trans t) { return t == Trans::Yes ? 112 : 111; }
constexpr int kColMajor = 102;
}  // namespace detail

// Row-major C[M, N] = op(A)[M, K] · op(B)[K, N] + beta · C, with lda/ldb/ldc the row strides
// of A, B and C as stored. acc_t is float for half inputs, the input type otherwise.
inline void gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                 const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  TORCH_CHECK(sgemm_ != nullptr, "seqkernels: this torch build exports no sgemm_ (BLAS) symbol");
  const int m = detail::to_int(N), n = detail::to_int(M), k = detail::to_int(K);
  const int la = detail::to_int(lda), lb = detail::to_int(ldb), lc = detail::to_int(ldc);
  const float one = 1.f;
  sgemm_(detail::fortran(tb), detail::fortran(ta), &m, &n, &k, &one, B, &lb, A, &la, &beta, C, &lc);
}

inline void gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const double* A, int64_t lda,
                 const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  TORCH_CHECK(dgemm_ != nullptr, "seqkernels: this torch build exports no dgemm_ (BLAS) symbol");
  const int m = detail::to_int(N), n = detail::to_int(M), k = detail::to_int(K);
  const int la = detail::to_int(lda), lb = detail::to_int(ldb), lc = detail::to_int(ldc);
  const double one = 1.0;
  dgemm_(detail::fortran(tb), detail::fortran(ta), &m, &n, &k, &one, B, &lb, A, &la, &beta, C, &lc);
}

inline void gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const c10::BFloat16* A, int64_t lda,
                 const c10::BFloat16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  TORCH_CHECK(cblas_gemm_bf16bf16f32 != nullptr,
              "seqkernels: bfloat16 on the CPU needs a torch built with MKL (cblas_gemm_bf16bf16f32)");
  cblas_gemm_bf16bf16f32(detail::kColMajor, detail::cblas(tb), detail::cblas(ta), detail::to_int(N), detail::to_int(M),
                         detail::to_int(K), 1.f, reinterpret_cast<const uint16_t*>(B), detail::to_int(ldb),
                         reinterpret_cast<const uint16_t*>(A), detail::to_int(lda), beta, C, detail::to_int(ldc));
}

inline void gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const c10::Half* A, int64_t lda,
                 const c10::Half* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  TORCH_CHECK(cblas_gemm_f16f16f32 != nullptr,
              "seqkernels: float16 on the CPU needs a torch built with MKL (cblas_gemm_f16f16f32)");
  cblas_gemm_f16f16f32(detail::kColMajor, detail::cblas(tb), detail::cblas(ta), detail::to_int(N), detail::to_int(M),
                       detail::to_int(K), 1.f, reinterpret_cast<const uint16_t*>(B), detail::to_int(ldb),
                       reinterpret_cast<const uint16_t*>(A), detail::to_int(lda), beta, C, detail::to_int(ldc));
}

}  // namespace seqkernels::cpu
