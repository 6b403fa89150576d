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
// Time loops: StepGemm (below) issues a GEMM of fixed shape once per step through cuBLASLt
// with an algorithm chosen once, instead of cublasGemmEx, which re-runs cuBLAS's heuristic
// inside every call.
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
#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <cublasLt.h>
#include <cublas_v2.h>

#include "seqkernels/error_format.h"

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <vector>

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

namespace detail {

// Largest power of two (up to 256) dividing every address base + r * row_bytes, r >= 0: the
// alignment cuBLASLt's heuristic must assume for a matrix whose rows a loop walks through.
inline uint32_t row_alignment(const void* base, int64_t row_bytes) {
  const uint64_t bits = reinterpret_cast<uintptr_t>(base) | static_cast<uint64_t>(row_bytes) | 256u;
  return static_cast<uint32_t>(bits & (~bits + 1));
}

}  // namespace detail

// One GEMM of a time loop: row-major C[M, N] = alpha * op(A)[M, K] · op(B)[K, N] + beta * C
// (the contract of gemm() above), issued once per step with new pointers and, for a packed
// sequence, a new M.
//
// Why not gemm(): cublasGemmEx runs cuBLAS's algorithm heuristic inside every call, which
// costs ~10 µs of host time per call on an H100 host (benchmarks/micro/gemm_pick.cu) and, in
// an eager loop, stretches every step. StepGemm builds the cuBLASLt descriptors and asks
// cublasLtMatmulAlgoGetHeuristic once per distinct (M, operand alignments), keeps its first
// algorithm (below: without split-K for small GEMMs), and each step is one cublasLtMatmul:
// 2-3 µs less host time per step there. The plans are kept for the process (per device and
// GEMM signature), so a later call of the same shape asks no heuristic at all: one GEMM of a
// call (the LSTM's input projection) pays the launch only.
//
// Split-K only for GEMMs of at least 2^28 flops, or with K > N (below). Split-K adds a second
// kernel launch, and a time loop is host-bound at the small sizes where the heuristic also picks it: at B = 16,
// H = 512 (fp32, TF32; 34 MFLOP) its first choice (split-K 4) took 10.4-17.7 µs of host time per
// call against 8.4 µs for the first one without, an eager loop of (GEMM, small kernel) 14.5-24.1
// against 12.7 µs per step, while its device time was 5.7 against 6.8 µs (gemm_pick, H100
// host). Large GEMMs are device-bound and their deep K needs the split to fill the GPU: with no
// split-K anywhere, fp32 `train` at B = 64, H = 1024 (the backward's dG·W_hh, 537 MFLOP) ran
// 15.58 ms against cuDNN's 13.96 (0.90x), against 1.03x with the heuristic's choice (H100,
// bench_lstm.py, 2026-11-24).
//
// Deep-K GEMMs (K > N: the LSTM backward's dG·W_hh, K = 4H) keep it at every size too: without
// split-K the heuristic's kernel for dG·W_hh at B = 16, H = 1024, bf16 had four CTAs walk
// K = 4096 serially, 92 µs a step, and at B = 1 a gemv of 53 µs (H100, 2026-11-25;
// docs/kernels.md), far more than split-K's extra host time. GEMMs replayed from a CUDA graph
// (allow_split_k()) keep the heuristic's choice at every size: there a second kernel costs no
// host time.
//
// Precision as gemm(): float32 uses TF32 exactly when the BlasContext allows it. The
// workspace is PyTorch's cuBLASLt workspace of the current stream, so nothing is allocated;
// the algorithm is fixed per plan, so two runs give bitwise-identical results. A shape for
// which the heuristic offers nothing runs through gemm().
// StepGemm's constructor tag: the caller provides the workspace (set_workspace).
struct CallerWorkspace {};

template <class AB, class CT, class Scale>
class StepGemm {
 public:
  StepGemm(const BlasContext& ctx, Trans ta, Trans tb, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc)
      : StepGemm(ctx, ta, tb, N, K, lda, ldb, ldc, CallerWorkspace{}) {
    workspace_ = at::cuda::getCUDABlasLtWorkspace();
    heuristic_workspace_ = workspace_bytes_;
  }
  // Without a workspace yet, for a GEMM captured into a CUDA graph that outlives the call (the
  // replayed LSTM loop, lstm.cu): such a graph must not hold PyTorch's per-stream workspace,
  // which PyTorch may free or hand to other work in the meantime. The caller asks
  // plan_workspace() what the plan needs, allocates that and hands it over with set_workspace()
  // before the first call.
  //
  // The plan may need up to PyTorch's cuBLASLt workspace size, or up to kDeepKWorkspaceCap for
  // an fp32 deep-K GEMM (K > N). Offered PyTorch's size (CUBLASLT_WORKSPACE_SIZE; 1, 4 and 8
  // MiB measured alike), the heuristic ranks first a split-K kernel that adds its K slices
  // into C one after another; offered 32 MiB, a split-K kernel whose slices a second kernel
  // sums: dG·W_hh at B = 16, H = 1024 (TF32) 9.5 against 18.6 µs a step, at B = 64 10.5
  // against 20.4 (H100, scripts/gemm_layout_probe.py, 2026-11-25). Other GEMMs keep
  // PyTorch's limit: the forward's h·W_hhᵀ got slower with the larger one (10.2 against 8.3 µs
  // at B = 16); half types were not measured with it.
  StepGemm(const BlasContext& ctx, Trans ta, Trans tb, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc,
           CallerWorkspace)
      : ctx_(ctx), ta_(ta), tb_(tb), N_(N), K_(K), lda_(lda), ldb_(ldb), ldc_(ldc),
        lt_(at::cuda::getCurrentCUDABlasLtHandle()), workspace_(nullptr),
        workspace_bytes_(at::cuda::getCUDABlasLtWorkspaceSize()), stream_(at::cuda::getCurrentCUDAStream()),
        device_(c10::cuda::current_device()) {
    heuristic_workspace_ = std::is_same_v<AB, float> && K_ > N_ ? kDeepKWorkspaceCap : workspace_bytes_;
  }
  StepGemm(const StepGemm&) = delete;
  StepGemm& operator=(const StepGemm&) = delete;

  // The workspace bytes cuBLASLt's algorithm for these operands needs, or -1 without one (then
  // operator() would run gemm(), on the stream the BlasContext's handle was bound to, which a
  // capture on another stream must not meet).
  int64_t plan_workspace(int64_t M, const AB* A, const AB* B, const CT* C) {
    const Plan& p = plan_for(M, A, B, C);
    return p.found ? static_cast<int64_t>(p.workspace) : -1;
  }
  // Keep the heuristic's first choice at every size, split-K included (call before the first
  // GEMM): for GEMMs replayed from a CUDA graph, where split-K's second kernel costs no host
  // time. Without split-K the deep-K GEMM of the LSTM backward (dG·W_hh, K = 4H) ran as one
  // serial kernel at small B: 92 µs a step at B = 16, H = 1024, bf16 (H100, 2026-11-25).
  void allow_split_k() { split_k_always_ = true; }
  // K split into `parts` GEMMs of K_ each (the K given to the constructor is one part's), issued
  // as one strided batch: part p multiplies A's and op(B)'s p-th K slices (A row-major with
  // ta = N) into C's p-th [M, N] block, C + p·M·ldc, and the caller sums the blocks. Why: at
  // the replayed LSTM loop's B ≤ 256 a step GEMM has too few output tiles to keep the SMs
  // busy, and cuBLASLt's own split-K adds a reduction kernel where the gate kernel that reads
  // C can add the parts for free (lstm.cu, step_k_parts). Call before the first GEMM.
  void split_k_into(int parts) {
    // (A part's K·sizeof(AB) a multiple of 16 bytes: every part keeps the operands' alignment.)
    TORCH_CHECK(parts == 1 || (parts > 1 && ta_ == Trans::N && (K_ * int64_t(sizeof(AB))) % 16 == 0),
                "seqkernels: StepGemm splits K only for A not transposed and parts of 16-byte multiples, got ",
                parts, " parts of K = ", K_);
    k_parts_ = parts;
  }
  void set_workspace(void* workspace, size_t bytes) {
    workspace_ = workspace;
    workspace_bytes_ = bytes;
  }
  void operator()(int64_t M, Scale alpha, const AB* A, const AB* B, Scale beta, CT* C) {
    if (M == 0 || N_ == 0 || K_ == 0) {  // (K = 0: C = beta * C, which gemm() does)
      if (M > 0 && N_ > 0) gemm<AB, CT, Scale>(ctx_, ta_, tb_, M, N_, K_, alpha, A, lda_, B, ldb_, beta, C, ldc_);
      return;
    }
    const Plan& plan = plan_for(M, A, B, C);
    if (!plan.found) {
      for (int p = 0; p < k_parts_; ++p) {
        gemm<AB, CT, Scale>(ctx_, ta_, tb_, M, N_, K_, alpha, A + p * a_part_stride(), lda_, B + p * b_part_stride(),
                            ldb_, beta, C + p * M * ldc_, ldc_);
      }
      return;
    }
    // Operands swapped as in gemm(): cuBLASLt's A is our B.
    TORCH_CUDABLAS_CHECK(cublasLtMatmul(lt_, plan.op, &alpha, B, plan.layout_b, A, plan.layout_a, &beta, C,
                                        plan.layout_c, C, plan.layout_c, &plan.algo, workspace_, workspace_bytes_,
                                        stream_));
  }

 private:
  struct Plan {
    int64_t M = 0;
    uint32_t align_a = 0, align_b = 0, align_c = 0;
    bool found = false;
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t layout_a = nullptr, layout_b = nullptr, layout_c = nullptr;  // ours: A, B, C
    cublasLtMatmulAlgo_t algo{};
    size_t workspace = 0;  // bytes the algorithm needs
    Plan() = default;
    Plan(const Plan&) = delete;
    Plan& operator=(const Plan&) = delete;
    ~Plan() {
      // Never throw from a destructor: statuses ignored.
      if (layout_c) (void)cublasLtMatrixLayoutDestroy(layout_c);
      if (layout_b) (void)cublasLtMatrixLayoutDestroy(layout_b);
      if (layout_a) (void)cublasLtMatrixLayoutDestroy(layout_a);
      if (op) (void)cublasLtMatmulDescDestroy(op);
    }
  };

  static constexpr bool kHalfType = std::is_same_v<AB, c10::Half> || std::is_same_v<AB, c10::BFloat16>;

  // Everything build() depends on besides the AB / CT types (the template's): the device (its
  // architecture decides the algorithms), the GEMM's shape and strides, the operands'
  // alignments, TF32, the split-K rule's input and the workspace the plan may need.
  using PlanKey = std::tuple<int, int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, uint32_t, uint32_t,
                             uint32_t, bool, bool, size_t, int>;
  // Elements between consecutive K parts of A (row-major, K contiguous) and of B (op T: K
  // contiguous; op N: K runs down the rows).
  int64_t a_part_stride() const { return K_; }
  int64_t b_part_stride() const { return tb_ == Trans::T ? K_ : K_ * ldb_; }
  // Plans kept for the process, shared by every StepGemm of this type (never destroyed: a
  // plan is a few small host objects). Past kMaxKeptPlans distinct keys (e.g. many ragged
  // batch sizes) new plans are kept by their StepGemm only.
  static constexpr size_t kMaxKeptPlans = 4096;
  struct PlanCache {
    std::mutex mutex;
    std::map<PlanKey, std::shared_ptr<const Plan>> plans;
  };
  static PlanCache& plan_cache() {
    static auto* cache = new PlanCache();  // never destroyed, like the cuBLAS handles' pools
    return *cache;
  }

  // The plan of these operands: their row alignments decide which algorithms may run.
  const Plan& plan_for(int64_t M, const AB* A, const AB* B, const CT* C) {
    const uint32_t align_a = detail::row_alignment(A, lda_ * int64_t(sizeof(AB)));
    const uint32_t align_b = detail::row_alignment(B, ldb_ * int64_t(sizeof(AB)));
    const uint32_t align_c = detail::row_alignment(C, ldc_ * int64_t(sizeof(CT)));
    for (const auto& p : plans_) {
      if (p->M == M && p->align_a == align_a && p->align_b == align_b && p->align_c == align_c) return *p;
    }
    const PlanKey key{device_, int(ta_), int(tb_), M, N_, K_, lda_, ldb_, ldc_, align_a, align_b, align_c,
                      ctx_.tf32(), split_k_always_, heuristic_workspace_, k_parts_};
    PlanCache& cache = plan_cache();
    {
      const std::lock_guard<std::mutex> lock(cache.mutex);
      const auto it = cache.plans.find(key);
      if (it != cache.plans.end()) return *plans_.emplace_back(it->second);
    }
    auto p = std::make_shared<Plan>();
    p->M = M;
    p->align_a = align_a;
    p->align_b = align_b;
    p->align_c = align_c;
    build(*p);
    {
      const std::lock_guard<std::mutex> lock(cache.mutex);
      if (cache.plans.size() < kMaxKeptPlans) cache.plans.emplace(key, p);
    }
    return *plans_.emplace_back(std::move(p));
  }

  void build(Plan& p) const {
    cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
    cudaDataType_t scale = CUDA_R_32F;
    if constexpr (std::is_same_v<AB, double>) {
      compute = CUBLAS_COMPUTE_64F;
      scale = CUDA_R_64F;
    } else if constexpr (std::is_same_v<AB, float>) {
      if (ctx_.tf32()) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
    }
    TORCH_CUDABLAS_CHECK(cublasLtMatmulDescCreate(&p.op, compute, scale));
    // Column-major call of gemm(): m = N, n = M, cuBLASLt's A = our B (op tb), its B = our A (op ta).
    const cublasOperation_t op_first = detail::to_cublas(tb_), op_second = detail::to_cublas(ta_);
    TORCH_CUDABLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)));
    TORCH_CUDABLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)));
    const int64_t m = N_, n = p.M, k = K_;
    // A column-major layout is (rows, cols, ld) of the matrix as stored: op N stores m x k.
    TORCH_CUDABLAS_CHECK(cublasLtMatrixLayoutCreate(&p.layout_b, detail::CudaType<AB>::value,
                                                    tb_ == Trans::N ? m : k, tb_ == Trans::N ? k : m, ldb_));
    TORCH_CUDABLAS_CHECK(cublasLtMatrixLayoutCreate(&p.layout_a, detail::CudaType<AB>::value,
                                                    ta_ == Trans::N ? k : n, ta_ == Trans::N ? n : k, lda_));
    TORCH_CUDABLAS_CHECK(cublasLtMatrixLayoutCreate(&p.layout_c, detail::CudaType<CT>::value, m, n, ldc_));
    if (k_parts_ > 1) {
      const int32_t count = k_parts_;
      const int64_t strides[3] = {b_part_stride(), a_part_stride(), p.M * ldc_};
      const cublasLtMatrixLayout_t layouts[3] = {p.layout_b, p.layout_a, p.layout_c};
      for (int i = 0; i < 3; ++i) {
        TORCH_CUDABLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                              sizeof(count)));
        TORCH_CUDABLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
            layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i], sizeof(strides[i])));
      }
    }

    cublasLtMatmulPreference_t pref = nullptr;
    TORCH_CUDABLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t max_workspace = heuristic_workspace_;
    // Split-K only for large or deep-K GEMMs (the class comment) unless allow_split_k(); a
    // half-type C reduces partial sums in fp32 only (the reduced-precision reduction
    // BlasContext disallows for cublasGemmEx).
    const bool split_k = split_k_always_ || K_ > N_ ||
                         2.0 * double(p.M) * double(N_) * double(K_) >= double(int64_t(1) << 28);
    const uint32_t reduction = !split_k ? uint32_t(CUBLASLT_REDUCTION_SCHEME_NONE)
                               : std::is_same_v<CT, AB> && kHalfType ? uint32_t(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE)
                                                                    : uint32_t(CUBLASLT_REDUCTION_SCHEME_MASK);
    const uint32_t align_first = p.align_b, align_second = p.align_a, align_c = p.align_c;
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                             &max_workspace, sizeof(max_workspace));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction,
                                                sizeof(reduction));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_first,
                                                sizeof(align_first));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_second,
                                                sizeof(align_second));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                                sizeof(align_c));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                                sizeof(align_c));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = cublasLtMatmulAlgoGetHeuristic(lt_, p.op, p.layout_b, p.layout_a, p.layout_c, p.layout_c, pref, 1, &result,
                                          &found);
    }
    (void)cublasLtMatmulPreferenceDestroy(pref);
    // NOT_SUPPORTED: no algorithm for this shape (p.found stays false: gemm() runs it).
    if (st != CUBLAS_STATUS_NOT_SUPPORTED) TORCH_CUDABLAS_CHECK(st);
    p.found = st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS &&
              result.workspaceSize <= heuristic_workspace_;
    if (p.found) {
      p.algo = result.algo;
      p.workspace = result.workspaceSize;
    }
  }

  const BlasContext& ctx_;
  const Trans ta_, tb_;
  const int64_t N_, K_, lda_, ldb_, ldc_;
  cublasLtHandle_t lt_;
  void* workspace_;
  size_t workspace_bytes_;
  cudaStream_t stream_;
  bool split_k_always_ = false;
  int k_parts_ = 1;  // split_k_into
  static constexpr size_t kDeepKWorkspaceCap = size_t(32) << 20;
  size_t heuristic_workspace_;  // the most workspace the chosen algorithm may need
  int device_;
  std::vector<std::shared_ptr<const Plan>> plans_;  // this object's, looked up first
};

}  // namespace cuda
}  // namespace seqkernels
