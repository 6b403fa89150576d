// Thread-block cluster helpers (sm_90) shared by the kernels that use distributed shared
// memory: the ConvRNN cluster forward (convrnn.cu), the LSTM split backward's clustered instances
// (lstm_persistent_backward.cu), the LSTM cluster forward (lstm_persistent_cluster.cu) and the LSTM
// one-cluster forward (lstm_one_cluster.cu).
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

// Every thread of every block of the cluster: shared-memory writes before it are visible to
// the cluster's reads after it. Compiled for an older architecture it traps.
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

// mbarriers for exchanges by st.async between the blocks of a cluster (the ConvRNN's halo, the LSTM
// cluster forward's partial sums): the receiver's mbarrier counts the bytes the senders' st.async
// write into its shared memory, so no cluster barrier (whose release is a GPU-scope MEMBAR) is
// needed.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(bar)), "r"(arrivals) : "memory");
}

// One arrival on bar that also expects `bytes` more to be written into this block by st.async.
__device__ __forceinline__ void mbarrier_arrive_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(bar)), "r"(bytes)
               : "memory");
}

// Waits until the phase of bar with the given parity has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(shared_address(bar)),
      "r"(parity)
      : "memory");
}

// Stores v (or the pair v0, v1) at the cluster shared address `remote` and counts its bytes on
// the mbarrier at the cluster shared address `remote_bar` (same block).
__device__ __forceinline__ void store_async(uint32_t remote, float v, uint32_t remote_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(remote),
               "r"(__float_as_uint(v)), "r"(remote_bar)
               : "memory");
}
__device__ __forceinline__ void store_async(uint32_t remote, double v, uint32_t remote_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];\n" ::"r"(remote),
               "l"(__double_as_longlong(v)), "r"(remote_bar)
               : "memory");
}
__device__ __forceinline__ void store_async(uint32_t remote, float v0, float v1, uint32_t remote_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];\n" ::"r"(remote),
               "f"(v0), "f"(v1), "r"(remote_bar)
               : "memory");
}

}  // namespace cuda
}  // namespace seqkernels
