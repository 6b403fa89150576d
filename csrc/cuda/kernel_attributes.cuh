// Host-side facts about a kernel that depend only on (device, kernel, dynamic shared memory),
// cached. cudaFuncSetAttribute and the occupancy query otherwise cost host time on every op
// call, a visible share of a small eager LSTM call (whose GPU work starts only once the host
// has launched it). Used by the persistent and fused-step LSTM loops.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <tuple>

namespace seqkernels {
namespace cuda {

// Raises the kernel's dynamic shared-memory limit on the current device to at least `smem`
// bytes. Never lowers it: a launch with more, configured earlier, may still follow.
inline void ensure_dynamic_smem(const void* kernel, int smem) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*>, int> limit;  // (device, kernel) -> bytes set
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  int& set = limit[{device, kernel}];
  if (smem > set) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    set = smem;
  }
}

// compute()'s value for (current device, key...), computed once and kept. Each call site (its
// own lambda type) has its own cache.
template <class Compute, class... Key>
auto cached_per_device(const Compute& compute, const Key&... key) {
  using Value = decltype(compute());
  static std::mutex mu;
  static std::map<std::tuple<int, Key...>, Value> cache;
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  const auto k = std::make_tuple(device, key...);
  const auto it = cache.find(k);
  if (it != cache.end()) return it->second;
  const Value value = compute();
  cache.emplace(k, value);
  return value;
}

// Resident blocks of `threads` threads and `smem` bytes per SM on the current device (the
// occupancy API's answer; call ensure_dynamic_smem first).
inline int max_blocks_per_sm(const void* kernel, int threads, int smem) {
  return cached_per_device(
      [&] {
        int per_sm = 0;
        C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
        return per_sm;
      },
      kernel, threads, smem);
}

// The launch attribute of a 1-D thread-block cluster of `cluster` blocks.
inline cudaLaunchAttribute cluster_dimension(int cluster) {
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned>(cluster);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  return attr;
}

// Lets the kernel launch in clusters of more than 8 blocks (non-portable sizes) on the current
// device; false where the device refuses.
inline bool allow_large_clusters(const void* kernel) {
  return cached_per_device(
      [&] {
        if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) return true;
        (void)cudaGetLastError();
        return false;
      },
      kernel);
}

// Clusters of `cluster` blocks (of `threads` threads and `smem` bytes) that can be resident at
// once on the current device (the occupancy API's answer for clusters; 0 where a cluster of
// that size cannot run; call ensure_dynamic_smem first).
inline int max_active_clusters(const void* kernel, int threads, int smem, int cluster) {
  return cached_per_device(
      [&] {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(static_cast<unsigned>(cluster));
        cfg.blockDim = dim3(static_cast<unsigned>(threads));
        cfg.dynamicSmemBytes = static_cast<size_t>(smem);
        cudaLaunchAttribute attr[1] = {cluster_dimension(cluster)};
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        int clusters = 0;
        if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess) {
          (void)cudaGetLastError();  // e.g. clusters not supported here: none fit
          clusters = 0;
        }
        return clusters;
      },
      kernel, threads, smem, cluster);
}

// Whether the kernel's code on the current device was compiled from PTX of at least `version`
// (e.g. 90: sm_90 instructions such as thread-block clusters are there, not a fallback body).
inline bool ptx_at_least(const void* kernel, int version) {
  return cached_per_device(
      [&] {
        cudaFuncAttributes attr{};
        C10_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
        return attr.ptxVersion >= version;
      },
      kernel, version);
}

}  // namespace cuda
}  // namespace seqkernels
