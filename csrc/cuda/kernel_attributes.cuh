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

// Resident blocks of `threads` threads and `smem` bytes per SM on the current device (the
// occupancy API's answer; call ensure_dynamic_smem first).
inline int max_blocks_per_sm(const void* kernel, int threads, int smem) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int, int>, int> cache;
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(device, kernel, threads, smem);
  const auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  int per_sm = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  cache.emplace(key, per_sm);
  return per_sm;
}

}  // namespace cuda
}  // namespace seqkernels
