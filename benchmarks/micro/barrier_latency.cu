// Latency of the per-step synchronisation a persistent recurrent kernel pays (sm_90): a block
// barrier (__syncthreads) against a thread-block-cluster barrier (barrier.cluster arrive.release /
// wait.acquire) for cluster sizes 2, 4 and 8, alone and with each thread first storing one value
// into a neighbouring block's shared memory (distributed shared memory), as the ConvRNN cluster
// kernel does every step. Prints nanoseconds per step (median of 5 launches; 8 independent
// blocks or clusters, as the ConvRNN benchmark's B = 8 sequences).
//
//   nvcc -O3 -arch=sm_90 -o /tmp/barrier_latency benchmarks/micro/barrier_latency.cu && /tmp/barrier_latency
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace cg = cooperative_groups;

#define CHECK(call)                                                                           \
  do {                                                                                        \
    cudaError_t err_ = (call);                                                                \
    if (err_ != cudaSuccess) {                                                                \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(err_));      \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

enum Mode { kBlockBarrier = 0, kClusterBarrier = 1, kClusterBarrierDsmem = 2, kClusterSync = 3 };

__global__ void steps_kernel(int steps, int mode, float* sink) {
  __shared__ float buf[2][1024];
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank(), G = cluster.num_blocks();
  float* neighbour[2] = {cluster.map_shared_rank(buf[0], (rank + 1) % G), cluster.map_shared_rank(buf[1], (rank + 1) % G)};
  buf[0][threadIdx.x] = threadIdx.x;
  buf[1][threadIdx.x] = 0.f;
  cluster.sync();
  float acc = 0.f;
  for (int t = 0; t < steps; ++t) {
    const int cur = t & 1;
    const float v = buf[cur][(threadIdx.x + 1) % blockDim.x] * 0.5f + 1.f;  // a read of the last step
    acc += v;
    if (mode == kBlockBarrier) {
      buf[cur ^ 1][threadIdx.x] = v;
      __syncthreads();
    } else if (mode == kClusterSync) {
      buf[cur ^ 1][threadIdx.x] = v;
      cluster.sync();
    } else {
      if (mode == kClusterBarrierDsmem) {
        neighbour[cur ^ 1][threadIdx.x] = v;
      } else {
        buf[cur ^ 1][threadIdx.x] = v;
      }
      asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
      asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
    }
  }
  cluster.sync();
  if (acc == -1.f) sink[0] = acc;  // keep the loop
}

float run(int G, int mode, int threads, int steps) {
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = G;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(8 * G);
  cfg.blockDim = dim3(threads);
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  float* sink;
  CHECK(cudaMalloc(&sink, 4));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int rep = 0; rep < 6; ++rep) {
    CHECK(cudaEventRecord(a));
    CHECK(cudaLaunchKernelEx(&cfg, steps_kernel, steps, mode, sink));
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float t;
    CHECK(cudaEventElapsedTime(&t, a, b));
    if (rep > 0) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  CHECK(cudaFree(sink));
  return ms[ms.size() / 2] * 1e6f / steps;
}

int main() {
  const int steps = 20000;
  const char* names[] = {"__syncthreads", "cluster arrive/wait", "cluster arrive/wait + DSMEM store",
                         "cg cluster.sync()"};
  std::printf("ns per step, %d steps, 8 blocks/clusters\n", steps);
  for (int threads : {128, 192, 512, 1024}) {
    std::printf("threads %4d: %-36s G=1 %7.1f\n", threads, names[0], run(1, kBlockBarrier, threads, steps));
    for (int mode : {kClusterBarrier, kClusterBarrierDsmem, kClusterSync}) {
      std::printf("threads %4d: %-36s", threads, names[mode]);
      for (int G : {1, 2, 4, 8}) std::printf(" G=%d %7.1f", G, run(G, mode, threads, steps));
      std::printf("\n");
    }
  }
  return 0;
}
