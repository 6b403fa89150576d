// Thread-block cluster helpers (sm_90) shared by the kernels that use distributed shared
// memory: the ConvRNN cluster forward (convrnn.cu) and the LSTM split backward's clustered
// instances (lstm_persistent.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace seqkernels {
namespace cuda {

// The shared::cta address of a shared-memory pointer.
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The address of the same shared-memory location in block `rank` of the cluster.
__device__ __forceinline__ uint32_t cluster_address(uint32_t local, int rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}

}  // namespace cuda
}  // namespace seqkernels
