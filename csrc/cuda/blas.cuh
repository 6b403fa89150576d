// The one place in seqkernels that talks to cuBLAS: a typed, row-major GEMM.
//
//   C[M, N] = alpha * op(A) * op(B) + beta * C
//
// A, B and C are ROW-MAJOR: element (r, c) of a matrix with leading dimension ld lives at
// ptr[r * ld + c]. op(A) is [M, K] (A itself is [M, K] with Trans::N, [K, M] with Trans::T),
// op(B) is [K, N] (B is [K, N] or [N, K]), C is [M, N]; lda/ldb/ldc are the row strides of A,
// B and C as stored (>= their number of columns).
//
// Row-major <-> column-major. cuBLAS is column-major. A row-major [R, C] matrix with leading
// dimension ld is, byte for byte, the column-major [C, R] matrix with the same ld: its
// transpose. So the row-major product C = op(A)·op(B) is, in cuBLAS's terms,
//   Cᵀ = op(B)ᵀ · op(A)ᵀ       (column-major [N, M] = [N, K] · [K, M])
// which is one cuBLAS call with the operands swapped and the same transpose flags:
//   gemm(transb, transa, m = N, n = M, k = K, B, ldb, A, lda, C, ldc).
// Nothing else in the code base swaps operands or thinks in column-major.
//
// Types (AB = the type of A and B, CT = the type of C):
//   double                      cublasDgemm
//   float                       cublasGemmEx, CUBLAS_COMPUTE_32F, or CUBLAS_COMPUTE_32F_FAST_TF32
//                               when the context allows TF32 (see rnn_allows_tf32 below)
//   at::Half / at::BFloat16     cublasGemmEx, CUBLAS_COMPUTE_32F (fp32 accumulation), C either
//                               the same half type or float
//
// Handle and stream: PyTorch's handle for the current device and thread
// (at::cuda::getCurrentCUDABlasHandle(), which binds it to the current stream and to a
// workspace from the caching allocator), so every GEMM runs on the current stream and can be
// captured in a CUDA graph. We never set another stream on it.
//
// Math mode. PyTorch sets the handle's math mode every time it hands the handle out
// (CUBLAS_TF32_TENSOR_OP_MATH when torch.backends.cuda.matmul allows TF32), and that mode
// would silently turn our CUBLAS_COMPUTE_32F float GEMMs into TF32 ones. BlasContext therefore
// pins the mode to CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION for
// its lifetime and restores the previous mode afterwards: precision is chosen per call by the
// compute type alone, and split-K partial sums of half-type outputs stay in fp32.
#pragma once

#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/Exceptions.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <cublas_v2.h>

#include "seqkernels/error_format.h"

#include <cstdint>
#include <limits>
#include <type_traits>

namespace seqkernels {
namespace cuda {

enum class Trans { N, T };

// Whether a float32 LSTM may use TF32 tensor cores: exactly when PyTorch's cuDNN RNN would.
// aten/src/ATen/native/cudnn/RNN.cpp builds its RNN descriptor with
//   at::globalContext().allowTF32CuDNN(at::Float32Op::RNN)
// and the descriptor (ATen/cudnn/Descriptors.h) selects CUDNN_FMA_MATH (no tensor cores) for
// float data when that is false, a math type that lets cuDNN use TF32 when it is true. That per-operator getter reads the fp32_precision tree
// (torch.backends.cudnn.rnn.fp32_precision -> cudnn -> generic, which the legacy
// torch.backends.cudnn.allow_tf32 setter also writes); unlike the operator-less legacy getter
// allowTF32CuDNN() it never raises when the user mixed the legacy and the per-backend flags.
// PyTorch's default is TF32 on. Present with this signature in torch 2.11 and 2.13.
inline bool rnn_allows_tf32() {
  return at::globalContext().allowTF32CuDNN(at::Float32Op::RNN);
}

namespace detail {

template <class T>
struct CudaType;
template <>
struct CudaType<float> {
  static constexpr cudaDataType_t value = CUDA_R_32F;
};
template <>
struct CudaType<double> {
  static constexpr cudaDataType_t value = CUDA_R_64F;
};
template <>
struct CudaType<c10::Half> {
  static constexpr cudaDataType_t value = CUDA_R_16F;
};
template <>
struct CudaType<c10::BFloat16> {
  static constexpr cudaDataType_t value = CUDA_R_16BF;
};

inline cublasOperation_t to_cublas(Trans t) { return t == Trans::N ? CUBLAS_OP_N : CUBLAS_OP_T; }

inline int checked_int(int64_t v, const char* what) {
  TORCH_CHECK(v >= 0 && v <= std::numeric_limits<int>::max(), "seqkernels.blas: ", what, " = ", seqkernels::num(v),
              " does not fit the 32-bit cuBLAS API");
  return static_cast<int>(v);
}

}  // namespace detail

// The cuBLAS handle of the current device and stream, configured for seqkernels' GEMMs for as
// long as the object lives (create it after the CUDAGuard, once per operator call, before
// the time loop; the handle then carries no per-call cost).
class BlasContext {
 public:
  // tf32: let float32 GEMMs use TF32 tensor cores (pass rnn_allows_tf32() for float32 data).
  explicit BlasContext(bool tf32) : tf32_(tf32) {
    // NoTF32Guard: PyTorch's own setup then leaves the handle in CUBLAS_DEFAULT_MATH and does
    // not consult the matmul TF32 flags at all; we set the mode explicitly below either way.
    at::NoTF32Guard no_tf32;
    handle_ = at::cuda::getCurrentCUDABlasHandle();
    TORCH_CUDABLAS_CHECK(cublasGetMathMode(handle_, &saved_mode_));
    TORCH_CUDABLAS_CHECK(cublasSetMathMode(
        handle_, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  }
  ~BlasContext() {
    // Never throw from a destructor; the handle is PyTorch's and is reset on its next use anyway.
    (void)cublasSetMathMode(handle_, saved_mode_);
  }
  BlasContext(const BlasContext&) = delete;
  BlasContext& operator=(const BlasContext&) = delete;

  cublasHandle_t handle() const { return handle_; }
  bool tf32() const { return tf32_; }

 private:
  cublasHandle_t handle_ = nullptr;
  cublasMath_t saved_mode_ = CUBLAS_DEFAULT_MATH;
  bool tf32_ = false;
};

// Row-major C[M, N] = alpha * op(A)[M, K] · op(B)[K, N] + beta * C (see the top of this file).
// AB: double, float, c10::Half or c10::BFloat16; CT: AB, or float when AB is a half type.
// Scale: double for double GEMMs, float otherwise (fp32 compute).
template <class AB, class CT, class Scale>
void gemm(const BlasContext& ctx, Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, Scale alpha, const AB* A,
          int64_t lda, const AB* B, int64_t ldb, Scale beta, CT* C, int64_t ldc) {
  constexpr bool kHalfType = std::is_same_v<AB, c10::Half> || std::is_same_v<AB, c10::BFloat16>;
  static_assert(std::is_same_v<AB, double> || std::is_same_v<AB, float> || kHalfType,
                "seqkernels.blas: A and B must be double, float, Half or BFloat16");
  static_assert(std::is_same_v<CT, AB> || (kHalfType && std::is_same_v<CT, float>),
                "seqkernels.blas: C must have the type of A and B, or float for half-type A and B");
  static_assert(std::is_same_v<Scale, std::conditional_t<std::is_same_v<AB, double>, double, float>>,
                "seqkernels.blas: alpha/beta are double for double GEMMs and float otherwise");
  if (M == 0 || N == 0) return;
  // Column-major call: m = N, n = M, operands swapped (B first).
  const int m = detail::checked_int(N, "N");
  const int n = detail::checked_int(M, "M");
  const int k = detail::checked_int(K, "K");
  const int ld_a = detail::checked_int(lda, "lda");
  const int ld_b = detail::checked_int(ldb, "ldb");
  const int ld_c = detail::checked_int(ldc, "ldc");
  const cublasOperation_t op_b = detail::to_cublas(tb);
  const cublasOperation_t op_a = detail::to_cublas(ta);
  if constexpr (std::is_same_v<AB, double>) {
    TORCH_CUDABLAS_CHECK(
        cublasDgemm(ctx.handle(), op_b, op_a, m, n, k, &alpha, B, ld_b, A, ld_a, &beta, C, ld_c));
  } else {
    cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
    if constexpr (std::is_same_v<AB, float>) {
      if (ctx.tf32()) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
    }
    TORCH_CUDABLAS_CHECK(cublasGemmEx(ctx.handle(), op_b, op_a, m, n, k, &alpha, B, detail::CudaType<AB>::value,
                                      ld_b, A, detail::CudaType<AB>::value, ld_a, &beta, C,
                                      detail::CudaType<CT>::value, ld_c, compute, CUBLAS_GEMM_DEFAULT));
  }
}

}  // namespace cuda
}  // namespace seqkernels
