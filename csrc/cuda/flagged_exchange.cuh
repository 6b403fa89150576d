// The flagged exchange of the persistent loop's cluster and row-split kernels (sm_90): each step a
// block publishes its slice of a row-major matrix (h_t forward, dG_t backward) as raw 16-bit pairs
// or float bits into one of kClusterBuffers buffers in global memory, then a step flag; a consumer
// waits for its producers' flags (or polls the data itself) and re-reads any word still holding
// the poison. Used by lstm_persistent_cluster.cu (forward) and lstm_row_split_backward.cu.
#pragma once

#include <cstdint>

#include "lstm_device.cuh"
#include "lstm_persistent_common.cuh"

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
// Publishes a block's step: a block barrier (every thread's words stored, so that they are mostly
// there when the flag arrives), then thread 0's step flag; the last warp's fence (the release
// pattern of a grid barrier, off the path of the flag: that warp only waits for the next step's
// gather after it) orders the poison before the next step's words. The flag is a hint: readers
// re-read poisoned words.
__device__ __forceinline__ void publish_step_flag(uint32_t* flags, uint32_t value) {
  __syncthreads();
  if (threadIdx.x == 0) st_relaxed_u32(flags + blockIdx.x, value);
  if (threadIdx.x == kThreads - 32) __threadfence();
}

// The row splits' blocks (the forward's row-split kernel, the row-split backward): block 2 p + r
// takes half r of the batch rows, [row0, row0 + nrows) with ceil(B / 2) rows a block (block-uniform;
// at B = 1 block 1 has none, and nothing reads from it).
struct RowHalf {
  int rank, pair, row0, nrows;
};
__device__ __forceinline__ RowHalf row_half(int B) {
  const int rank = static_cast<int>(blockIdx.x) & 1, rows_per_block = (B + 1) / 2, row0 = rank * rows_per_block;
  return RowHalf{rank, static_cast<int>(blockIdx.x) >> 1, row0, min(rows_per_block, B - row0)};
}

// A row split's warp before its gather: lanes 0 .. kCount - 1 wait until the step flags of the rank-r
// blocks of pairs first .. first + kCount - 1 (flag 2 p + rank) reach `step`; then the warp meets.
template <int kCount>
__device__ __forceinline__ void wait_step_flags(const uint32_t* flags, int first, int rank, int lane, unsigned step) {
  if (lane < kCount) {
    const uint32_t* fl = flags + 2 * (first + lane) + rank;
    const long long t0 = clock64();
    while (ld_relaxed_u32(fl) < step) check_spin_timeout(t0, step);
  }
  __syncwarp();
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

// Host: launches `kernel` cooperatively (launch_with_exchange) with the flagged exchange in `buffer`:
// kClusterBuffers buffers of [g.B][g.row_words] 32-bit words, poisoned, then g.nblocks step flags,
// zeroed: the layout the kernels index (their flags after the buffers).
template <class Kernel, class Args>
bool launch_with_flagged_exchange(Kernel kernel, Args& args, u64*& buffer, const at::Tensor& like) {
  const int64_t words = static_cast<int64_t>(kClusterBuffers) * args.g.B * args.g.row_words;
  return launch_with_exchange(kernel, args, buffer, like, (words + args.g.nblocks + 1) / 2,
                              static_cast<size_t>(words) * 4);
}

}  // namespace
}  // namespace persistent
}  // namespace cuda
}  // namespace seqkernels
