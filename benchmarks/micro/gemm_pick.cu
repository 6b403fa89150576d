// Which cuBLAS kernel the LSTM loop's per-step recurrent GEMM gets, and what the others cost
// (sm_90, float32 data, TF32 compute): gates[B, 4H] += h[B, H] · W_hhᵀ, i.e. the column-major
// call of csrc/cuda/blas.cuh: op(W) = T, op(h) = N, m = 4H, n = B, k = H, beta = 1.
// For each shape it times (device time per GEMM, µs: 200 calls in a CUDA graph, median of 5 replays):
//   gemmex/default+noRR  cublasGemmEx, CUBLAS_DEFAULT_MATH | DISALLOW_REDUCED_PRECISION_REDUCTION
//                        (what blas.cuh sets today)
//   gemmex/default       cublasGemmEx, CUBLAS_DEFAULT_MATH
//   lt/heuristic[i]      cublasLtMatmul with the i-th algorithm of cublasLtMatmulAlgoGetHeuristic
// and, for cublasGemmEx and for cublasLtMatmul with heuristic[0] fixed beforehand, the host's
// side of an eager time loop: host µs to issue one call, and wall µs per step of 256 steps of
// (GEMM, a small pointwise kernel) issued back to back as lstm.cu's loop does.
//
//   nvcc -O3 -arch=sm_90 -o /tmp/gemm_pick benchmarks/micro/gemm_pick.cu -lcublas -lcublasLt && /tmp/gemm_pick
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(call)                                                                      \
  do {                                                                                   \
    cudaError_t err_ = (call);                                                           \
    if (err_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(err_)); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)
#define CHECK_BLAS(call)                                                      \
  do {                                                                        \
    int st_ = static_cast<int>(call);                                         \
    if (st_ != 0) {                                                           \
      std::fprintf(stderr, "%s:%d: cublas status %d\n", __FILE__, __LINE__, st_); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)

// Device time per call: 200 calls captured in a CUDA graph, the graph replayed (back-to-back
// launches from the host would time cuBLAS's host cost instead, ~8 µs a call here).
template <class F>
float median_us(F&& call, cudaStream_t stream) {
  for (int i = 0; i < 5; ++i) call();
  CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < 200; ++i) call();
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<float> us;
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  CHECK(cudaGraphLaunch(exec, stream));
  for (int rep = 0; rep < 5; ++rep) {
    CHECK(cudaEventRecord(a, stream));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(b, stream));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    us.push_back(ms * 1e3f / 200);
  }
  std::sort(us.begin(), us.end());
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  return us[us.size() / 2];
}

__global__ void pointwise_stand_in(float* c, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = c[i] * 0.5f;
}

// Host µs to issue one call (200 calls issued back to back, timed before the synchronise) and
// wall µs per step of 256 steps of (call, pointwise_stand_in), as an eager loop runs them.
template <class F>
void host_cost(const char* label, F&& call, float* C, int n, cudaStream_t stream) {
  for (int i = 0; i < 20; ++i) call();
  CHECK(cudaStreamSynchronize(stream));
  std::vector<double> issue, step;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 200; ++i) call();
    auto t1 = std::chrono::steady_clock::now();
    CHECK(cudaStreamSynchronize(stream));
    issue.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 200);
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 256; ++i) {
      call();
      pointwise_stand_in<<<(n + 255) / 256, 256, 0, stream>>>(C, n);
      CHECK(cudaGetLastError());
    }
    CHECK(cudaStreamSynchronize(stream));
    t1 = std::chrono::steady_clock::now();
    step.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 256);
  }
  std::sort(issue.begin(), issue.end());
  std::sort(step.begin(), step.end());
  std::printf("  host %-16s issue %6.2f us/call, eager loop %6.2f us/step\n", label, issue[2], step[2]);
}

int main() {
  const int shapes[][2] = {{1, 512}, {16, 512}, {64, 512}, {256, 512}, {256, 256}, {64, 1024}, {256, 1024}};  // (B, H)
  cublasHandle_t handle;
  cublasLtHandle_t lt;
  CHECK_BLAS(cublasCreate(&handle));
  CHECK_BLAS(cublasLtCreate(&lt));
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  CHECK_BLAS(cublasSetStream(handle, stream));
  const size_t ws_bytes = 32u << 20;
  void* ws = nullptr;
  CHECK(cudaMalloc(&ws, ws_bytes));
  CHECK_BLAS(cublasSetWorkspace(handle, ws, ws_bytes));
  for (const auto& shape : shapes) {
    const int B = shape[0], H = shape[1];
    const int m = 4 * H, n = B, k = H;
    float *W, *h, *C;
    CHECK(cudaMalloc(&W, sizeof(float) * m * k));
    CHECK(cudaMalloc(&h, sizeof(float) * k * n));
    CHECK(cudaMalloc(&C, sizeof(float) * m * n));
    CHECK(cudaMemset(W, 0, sizeof(float) * m * k));
    CHECK(cudaMemset(h, 0, sizeof(float) * k * n));
    CHECK(cudaMemset(C, 0, sizeof(float) * m * n));
    const float one = 1.0f;
    std::printf("B=%d H=%d (m=%d n=%d k=%d, TN, TF32)\n", B, H, m, n, k);
    for (int mode = 0; mode < 2; ++mode) {
      const int math = CUBLAS_DEFAULT_MATH | (mode == 0 ? CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION : 0);
      CHECK_BLAS(cublasSetMathMode(handle, static_cast<cublasMath_t>(math)));
      const float us = median_us([&] {
        CHECK_BLAS(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, W, CUDA_R_32F, k, h, CUDA_R_32F, k,
                                &one, C, CUDA_R_32F, m, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
      }, stream);
      std::printf("  gemmex/%-14s %7.2f us\n", mode == 0 ? "default+noRR" : "default", us);
    }
    host_cost("gemmex", [&] {
      CHECK_BLAS(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, W, CUDA_R_32F, k, h, CUDA_R_32F, k,
                              &one, C, CUDA_R_32F, m, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
    }, C, m * n, stream);
    cublasLtMatmulDesc_t op;
    CHECK_BLAS(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    cublasLtMatrixLayout_t la, lb, lc;
    CHECK_BLAS(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, k, m, k));
    CHECK_BLAS(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, k, n, k));
    CHECK_BLAS(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, m, n, m));
    cublasLtMatmulPreference_t pref;
    CHECK_BLAS(cublasLtMatmulPreferenceCreate(&pref));
    CHECK_BLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                    sizeof(ws_bytes)));
    cublasLtMatmulHeuristicResult_t res[16];
    int found = 0;
    CHECK_BLAS(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 16, res, &found));
    {
      // The same query allowing no split-K reduction (what StepGemm asks for): its first algorithm.
      cublasLtMatmulPreference_t pref0;
      CHECK_BLAS(cublasLtMatmulPreferenceCreate(&pref0));
      CHECK_BLAS(cublasLtMatmulPreferenceSetAttribute(pref0, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                      sizeof(ws_bytes)));
      const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
      CHECK_BLAS(cublasLtMatmulPreferenceSetAttribute(pref0, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &none,
                                                      sizeof(none)));
      cublasLtMatmulHeuristicResult_t r0{};
      int found0 = 0;
      CHECK_BLAS(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref0, 1, &r0, &found0));
      cublasLtMatmulPreferenceDestroy(pref0);
      if (found0 > 0) {
        int splitk = -1;
        size_t written = 0;
        cublasLtMatmulAlgoConfigGetAttribute(&r0.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk),
                                             &written);
        const float us = median_us([&] {
          CHECK_BLAS(cublasLtMatmul(lt, op, &one, W, la, h, lb, &one, C, lc, C, lc, &r0.algo, ws, r0.workspaceSize,
                                    stream));
        }, stream);
        std::printf("  lt/no-reduction[0] %7.2f us  (split-k %d)\n", us, splitk);
        host_cost("lt/no-reduction[0]", [&] {
          CHECK_BLAS(cublasLtMatmul(lt, op, &one, W, la, h, lb, &one, C, lc, C, lc, &r0.algo, ws, r0.workspaceSize,
                                    stream));
        }, C, m * n, stream);
      } else {
        std::printf("  lt/no-reduction: none offered\n");
      }
    }
    if (found > 0) {
      host_cost("lt/heuristic[0]", [&] {
        CHECK_BLAS(cublasLtMatmul(lt, op, &one, W, la, h, lb, &one, C, lc, C, lc, &res[0].algo, ws,
                                  res[0].workspaceSize, stream));
      }, C, m * n, stream);
    }
    for (int i = 0; i < found; ++i) {
      const float us = median_us([&] {
        CHECK_BLAS(cublasLtMatmul(lt, op, &one, W, la, h, lb, &one, C, lc, C, lc, &res[i].algo, ws,
                                  res[i].workspaceSize, stream));
      }, stream);
      int tile = -1, stages = -1, splitk = -1;
      size_t written = 0;
      cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &written);
      cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages),
                                           &written);
      cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk),
                                           &written);
      uint32_t reduction = 0;
      cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &reduction,
                                           sizeof(reduction), &written);
      std::printf("  lt/heuristic[%2d]   %7.2f us  (tile %d, stages %d, split-k %d, reduction %u, workspace %zu)\n", i,
                  us, tile, stages, splitk, reduction, res[i].workspaceSize);
      char label[32];
      std::snprintf(label, sizeof(label), "lt/heuristic[%d]", i);
      host_cost(label, [&] {
        CHECK_BLAS(cublasLtMatmul(lt, op, &one, W, la, h, lb, &one, C, lc, C, lc, &res[i].algo, ws,
                                  res[i].workspaceSize, stream));
      }, C, m * n, stream);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(op);
    CHECK(cudaFree(W));
    CHECK(cudaFree(h));
    CHECK(cudaFree(C));
  }
  CHECK(cudaFree(ws));
  cublasLtDestroy(lt);
  cublasDestroy(handle);
  return 0;
}
