// The flagged exchange of the persistent loop's cluster and row-split kernels (sm_90): each step a
// block publishes its slice of a row-major matrix (h_t forward, dG_t backward) as raw 16-bit pairs
// or float bits into one of kClusterBuffers buffers in global memory, then a step flag; a consumer
// waits for its producers' flags (or polls the data itself) and re-reads any word still holding
// the poison. Used by lstm_persistent_cluster.cu (forward) and lstm_row_split_backward.cu.
#pragma once

#include <cstdint>

#include "lstm_device.cuh"

namespace seqkernels {
namespace cuda {
namespace persistent {
namespace {

// Step flags and the exchanged words (raw 16-bit pairs or float bits) (relaxed, at GPU scope:
// never a stale L1 line from the buffer's use four steps earlier).
__device__ __forceinline__ uint4 ld_relaxed_v4(const uint32_t* p) {
  uint4 v;
  asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
__device__ __forceinline__ uint32_t ld_relaxed_u32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_relaxed_u32(uint32_t* p, uint32_t v) {
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void st_relaxed_u32x2(uint32_t* p, uint32_t v0, uint32_t v1) {
  asm volatile("st.relaxed.gpu.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(v0), "r"(v1) : "memory");
}

// The exchange buffers hold this word until a step's values arrive: two
// 16-bit values 0xffff (a negative NaN with every payload bit set, which no conversion of a
// float32 gives: a NaN converts to the positive canonical one) or float bits 0xffffffff (the same
// for float32, whose arithmetic gives the canonical NaN 0x7fffffff; TF32 values have their low
// 13 bits clear).
constexpr uint32_t kClusterPoison = 0xffffffffu;
constexpr int kClusterBuffers = 4;  // exchange buffers, by step % 4
// A published word, never the poison (which would only be such a NaN: then its positive twin).
__device__ __forceinline__ uint32_t unpoisoned(uint32_t w) { return w == kClusterPoison ? 0x7fffffffu : w; }
__device__ __forceinline__ bool poisoned(uint4 v) {
  return v.x == kClusterPoison || v.y == kClusterPoison || v.z == kClusterPoison || v.w == kClusterPoison;
}
// Re-reads the 16 bytes at p until none of their words is the poison (the slow path of the
// cluster forward kernel's gather where a thread has more than 8 words: the data of a producer
// whose step flag arrived first).
__device__ __noinline__ uint4 wait_unpoisoned(const uint32_t* p, unsigned step) {
  const long long t0 = clock64();
  while (true) {
    const uint4 v = ld_relaxed_v4(p);
    if (!poisoned(v)) return v;
    check_spin_timeout(t0, step);
  }
}

// Re-reads a thread's poisoned 16-byte words of the exchanged matrix (bit e of pending: word e, at
// address_of(e)) together, one L2 round trip a round, until none is the poison.
template <int kVecs, int N, class AddressOf>
__device__ __forceinline__ void reread_poisoned(uint4 (&v)[N], unsigned pending, AddressOf address_of, unsigned step) {
  if (pending == 0) return;
  const long long t0 = clock64();
  while (true) {
#pragma unroll
    for (int e = 0; e < kVecs; ++e) {
      if (pending & (1u << e)) v[e] = ld_relaxed_v4(address_of(e));
    }
#pragma unroll
    for (int e = 0; e < kVecs; ++e) {
      if ((pending & (1u << e)) && !poisoned(v[e])) pending &= ~(1u << e);
    }
    if (pending == 0) break;
    check_spin_timeout(t0, step);
  }
}

// The row-split kernels' gather: thread-owned 16-byte words of the exchanged rows (word_of(e): the row among
// the block's and the word in it, e < kVecs; rows >= nrows skipped) loaded from src (the block's
// first row, kRowWords words a row), the poisoned ones re-read together until they arrive, then
// stored into the row tile xt (LDX elements a row).
template <int kVecs, int kRowWords, int LDX, class scalar_t, class WordOf>
__device__ __forceinline__ void gather_row_words(scalar_t* xt, const uint32_t* src, int nrows, const WordOf& word_of,
                                                 unsigned step) {
  uint4 v[kVecs];
  unsigned pending = 0;
#pragma unroll
  for (int e = 0; e < kVecs; ++e) {
    const int2 rw = word_of(e);
    if (rw.x < nrows) {
      v[e] = ld_relaxed_v4(src + rw.x * kRowWords + rw.y * 4);
      if (poisoned(v[e])) pending |= 1u << e;
    }
  }
  reread_poisoned<kVecs>(
      v, pending,
      [&](int e) {
        const int2 rw = word_of(e);
        return src + rw.x * kRowWords + rw.y * 4;
      },
      step);
#pragma unroll
  for (int e = 0; e < kVecs; ++e) {
    const int2 rw = word_of(e);
    if (rw.x < nrows) *reinterpret_cast<uint4*>(xt + rw.x * LDX + rw.y * 8) = v[e];
  }
}

}  // namespace
}  // namespace persistent
}  // namespace cuda
}  // namespace seqkernels
