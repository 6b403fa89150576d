// The one-cluster forward kernel of the persistent LSTM loop (sm_90, bf16 / fp16, H in {128, 256,
// 512}, B <= 64): each group of 8 batch rows in one thread-block cluster.
//
// Why. The other persistent forward kernels spread a layer over 64-128 SMs and exchange h_t
// through L2 each step: a producer's store, a consumer's polling loads and the slowest of ~100
// producers sit on every step's critical path (2.4-3.3 µs a step at bf16 B = 8 / 16, H = 512 /
// 1024 on an H200, docs/kernels.md). Up to H = 512 all of W_hh (4H x H 16-bit values, 2 MB at
// H = 512) fits the registers of 16 SMs, which one thread-block cluster can hold (16 blocks is
// a non-portable cluster size that Hopper allows). Then h_t never leaves the cluster: each
// block copies its slice into every other block's shared memory (bulk copies), counted in bytes on the
// receiver's mbarrier, and a step waits for one mbarrier phase. No L2 round trip, no flags, no
// exchange buffer in global memory (nothing to allocate or zero before the launch).
//
// Batch groups. Rows of different batch entries never meet in an LSTM, so rows [8 g, 8 g + 8) run
// in cluster g of their own, each holding all of W_hh (read once per cluster from L2): B = 16 costs
// what B = 8 does wherever ceil(B / 8) clusters are resident together (the occupancy API's
// answer, checked before the launch). The clusters never wait for each other. (The first version
// put 16 rows in one cluster as two n8 tiles: twice each warp's MMAs, ldmatrix reads and gate math,
// 4000 against 2500 SM cycles a step at H = 512, slower than the direct kernel; split K over both
// tiles was slower still: H200, docs/benchmarks.md.)
//
// Shape legend: T steps, B = batch_sizes[0] rows, N packed rows, H hidden, G = 4H, CL = H / 32
// blocks per cluster, KS = H / 16 k-steps of mma.m16n8k16, ceil(B / 8) clusters (batch groups) of one
// n8 tile of rows each.
//
// Decomposition. Block r of a cluster owns units [32 r, 32 r + 32); warp w of its 8 owns four of
// them, j0 = 32 r + 4 w, and all four gates of those: a 16-row m16 tile of W_hh whose row m is gate
// m / 4 of unit j0 + m % 4, over the whole K = H, resident in registers as A fragments
// (4 KS registers: 128 at H = 512). The step's product is D[m][n] = sum_k W_hh[row m][k] ·
// h_{t-1}[n][k] with h_{t-1} as the B operand (n = the group's batch row), read from shared memory
// with ldmatrix. A warp needs no other warp's result: its D holds all four gates of its units, so no
// block barrier sits between the product and the gate math. In the D fragment (g = lane / 4,
// t = lane % 4) lanes g < 4 hold gates i and g of unit j0 + g at batch columns 2t, 2t + 1, lanes
// g >= 4 gates f and o of unit j0 + g - 4: one shuffle pair across lane ^ 16 gives each lane all
// four gates of one (unit, batch row), the lower half column 2t, the upper 2t + 1. The gate math
// keeps c in a register for the whole sequence.
//
// Split K (H = 512 by default: split_k_wanted). Every warp reading all of h_{t-1} costs 256 bytes
// of ldmatrix per MMA, 64 KB a step per block at H = 512: ~512 of a ~800-cycle product. So warps w
// and w + 4 hold both tiles of units 8 (w % 4) .. + 7, each over one half of K (the same registers),
// each ldmatrix feeding both tiles; the pair then swaps the partial sums of the tile the other
// finishes through shared memory (one named barrier of the two warps), and each warp goes on as
// above with its tile. At H = 256 the swap costs what the halved reads save.
//
// Exchange. A buffer of h holds CL slices (slice r' from block r') of 8 rows x 32 units as 8x8
// core matrices (slice_index). The gate lanes store h_s into the block's own slice of buffer s % 2
// and into a staging slice (by step parity); after a proxy fence and one block barrier, sender d <
// CL - 1 (lane d / 8 of warp d % 8) copies the staged slice (512 bytes) into slice r of block
// (r + 1 + d) % CL's buffer s % 2 with one bulk copy (cp.async.bulk shared::cta ->
// shared::cluster), complete_tx on that block's mbarrier of the buffer. Each phase of a buffer's
// mbarrier expects (CL - 1) · 512 bytes and one arrival, thread 0's, which re-arms it for step
// s + 2 right after the wait for step s. A producer can only send h_{s+2} into buffer s % 2 after
// every block sent it h_{s+1}, which each block does after its product has read h_s there (and
// after its block barrier, which all its warps pass only after their products: the own slice's
// stores are ordered the same way), so no value is overwritten before it was read; for the same
// reason no complete_tx of step s + 2 can reach a phase before step s's completed, and a staging
// slice is read by all its copies before it is written again two steps later. h0 sits in buffer 1
// before the first step; rows past B stay zero (read by the MMA, never used). The last step sends
// nothing.
//
// Dropped on the way (H100 / H200, docs/benchmarks.md): each lane sending its row's four units with
// 8-byte st.async (the network's cost per transaction: 3.8 µs a step at B = 16, H = 512); the copy
// into the issuing block itself (compute-sanitizer memcheck: "not located in remote CTA"); wgmma
// with A from registers (~37 cycles per dependent wgmma); all senders in warp 0 (its copies issue
// one after another); two n8 tiles of rows in one cluster (above).
//
// Packed sequences (2026-11-29). A group's rows are sorted by length, longest first, so group g runs
// only the steps of its row 8 g's sequence, and in each step a row takes part while b <
// batch_sizes[t]. Rows never meet, so a row outside its sequence only has to keep its state: its
// h, c (forward) and dh, dc (backward) stay as they are, and the h it sends (its last, or h0 before
// its first step in reverse) is read by nobody else's gates. The instances for equal batch sizes
// (kRagged = false) take no step table.
//
// The launch is ceil(B / 8) clusters (each cluster's blocks co-scheduled by the hardware): the
// occupancy API's cluster answer is checked first, so no cluster waits for SMs that cannot come; a
// wait longer than ~10 s traps (lstm_device.cuh's guard). Where not all clusters fit at once (H = 512,
// B > 56 on an H200) two batch groups share each cluster (paired_groups, equal batch sizes), else they
// may run in waves (one_cluster_waves): a cluster only ever waits for the blocks of its own, which the
// hardware starts together.
//
// Paired groups (kGroups = 2, 2026-11-29). Waves run B = 57-64 at twice the loop of B = 56. Two groups
// in one cluster run one step of each in turn, each with its own buffers, staging slices and
// mbarriers (the exchange's argument holds per group), so a group's copies and wait overlap the other
// group's product and gate math: H200, fp16 B = 64, H = 512, T = 256, 4 clusters of two groups against 8
// of one in two waves, ns a step: forward (training) 2535 against 2 x 1471, backward 3428 against
// 2 x 2188. Not the two-n8-tile version above: that one multiplied both groups' rows in one product and
// had nothing to overlap.
#include "lstm_one_cluster.cuh"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cluster.cuh"
#include "kernel_attributes.cuh"
#include "lstm_device.cuh"
#include "lstm_persistent.cuh"
#include "packed_steps.cuh"
#include "seqkernels/lstm_cell.h"

namespace seqkernels {
namespace cuda {

namespace {

constexpr int kThreads = 256;       // 8 warps
constexpr int kUnitsPerBlock = 32;  // 4 per warp: one m16 tile of 4 gates x 4 units
constexpr int kGroupRows = 8;       // batch rows per cluster: one n8 tile
// A block's slice of h (8 rows x 32 units) as 8x8 core matrices of 128 contiguous bytes,
// [unit group u / 8][b][u % 8]: one ldmatrix matrix per core matrix (8 rows x 16 bytes: every bank
// once), no padding to send.
constexpr int kSliceElems = kGroupRows * kUnitsPerBlock;
constexpr int kCoreElems = 64;
__host__ __device__ constexpr int slice_index(int b, int u) { return (u >> 3) * kCoreElems + b * 8 + (u & 7); }
// Blocks per cluster for KS = H / 16 k-steps: one per 32 units.
__host__ __device__ constexpr int cluster_of(int ks) { return ks * 16 / kUnitsPerBlock; }

// The steps of a call: kRagged, a packed sequence's table (packed_steps.cuh); else every step has
// all B rows and nothing is passed.
struct FullSteps {};
template <bool kRagged>
using CallSteps = std::conditional_t<kRagged, SegTable, FullSteps>;

// Step t of the call: its rows and first packed row.
template <bool kRagged>
__device__ __forceinline__ StepInfo call_step(const CallSteps<kRagged>& steps, int t, int B, int& cursor) {
  if constexpr (kRagged) {
    return step_at(&steps, t, cursor);
  } else {
    return {t, B, static_cast<int64_t>(t) * B};
  }
}

// The steps that batch group row0 runs (the longest of its sequences: the rows are sorted by length
// down, so row0's). In reverse they are times Tg - 1 .. 0, the forward's first Tg steps.
template <bool kRagged>
__device__ __forceinline__ int group_steps(const CallSteps<kRagged>& steps, int T, int row0) {
  if constexpr (kRagged) {
    int Tg = 0;
    for (int k = 0; k < steps.count; ++k) {
      if (steps.bs[k] > row0) Tg = steps.tb[k + 1];
    }
    return Tg;
  } else {
    return T;
  }
}

// The batch rows of one item in each of a cluster's groups: row `row` of group gi is batch row
// b[gi] = cluster_row0 + 8 gi + row, live while b[gi] < B (the last cluster's groups may be part-filled
// or empty). Shared by the forward's and the backward's items.
template <int kGroups>
__device__ __forceinline__ void group_batch_rows(int cluster_row0, int row, int B, int (&b)[kGroups],
                                                 bool (&live)[kGroups]) {
#pragma unroll
  for (int gi = 0; gi < kGroups; ++gi) {
    b[gi] = cluster_row0 + gi * kGroupRows + row;
    live[gi] = b[gi] < B;
  }
}

// f(FullSteps{}) where every step of s is full, else f(its step table); false where the table
// cannot hold the packed sequence.
template <class F>
bool with_call_steps(const LstmSizes& s, F&& f) {
  if (all_steps_full(s)) return f(FullSteps{});
  SegTable steps;
  return build_segments(s, steps) && f(steps);
}

template <class scalar_t, bool kRagged>
struct OneClusterArgs {
  int T, B;              // B: all rows (cluster g runs rows [8 g, 8 g + 8))
  bool reverse;
  bool trace;            // SEQKERNELS_LSTM_TRACE: thread 0 of block 0 (group 0) prints cycles per step and phase
  const float* pre;      // [N, G]
  const scalar_t* b_ih;  // [G] or nullptr (no bias)
  const scalar_t* b_hh;  // [G]
  const scalar_t* w_hh;  // [G, H]
  const scalar_t* h0;    // [B, H]
  const scalar_t* c0;    // [B, H]
  scalar_t* y;           // [N, H]
  scalar_t* gates;       // [N, G] (training) activated gates
  scalar_t* cells;       // [N, H] (training) c_t
  scalar_t* h_n;         // [B, H]
  float* c_n;            // [B, H]
  CallSteps<kRagged> steps;
};

// A bulk copy of `bytes` (a multiple of 16) from this block's shared memory into block-cluster
// shared memory (another block's), counted on the mbarrier at remote_bar (in that block).
__device__ __forceinline__ void bulk_copy_to_cluster(uint32_t remote, uint32_t local, uint32_t bytes,
                                                     uint32_t remote_bar) {
  asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   remote),
               "r"(local), "r"(bytes), "r"(remote_bar)
               : "memory");
}

// The bulk copies' addressing in a cluster of `cl` blocks: sender d < cl - 1 (lane d / 8 of warp d % 8)
// copies this block's slice into slice `rank` of block (rank + 1 + d) % cl's buffer (at buf_local in
// every block, slices of slice_bytes), counted on that block's mbarrier (at bar_local).
struct SliceSender {
  bool sends;
  int dest;
  uint32_t slice_remote, bar_remote;
};
__device__ __forceinline__ SliceSender slice_sender(int cl, int rank, int lane, int warp, uint32_t buf_local,
                                                    uint32_t bar_local, uint32_t slice_bytes) {
  const int sender = lane < 2 ? lane * 8 + warp : cl;
  SliceSender out;
  out.sends = sender < cl - 1;
  const int dest = (rank + 1 + (out.sends ? sender : 0)) % cl;
  out.dest = dest;
  out.slice_remote = cluster_address(buf_local + rank * slice_bytes, dest);
  out.bar_remote = cluster_address(bar_local, dest);
  return out;
}

// After the block's stores into its staging slice of parity p: the fence that lets the async proxy
// read them, the block barrier, then each sender's bulk copy (the slice's first copy_bytes) into
// buffer p of its destination.
__device__ __forceinline__ void send_staged(const SliceSender& tx, uint32_t stage_local, int p, uint32_t slice_bytes,
                                            uint32_t buf_bytes, uint32_t copy_bytes) {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  if (tx.sends) {
    bulk_copy_to_cluster(tx.slice_remote + p * buf_bytes, stage_local + p * slice_bytes, copy_bytes,
                         tx.bar_remote + p * 8);
  }
}

// Thread 0 initialises the two mbarriers of an exchange by step parity, arms the phase of the first
// and of the second sending step where there is one (`bytes` each from the other blocks), then
// fences the initialisation for the cluster (the caller's cluster_sync follows).
__device__ __forceinline__ void init_exchange_barriers(uint64_t (&bars)[2], bool first_sends, bool second_sends,
                                                       uint32_t bytes) {
  if (threadIdx.x == 0) {
    mbarrier_init(&bars[0], 1);
    mbarrier_init(&bars[1], 1);
    if (first_sends) mbarrier_arrive_expect(&bars[0], bytes);
    if (second_sends) mbarrier_arrive_expect(&bars[1], bytes);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
}

// The kernels' instances by hidden size: f(std::integral_constant<int, KS>) with KS = H / 16 k-steps,
// or false for any other H.
template <class F>
bool with_hidden_steps(int64_t H, F&& f) {
  switch (H) {
    case 128: return f(std::integral_constant<int, 8>{});
    case 256: return f(std::integral_constant<int, 16>{});
    case 512: return f(std::integral_constant<int, 32>{});
    default: return false;
  }
}

// SEQKERNELS_LSTM_TRACE: the means per step of a one-cluster kernel's PhaseTrace (lstm_device.cuh).
__device__ void report_one_cluster_trace(const PhaseTrace& tr, const char* what, int T, int B, int H, int CL) {
  if (!tr.on) return;
  const double t = T;
  printf("seqkernels trace %s: T=%d B=%d H=%d blocks=%d x %d clusters | ns/step %.0f (%.2f GHz) | cycles/step:"
         " total %.0f = wait %.0f + product %.0f + gates %.0f + barrier and copies %.0f + stores %.0f\n",
         what, T, B, H, CL, static_cast<int>(gridDim.x) / CL, tr.ns_per_step(T), tr.clock_ghz(T),
         (tr.last - tr.begin) / t, tr.acc[0] / t, tr.acc[1] / t, tr.acc[2] / t, tr.acc[3] / t, tr.acc[4] / t);
}

template <class scalar_t, bool kTraining, int KS, bool kSplitK, bool kRagged, int kGroups>
__global__ void __launch_bounds__(kThreads, 1)
    lstm_persistent_forward_one_cluster_kernel(const __grid_constant__ OneClusterArgs<scalar_t, kRagged> a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int H = KS * 16;
  constexpr int CL = H / kUnitsPerBlock;    // blocks per cluster
  constexpr int kTiles = kSplitK ? 2 : 1;   // m16 tiles of a warp
  constexpr int kSteps = KS / kTiles;       // the warp's k-steps (its half of K where split)
  constexpr int kAcc = 4 / kTiles;          // accumulators per tile: independent MMA chains
  constexpr int64_t G = 4 * static_cast<int64_t>(H);
  static_assert(kSteps % 2 == 0 && CL >= 1 && CL <= 16, "one-cluster kernel: H in {128, 256, 512}");
  // kGroups = 2 (paired_groups): the cluster runs two batch groups, one step of each in turn, each with
  // its own buffers and mbarriers, so one group's exchange is in flight while the other computes.
  // Equal batch sizes only (the groups of a packed sequence run different numbers of steps).
  static_assert(kGroups == 1 || (kGroups == 2 && !kRagged), "one-cluster kernel: 1 batch group, or 2 unpacked");
  __shared__ __align__(128) scalar_t hbuf[kGroups][2][CL][kSliceElems];  // h_s in hbuf[g][s % 2]; h0 in [g][1]
  __shared__ __align__(128) scalar_t stage[kGroups][2][kSliceElems];      // the block's h_s, by step parity
  __shared__ __align__(8) uint64_t bars[kGroups][2];                       // one mbarrier per buffer
  // kSplitK: the partial sums a warp pair swaps, [group][pair][the receiver's K half][lane]. One set per
  // group: the last step sends nothing, so no block barrier separates a partner's read of the first
  // group's sums from this warp's write of the second's there (compute-sanitizer racecheck found a
  // shared set racing at that step).
  __shared__ __align__(16) float4 partials[kGroups][kSplitK ? 4 * 2 * 32 : 1];

  // Clusters are CL consecutive blocks: cluster c = blockIdx.x / CL runs batch groups kGroups c ..
  // kGroups c + kGroups - 1, group g rows [8 g, 8 g + 8); a block's rank in its cluster is blockIdx.x % CL.
  const int rank = static_cast<int>(blockIdx.x) % CL;
  const int cluster_row0 = static_cast<int>(blockIdx.x) / CL * kGroups * kGroupRows;
  // A packed sequence (kRagged): the group runs only its longest sequence's steps, and a row takes
  // part in step t while b < batch_sizes[t] (`on`); between its own steps a row keeps its h and c
  // (h0 / c0 before its first step in reverse) and sends that h, which no other row reads.
  const int T = group_steps<kRagged>(a.steps, a.T, cluster_row0), B = a.B;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
  const int upper = lane >> 4;  // 0: gates i, g of unit gq; 1: f, o of unit gq - 4
  const int uq = gq & 3;        // the lane's unit within the warp's four
  // kSplitK: warps w and w + 4 (pair w % 4, K half w / 4) multiply the same two m16 tiles (units
  // 8 (w % 4) .. + 7 of the block) over one half of K each, then swap partial sums so that warp
  // (pair p, half kh) finishes tile kh: its gate math is that of unit quad `quad` = 2 p + kh.
  const int pair = warp & 3, half = warp >> 2;
  const int quad = kSplitK ? 2 * pair + half : warp;  // the warp's four units of the block
  const int j0 = rank * kUnitsPerBlock + quad * 4;
  const int j = j0 + uq;
  constexpr uint32_t kSliceBytes = kSliceElems * sizeof(scalar_t);  // sent whole
  constexpr uint32_t kStepBytes = (CL - 1) * kSliceBytes;  // the other blocks' slices (the own one: stores)

  // The resident A fragments of tile ti (units of quad q_ti): a0/a2 of tile row gq (gate gq / 4),
  // a1/a3 of row gq + 8 (gate 2 + gq / 4), both of unit 4 q_ti + gq % 4; k = 16 (k0 + ks) + 2 tq
  // (+ 8 for a2/a3), k0 the first k-step of the warp's half of K.
  const int k0 = kSplitK ? half * kSteps : 0;
  uint32_t wf[kTiles][kSteps][4];
  {
    const uint32_t* w32 = reinterpret_cast<const uint32_t*>(a.w_hh);
#pragma unroll
    for (int ti = 0; ti < kTiles; ++ti) {
      const int jt = rank * kUnitsPerBlock + (kSplitK ? 2 * pair + ti : warp) * 4 + uq;
      const int64_t r_lo = ((gq >> 2) * static_cast<int64_t>(H) + jt) * H;
      const int64_t r_hi = ((2 + (gq >> 2)) * static_cast<int64_t>(H) + jt) * H;
#pragma unroll
      for (int ks = 0; ks < kSteps; ++ks) {
        const int64_t k = (k0 + ks) * 16 + 2 * tq;
        wf[ti][ks][0] = w32[(r_lo + k) / 2];
        wf[ti][ks][1] = w32[(r_hi + k) / 2];
        wf[ti][ks][2] = w32[(r_lo + k + 8) / 2];
        wf[ti][ks][3] = w32[(r_hi + k + 8) / 2];
      }
    }
  }

  // Each group's rows of h0 into its buffer 1; zeros in its rows past B in both buffers and in the
  // staging slices (rows that are sent but never computed).
  for (int i = threadIdx.x; i < kGroups * 2 * kGroupRows * H; i += kThreads) {
    const int gb = i / (kGroupRows * H), gi = gb >> 1, buf = gb & 1, rem = i - gb * kGroupRows * H, b = rem / H,
              k = rem - b * H, row = cluster_row0 + gi * kGroupRows + b;
    hbuf[gi][buf][k / kUnitsPerBlock][slice_index(b, k % kUnitsPerBlock)] =
        buf == 1 && row < B ? a.h0[static_cast<int64_t>(row) * H + k] : scalar_t(0.0f);
  }
  for (int i = threadIdx.x; i < kGroups * 2 * kSliceElems; i += kThreads) (&stage[0][0][0])[i] = scalar_t(0.0f);
  // The bulk copies (the async proxy) write these buffers after the threads' stores above.
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  // h_s is sent while s + 1 < T.
#pragma unroll
  for (int gi = 0; gi < kGroups; ++gi) init_exchange_barriers(bars[gi], T > 1, T > 2, kStepBytes);
  cluster_sync();  // every block's mbarriers and zeroed rows are in place before anyone sends

  // The lane's items: (unit j, the group's row bl, batch row b[gi] = the group's first row + bl).
  const int bl = 2 * tq + upper;
  float bias[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) bias[q] = bias_sum(a.b_ih, a.b_hh, q * static_cast<int64_t>(H) + j);
  int b[kGroups];
  bool live[kGroups];
  group_batch_rows(cluster_row0, bl, B, b, live);
  float c_st[kGroups];
  scalar_t h_st[kGroups];
#pragma unroll
  for (int gi = 0; gi < kGroups; ++gi) {
    c_st[gi] = live[gi] ? static_cast<float>(a.c0[static_cast<int64_t>(b[gi]) * H + j]) : 0.0f;
    h_st[gi] = kRagged && live[gi] ? a.h0[static_cast<int64_t>(b[gi]) * H + j] : scalar_t(0.0f);
  }

  // Sender d < CL - 1, lane d / 8 of warp d % 8, sends to block (rank + 1 + d) % CL: this block's
  // slice of that block's buffers, and its mbarriers. (Senders 0..CL - 2 all in warp 0, whose
  // instruction issues its lanes' copies one after the other, took 923 against 296 cycles a step
  // from the barrier to the last copy's issue at H = 512 and 0.397 against 0.365-0.368 ms a call at
  // B = 8: H200, docs/benchmarks.md.) Group gi's buffers, staging slices and mbarriers lie at fixed
  // offsets from group 0's, in every block alike.
  constexpr uint32_t kBufBytes = CL * kSliceBytes;
  constexpr uint32_t kGroupBufBytes = 2 * kBufBytes, kGroupStageBytes = 2 * kSliceBytes, kGroupBarBytes = 16;
  const uint32_t h_local = shared_address(&hbuf[0][0][0][0]);
  const uint32_t bar_local = shared_address(&bars[0][0]);
  const uint32_t stage_local = shared_address(&stage[0][0][0]);
  const SliceSender tx = slice_sender(CL, rank, lane, warp, h_local, bar_local, kSliceBytes);
  // ldmatrix: lane l gives row l % 8 of core matrix l / 8 (unit group l / 8 of a slice: the k
  // offsets 0, 8, 16, 24 of a pair of k-steps).
  const uint32_t ld_lane = h_local + ((lane >> 3) * kCoreElems + (lane & 7) * 8) * sizeof(scalar_t);

  int pre_cursor = 0, step_cursor = 0;  // (kRagged) the two walks' runs of the step table
  auto load_pre = [&](int gi, int s, float (&pv)[4]) {
    const StepInfo st = call_step<kRagged>(a.steps, a.reverse ? T - 1 - s : s, B, pre_cursor);
    const bool on = kRagged ? b[gi] < st.bt : live[gi];
    const float* p = a.pre + (st.off + b[gi]) * G + j;
#pragma unroll
    for (int q = 0; q < 4; ++q) pv[q] = on ? p[q * static_cast<int64_t>(H)] : 0.0f;
  };
  float pv[kGroups][4], pv_next[kGroups][4];
#pragma unroll
  for (int gi = 0; gi < kGroups; ++gi) load_pre(gi, 0, pv[gi]);
  // SEQKERNELS_LSTM_TRACE (lstm_device.cuh): phases 0 wait, 1 product, 2 gates, 3 barrier and
  // copies, 4 stores (both groups' summed where there are two).
  PhaseTrace trace;
  trace.start(a.trace);

  for (int s = 0; s < T; ++s) {
    const int rd = (s + 1) & 1;  // h_{s-1}'s buffer (h0's at s = 0)
#pragma unroll
    for (int gi = 0; gi < kGroups; ++gi) {
      if (s > 0) {
        mbarrier_wait_guarded(bar_local + gi * kGroupBarBytes + rd * 8, ((s - 1) >> 1) & 1, static_cast<unsigned>(s));
        if (threadIdx.x == 0 && s + 2 < T) mbarrier_arrive_expect(&bars[gi][rd], kStepBytes);  // h_{s+1}'s phase
      }
      if (s + 1 < T) load_pre(gi, s + 1, pv_next[gi]);
      trace.mark(0);

      // D = W_hh tile · h_{s-1}ᵀ, kAcc chains per tile. Each ldmatrix feeds kTiles · 2 MMAs: split K
      // halves the shared-memory reads of h (256 bytes per MMA unsplit: 64 KB a step per block at
      // H = 512). (wgmma, A from registers and B from shared memory, measured slower: H200, bf16
      // B = 8, H = 512 0.50 against 0.36 ms a call.)
      float acc[kTiles][kAcc][4];
#pragma unroll
      for (int ti = 0; ti < kTiles; ++ti)
#pragma unroll
        for (int c = 0; c < kAcc; ++c)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[ti][c][e] = 0.0f;
      const uint32_t ld_buf = ld_lane + gi * kGroupBufBytes + rd * kBufBytes;
#pragma unroll
      for (int ks = 0; ks < kSteps; ks += 2) {
        uint32_t bf[4];  // b0, b1 of k-step k0 + ks, then of k0 + ks + 1 (unit groups 0-3 of a slice)
        ldmatrix_x4(bf, ld_buf + ((k0 + ks) / 2) * kSliceBytes);
#pragma unroll
        for (int ti = 0; ti < kTiles; ++ti) {
          MmaInst<scalar_t>::run(acc[ti][ks % kAcc], wf[ti][ks], bf[0], bf[1]);
          MmaInst<scalar_t>::run(acc[ti][(ks + 1) % kAcc], wf[ti][ks + 1], bf[2], bf[3]);
        }
      }
      // dsum[ti]: the chains summed.
      float dsum[kTiles][4];
#pragma unroll
      for (int ti = 0; ti < kTiles; ++ti)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          dsum[ti][e] = acc[ti][0][e];
#pragma unroll
          for (int c = 1; c < kAcc; ++c) dsum[ti][e] += acc[ti][c][e];
        }
      if constexpr (kSplitK) {
        // The other tile's partial sums to the partner, then the partner's of this warp's tile (the
        // same fragment positions: lane for lane). The partner overwrites its slot of this group only
        // after the group's block barrier of this step (the next step's sums: there is one, so this step
        // sends), which this warp passes only after its read here.
        // (Selects by value, not pointers: the arrays stay in registers.)
        float o[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) o[e] = half ? dsum[0][e] : dsum[1][e];
        partials[gi][(pair * 2 + (1 - half)) * 32 + lane] = make_float4(o[0], o[1], o[2], o[3]);
        asm volatile("bar.sync %0, 64;" ::"r"(1 + pair) : "memory");  // the pair's two warps
        const float4 p = partials[gi][(pair * 2 + half) * 32 + lane];
        const float q[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) dsum[0][e] = (half ? dsum[1][e] : dsum[0][e]) + q[e];
      }

      trace.mark(1);
      const StepInfo st = call_step<kRagged>(a.steps, a.reverse ? T - 1 - s : s, B, step_cursor);
      const bool on = kRagged ? b[gi] < st.bt : live[gi];
      const float* d = dsum[0];  // this warp's tile (kSplitK: both halves of K)
      // All four gates of (unit j, row bl): the lower lanes keep column 2t, the upper 2t + 1.
      const float r0 = __shfl_xor_sync(0xffffffffu, upper ? d[0] : d[1], 16);
      const float r1 = __shfl_xor_sync(0xffffffffu, upper ? d[2] : d[3], 16);
      const float* pg = pv[gi];
      const LstmGates<float> pre_g{(upper ? r0 : d[0]) + pg[0] + bias[0], (upper ? d[1] : r0) + pg[1] + bias[1],
                                   (upper ? r1 : d[2]) + pg[2] + bias[2], (upper ? d[3] : r1) + pg[3] + bias[3]};
      LstmGates<float> act;
      float c_new, m;
      lstm_cell_forward<CudaMath>(pre_g, c_st[gi], act, c_new, m);
      const scalar_t h = static_cast<scalar_t>(m);
      if (live[gi]) {
        const scalar_t h_sent = on ? h : h_st[gi];
        stage[gi][s & 1][slice_index(bl, quad * 4 + uq)] = h_sent;
        hbuf[gi][s & 1][rank][slice_index(bl, quad * 4 + uq)] = h_sent;  // read after the barrier below
      }
      trace.mark(2);
      if (s + 1 < T) {  // to every block
        SliceSender txg = tx;
        txg.slice_remote += gi * kGroupBufBytes;
        txg.bar_remote += gi * kGroupBarBytes;
        send_staged(txg, stage_local + gi * kGroupStageBytes, s & 1, kSliceBytes, kBufBytes, kSliceBytes);
      }
      trace.mark(3);
      if (on) {
        c_st[gi] = c_new;
        h_st[gi] = h;
        const int64_t row = st.off + b[gi];
        a.y[row * H + j] = h;
        if constexpr (kTraining) {
          scalar_t* gr = a.gates + row * G + j;
          gr[0] = static_cast<scalar_t>(act.i);
          gr[H] = static_cast<scalar_t>(act.f);
          gr[2 * H] = static_cast<scalar_t>(act.g);
          gr[3 * H] = static_cast<scalar_t>(act.o);
          a.cells[row * H + j] = static_cast<scalar_t>(c_new);
        }
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) pv[gi][q] = pv_next[gi][q];
      trace.mark(4);
    }
  }
  report_one_cluster_trace(trace, kTraining ? "forward one-cluster (training)" : "forward one-cluster (inference)", T,
                           B, H, CL);
#pragma unroll
  for (int gi = 0; gi < kGroups; ++gi) {
    if (live[gi]) {
      a.h_n[static_cast<int64_t>(b[gi]) * H + j] = h_st[gi];
      a.c_n[static_cast<int64_t>(b[gi]) * H + j] = c_st[gi];
    }
  }
  cluster_sync();  // no block leaves while another of its cluster may still address its shared memory
#endif
}

// Launches `kernel` on ceil(ceil(B / 8) / groups_per_cluster) clusters of `cluster` blocks with `smem` bytes
// of dynamic shared memory each, or returns false, having launched nothing, where they cannot all be
// resident at once (else the later clusters would run after the first ones finished) unless `waves`
// (one_cluster_waves): then one resident cluster is enough.
template <class Args>
bool launch_groups(void (*kernel)(Args), const Args& args, int cluster, int smem, bool waves,
                   int groups_per_cluster = 1) {
  const void* fn = reinterpret_cast<const void*>(kernel);
  const int groups = (args.B + kGroupRows - 1) / kGroupRows;
  const int clusters = (groups + groups_per_cluster - 1) / groups_per_cluster;
  if (!ptx_at_least(fn, 90) || !allow_large_clusters(fn)) return false;
  if (smem > 0) ensure_dynamic_smem(fn, smem);
  if (max_active_clusters(fn, kThreads, smem, cluster) < (waves ? 1 : clusters)) return false;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(clusters * cluster));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.stream = at::cuda::getCurrentCUDAStream();
  cudaLaunchAttribute attr[1] = {cluster_dimension(cluster)};
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args));
  return true;
}

template <class scalar_t, bool kTraining, int KS, bool kSplitK, bool kRagged, int kGroups = 1>
bool launch(const OneClusterArgs<scalar_t, kRagged>& args, bool waves) {
  return launch_groups(&lstm_persistent_forward_one_cluster_kernel<scalar_t, kTraining, KS, kSplitK, kRagged, kGroups>,
                       args, cluster_of(KS), 0, waves, kGroups);
}

// Whether warp pairs split K: at H = 512, where it was faster (H200, bf16 `infer` CUDA-graph
// replays, split / one warp per tile: B = 8 0.397-0.402 / 0.426-0.428 ms, B = 1 0.385-0.391 /
// 0.395-0.397); not at H = 256 (the partial sums' swap outweighs the halved reads of a shorter
// product: B = 8 0.297-0.306 / 0.288). SEQKERNELS_LSTM_ONE_CLUSTER_SPLIT_K (diagnostic): "0"
// never, "1" at every H.
bool split_k_wanted(const LstmSizes& s) {
  const int mode = diagnostic_mode("SEQKERNELS_LSTM_ONE_CLUSTER_SPLIT_K");
  return mode == 1 || (mode == -1 && s.H == 512);
}

// The launch order of both one-cluster kernels: one group a cluster with all clusters resident at once;
// else two groups a cluster, all resident (`pairs()`: where paired_groups and its instances exist, H = 512
// with split K and equal batch sizes; tried first where paired_groups_first); else, where `waves`, one group
// a cluster in waves. `one(w)` launches one group a cluster, in waves if w.
template <class One, class Pairs>
bool launch_one_or_paired(bool waves, const One& one, const Pairs& pairs) {
  if (paired_groups_first() && pairs()) return true;
  if (one(false)) return true;
  if (pairs()) return true;
  return waves && one(true);
}

template <class scalar_t, bool kTraining, bool kRagged>
bool launch_for_sizes(const LstmSizes& s, const OneClusterArgs<scalar_t, kRagged>& args) {
  const bool split_k = split_k_wanted(s), waves = one_cluster_waves(s), pairs = paired_groups(s);
  return with_hidden_steps(s.H, [&](auto ks_c) {
    constexpr int KS = decltype(ks_c)::value;
    if (!split_k) return launch<scalar_t, kTraining, KS, false, kRagged>(args, waves);
    return launch_one_or_paired(
        waves, [&](bool w) { return launch<scalar_t, kTraining, KS, true, kRagged>(args, w); },
        [&] {
          if constexpr (KS == 32 && !kRagged) {
            return pairs && launch<scalar_t, kTraining, KS, true, kRagged, 2>(args, false);
          }
          return false;
        });
  });
}

// ---------------------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------------------
//
// The same cluster per 8 batch rows, in reverse step order. Iteration i = 0 .. T - 1 runs step
// s = T - 1 - i (time t = reverse ? T - 1 - s : s); block r owns units [32 r, 32 r + 32) and
// thread x the item (unit 32 r + x % 32, the group's row x / 32). Per iteration:
//   dh = grad_y_t + dh_rec, dh_rec = dG_{s+1} · W_hh (grad_h_n at the first iteration), c from
//   cells, c_prev from cells of step s - 1 (c0 at s = 0), the saved gates; lstm_cell_backward gives
//   the four pre-activation gradients dG_s of the item and dc_prev (a register); dG_s goes to
//   global memory (the weight gradients' GEMMs after the loop) and, as 16-bit values, into the
//   block's dG slice for its product. The last iteration's partial sums give grad_h0 = dG_0 · W_hh;
//   grad_c0 is the last dc_prev.
// The product, split by gate rows: block r multiplies only its own dG slice (its 128 gate rows m =
// q H + 32 r + u), partial_r[n][j] = sum over those m of dG[n][m] · W_hh[m][j] for every unit j of H,
// and sends block r' the float partials of r''s 32 units (the group's rows x 32 units: 1 KB at 8 rows,
// 128 bytes at B = 1; a slice's rows are contiguous, and the wait follows the bytes); each block adds
// the CL partials of its items in rank order (deterministic). A operand: W_hhᵀ restricted to the
// block's rows, [j][k] with k = 32 q + u, resident as A fragments (warp w: j tiles w · H / 128 ..,
// 8 k-steps each: 4 KS registers, 128 at H = 512, the forward's count). B operand: the dG slice
// (8 rows x 128 values, 2 KB, 16 core matrices [k / 8][n][k % 8]: dslice_index), by ldmatrix.x4.
// The product needs no other block's data, so it follows the gate math after one block barrier.
// Why partials. Exchanging all of dG instead (each block multiplying every block's slice by its
// units' columns over K = 4H) moves 2 KB per block pair and iteration, and the exchange's wait grew
// with its bytes: ~11 bytes a cycle into each SM at H = 512 (trace, H200: the forward's 7.5 KB in 689
// cycles, that backward's 30 KB in 2787). Partials are half the bytes: 3677 against 4950 cycles a
// step at bf16 B = 8, H = 512, and the backward op 9-18 % faster at every B <= 16, H in {256, 512}
// measured (docs/kernels.md).
// Exchange: the forward's protocol with partial slices: recv[i % 2] holds iteration i's partials (by
// source rank; the own one stored there directly by its warps), each phase of its mbarrier expects
// (CL - 1) sent slices and thread 0's arrival; a block sends iteration i + 2's partials into
// recv[i % 2] only after every block sent it iteration i + 1's, which each block does after its sum
// of iteration i's there (and after its block barrier), so nothing is overwritten before it was
// read. The staged partials (by destination and parity) are read by their copies before they are
// written again two iterations later (the same argument).
// A partial slice (floats) is [n][u ^ 8 (n / 2)]: the senders' fragment stores (rows 2 tq, units gq)
// and the receivers' row reads both hit every bank once.
constexpr int kPartialElems = kGroupRows * kUnitsPerBlock;  // floats a destination block gets
__host__ __device__ constexpr int partial_index(int n, int u) { return n * kUnitsPerBlock + (u ^ ((n >> 1) << 3)); }
constexpr int kGateSliceElems = kGroupRows * 4 * kUnitsPerBlock;  // a block's dG: 8 rows x 4 gates x 32 units
__host__ __device__ constexpr int dslice_index(int n, int k) { return (k >> 3) * kCoreElems + n * 8 + (k & 7); }

template <class scalar_t, bool kRagged>
struct OneClusterBackwardArgs {
  int T, B;  // B: all rows (cluster g runs rows [8 g, 8 g + 8))
  bool reverse;
  bool trace;                 // SEQKERNELS_LSTM_TRACE: thread 0 of block 0 prints cycles per step and phase
  const scalar_t* w_hh;       // [G, H]
  const scalar_t* gates;      // [N, G] saved activated gates
  const scalar_t* cells;      // [N, H] saved c_t
  const scalar_t* y;          // [N, H] h_t
  const scalar_t* grad_y;     // [N, H]
  const scalar_t* h0;         // [B, H]
  const scalar_t* c0;         // [B, H]
  const scalar_t* grad_h_n;   // [B, H]
  const scalar_t* grad_c_n;   // [B, H]
  scalar_t* dG;               // [N, G] out
  scalar_t* hprev;            // [N, H] out: h_{t-1} of every row
  float* grad_h0;             // [B, H] out
  float* grad_c0;             // [B, H] out
  CallSteps<kRagged> steps;
};

template <class scalar_t, int KS, bool kRagged, int kGroups>
__global__ void __launch_bounds__(kThreads, 1)
    lstm_persistent_backward_one_cluster_kernel(const __grid_constant__ OneClusterBackwardArgs<scalar_t, kRagged> a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int H = KS * 16;
  constexpr int CL = H / kUnitsPerBlock;            // blocks per cluster
  constexpr int kTilesPerWarp = H / 16 / 8;         // m16 tiles of units j: 1, 2, 4
  constexpr int kOwnSteps = 4 * kUnitsPerBlock / 16;  // k-steps over the block's 128 gate rows
  constexpr int kAcc = 4 / kTilesPerWarp;           // MMA chains per tile: 4 chains in all
  constexpr int64_t G = 4 * static_cast<int64_t>(H);
  static_assert(CL >= 4 && CL <= 16 && kTilesPerWarp * 8 * 16 == H, "one-cluster backward: H in {128, 256, 512}");
  // kGroups = 2 (paired_groups): two batch groups a cluster, one iteration of each in turn (the forward's).
  static_assert(kGroups == 1 || (kGroups == 2 && !kRagged), "one-cluster backward: 1 batch group, or 2 unpacked");
  // Dynamic shared memory (66 KB at H = 512, one group): each group's receive buffers (iteration i's
  // partials in recv[i % 2][source rank], the own one stored there directly) and staged partials by
  // destination and parity, then the block's dG slice (16-bit, the product's B operand), which the
  // groups share: a group's gate math writes it only after the block barrier that follows the other
  // group's product.
  extern __shared__ __align__(128) unsigned char one_cluster_smem[];
  constexpr int kGroupFloats = 4 * CL * kPartialElems;  // a group's receive and staging buffers
  auto recv_of = [&](int gi) {
    return reinterpret_cast<float(*)[CL][kPartialElems]>(one_cluster_smem + gi * kGroupFloats * sizeof(float));
  };
  auto stage_of = [&](int gi) {
    return reinterpret_cast<float(*)[2][kPartialElems]>(one_cluster_smem +
                                                        (gi * kGroupFloats + 2 * CL * kPartialElems) * sizeof(float));
  };
  auto dslice = reinterpret_cast<scalar_t*>(one_cluster_smem + kGroups * kGroupFloats * sizeof(float));
  __shared__ __align__(8) uint64_t bars[kGroups][2];

  const int rank = static_cast<int>(blockIdx.x) % CL;
  const int cluster_row0 = static_cast<int>(blockIdx.x) / CL * kGroups * kGroupRows;
  // A packed sequence (kRagged): the group runs its longest sequence's steps; a row takes part in
  // step t while b < batch_sizes[t] (`on`), and between its own steps keeps dh and dc (grad_h_n /
  // grad_c_n before its last step, forward direction; grad_h0 / grad_c0 after its first, reverse).
  const int T = group_steps<kRagged>(a.steps, a.T, cluster_row0), B = a.B;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
  constexpr uint32_t kPartialBytes = kPartialElems * sizeof(float);
  constexpr uint32_t kBufBytes = CL * kPartialBytes;
  // Only a group's live rows are sent (a partial slice's rows are contiguous, 128 bytes each): the
  // exchange's wait follows its bytes. (A second group with no rows still sends one row of zeros: no
  // copy of 0 bytes.)
  uint32_t sent_bytes[kGroups], step_bytes[kGroups];
#pragma unroll
  for (int gi = 0; gi < kGroups; ++gi) {
    const int rows = B - cluster_row0 - gi * kGroupRows;
    const int group_rows = rows < 1 ? 1 : rows < kGroupRows ? rows : kGroupRows;
    sent_bytes[gi] = static_cast<uint32_t>(group_rows) * kUnitsPerBlock * sizeof(float);
    step_bytes[gi] = (CL - 1) * sent_bytes[gi];
  }

  // A fragments: tile t of the warp covers units 16 (warp kTilesPerWarp + t) + (gq, gq + 8); k-step
  // f covers the block's gate rows k = 16 f + 2 tq (+ 1, + 8, + 9), k = 32 q + u for row q H + 32 rank
  // + u (u even: k and k + 1 are rows m and m + 1 of one gate).
  uint32_t wf[kTilesPerWarp][kOwnSteps][4];
  {
    auto w_pair = [&](int k, int unit) {  // W_hh[m(k)][unit], W_hh[m(k) + 1][unit]
      const int64_t m = static_cast<int64_t>(k >> 5) * H + rank * kUnitsPerBlock + (k & 31);
      const scalar_t lo = a.w_hh[m * H + unit], hi = a.w_hh[(m + 1) * H + unit];
      return static_cast<uint32_t>(lo.x) | (static_cast<uint32_t>(hi.x) << 16);
    };
#pragma unroll
    for (int t = 0; t < kTilesPerWarp; ++t) {
      const int u_lo = 16 * (warp * kTilesPerWarp + t) + gq, u_hi = u_lo + 8;
#pragma unroll
      for (int f = 0; f < kOwnSteps; ++f) {
        const int k = 16 * f + 2 * tq;
        wf[t][f][0] = w_pair(k, u_lo);
        wf[t][f][1] = w_pair(k, u_hi);
        wf[t][f][2] = w_pair(k + 8, u_lo);
        wf[t][f][3] = w_pair(k + 8, u_hi);
      }
    }
  }
  // The items: unit j (ul of the block), the group's row nl, batch row b[gi].
  const int ul = threadIdx.x & 31, nl = threadIdx.x >> 5;
  const int j = rank * kUnitsPerBlock + ul;
  int b[kGroups];
  bool live[kGroups];
  group_batch_rows(cluster_row0, nl, B, b, live);

  // Zeros everywhere: the dG slice's rows past B are multiplied, never written (with two groups they
  // may hold the other group's rows; a product's column reads only its own row of the slice, and the
  // partials of rows past B are not sent, and summed only into dh_rec of rows that never use it).
  for (int i = threadIdx.x;
       i < kGroups * kGroupFloats + kGateSliceElems * static_cast<int>(sizeof(scalar_t)) / 4; i += kThreads) {
    reinterpret_cast<float*>(one_cluster_smem)[i] = 0.0f;
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  // Every iteration sends.
#pragma unroll
  for (int gi = 0; gi < kGroups; ++gi) init_exchange_barriers(bars[gi], true, T > 1, step_bytes[gi]);
  cluster_sync();

  // Group gi's buffers and mbarriers lie at fixed offsets from group 0's, in every block alike.
  constexpr uint32_t kGroupBytes = kGroupFloats * sizeof(float), kGroupBarBytes = 16;
  const uint32_t recv_local = shared_address(&recv_of(0)[0][0][0]);
  const uint32_t bar_local = shared_address(&bars[0][0]);
  const SliceSender tx = slice_sender(CL, rank, lane, warp, recv_local, bar_local, kPartialBytes);
  const uint32_t tx_stage = shared_address(&stage_of(0)[tx.sends ? tx.dest : 0][0][0]);
  // ldmatrix.x4 of the dG slice: lane l gives row l % 8 of core matrix l / 8 (two k-steps).
  const uint32_t ld_lane = shared_address(dslice) + ((lane >> 3) * kCoreElems + (lane & 7) * 8) * sizeof(scalar_t);

  // The item's inputs of iteration i (step s = T - 1 - i), loaded one iteration ahead.
  int load_cursor = 0, step_cursor = 0;  // (kRagged) the two walks' runs of the step table
  auto load = [&](int gi, int i, BackwardItemInputs& in) {
    if constexpr (kRagged) {
      const int s = T - 1 - i, t = a.reverse ? T - 1 - s : s;
      const StepInfo st = step_at(&a.steps, t, load_cursor);
      if (b[gi] >= st.bt) return;
      load_backward_rows<H>(a, st.off + b[gi], previous_row(&a.steps, a.T, a.reverse, t, b[gi], load_cursor), b[gi],
                            j, in);
    } else {
      load_backward_item<H>(a, T, B, i, b[gi], j, live[gi], in);
    }
  };
  BackwardItemInputs cur[kGroups], next[kGroups];
  float dc_carry[kGroups], dh_rec[kGroups];
#pragma unroll
  for (int gi = 0; gi < kGroups; ++gi) {
    cur[gi] = BackwardItemInputs{};
    next[gi] = BackwardItemInputs{};
    load(gi, 0, cur[gi]);
    const int64_t at = static_cast<int64_t>(b[gi]) * H + j;
    dc_carry[gi] = live[gi] ? static_cast<float>(a.grad_c_n[at]) : 0.0f;
    dh_rec[gi] = live[gi] ? static_cast<float>(a.grad_h_n[at]) : 0.0f;
  }
  // SEQKERNELS_LSTM_TRACE: phases 0 wait, 1 product (and the partials' stores), 2 the partials' sum
  // and the gate math, 3 barrier and copies, 4 stores (both groups' summed where there are two).
  PhaseTrace trace;
  trace.start(a.trace);

  bool on_before = true;  // (kRagged) whether the row took part in the previous iteration's step
  // Iterations 0 .. T - 1 run step T - 1 - i; iteration T only adds partials (grad_h0).
  for (int i = 0; i <= T; ++i) {
#pragma unroll
    for (int gi = 0; gi < kGroups; ++gi) {
      if (i > 0) {
        const int rd = (i - 1) & 1;  // iteration i - 1's partials
        mbarrier_wait_guarded(bar_local + gi * kGroupBarBytes + rd * 8, ((i - 1) >> 1) & 1, static_cast<unsigned>(i));
        if (threadIdx.x == 0 && i + 1 < T) mbarrier_arrive_expect(&bars[gi][rd], step_bytes[gi]);  // iteration i + 1's
        if (i + 1 <= T - 1) load(gi, i + 1, next[gi]);
        trace.mark(0);
        float sum = 0.0f;
#pragma unroll
        for (int src = 0; src < CL; ++src) sum += recv_of(gi)[rd][src][partial_index(nl, ul)];
        if (!kRagged || on_before) dh_rec[gi] = sum;
      } else if (T > 1) {
        load(gi, 1, next[gi]);
      }
      if (i == T) continue;

      // Gate math of step s = T - 1 - i.
      const int s = T - 1 - i;
      const StepInfo st = call_step<kRagged>(a.steps, a.reverse ? T - 1 - s : s, B, step_cursor);
      const bool on = kRagged ? b[gi] < st.bt : live[gi];
      const int64_t row = st.off + b[gi];
      LstmGates<float> dpre{};
      if (on) {
        const LstmGates<float> act{cur[gi].act[0], cur[gi].act[1], cur[gi].act[2], cur[gi].act[3]};
        float dc_prev, m;
        lstm_cell_backward<CudaMath>(act, cur[gi].c, cur[gi].c_prev, cur[gi].dy + dh_rec[gi], dc_carry[gi], dpre,
                                     dc_prev, m);
        dc_carry[gi] = dc_prev;
        const float dq[4] = {dpre.i, dpre.f, dpre.g, dpre.o};
#pragma unroll
        for (int q = 0; q < 4; ++q) dslice[dslice_index(nl, q * kUnitsPerBlock + ul)] = static_cast<scalar_t>(dq[q]);
      }
      trace.mark(2);
      __syncthreads();  // the block's dG slice is whole (the previous product's reads are behind the last barrier)

      // partial = W_hhᵀ (own rows) · dG slice: kAcc chains per tile, each ldmatrix feeding every tile.
      float acc[kTilesPerWarp][kAcc][4] = {};
#pragma unroll
      for (int f = 0; f < kOwnSteps; f += 2) {
        uint32_t bf[4];
        ldmatrix_x4(bf, ld_lane + (f >> 1) * 4 * kCoreElems * sizeof(scalar_t));
#pragma unroll
        for (int t = 0; t < kTilesPerWarp; ++t) {
          MmaInst<scalar_t>::run(acc[t][f % kAcc], wf[t][f], bf[0], bf[1]);
          MmaInst<scalar_t>::run(acc[t][(f + 1) % kAcc], wf[t][f + 1], bf[2], bf[3]);
        }
      }
      // Tile t's units belong to block jt / 2 (its tile jt % 2): staged for it, or the own partial
      // straight into the receive buffer. D fragment: rows gq (elements 0, 1) and gq + 8 (2, 3), batch
      // rows 2 tq and 2 tq + 1.
#pragma unroll
      for (int t = 0; t < kTilesPerWarp; ++t) {
        float d[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          d[e] = acc[t][0][e];
#pragma unroll
          for (int c = 1; c < kAcc; ++c) d[e] += acc[t][c][e];
        }
        const int jt = warp * kTilesPerWarp + t, dest = jt >> 1, u = 16 * (jt & 1) + gq;
        float* out = dest == rank ? recv_of(gi)[i & 1][rank] : stage_of(gi)[dest][i & 1];
        out[partial_index(2 * tq, u)] = d[0];
        out[partial_index(2 * tq + 1, u)] = d[1];
        out[partial_index(2 * tq, u + 8)] = d[2];
        out[partial_index(2 * tq + 1, u + 8)] = d[3];
      }
      trace.mark(1);
      // The staged partials to their blocks (every iteration sends: iteration T adds the last ones).
      SliceSender txg = tx;
      txg.slice_remote += gi * kGroupBytes;
      txg.bar_remote += gi * kGroupBarBytes;
      send_staged(txg, tx_stage + gi * kGroupBytes, i & 1, kPartialBytes, kBufBytes, sent_bytes[gi]);
      trace.mark(3);
      if (on) {
        scalar_t* gr = a.dG + row * G + j;
        gr[0] = static_cast<scalar_t>(dpre.i);
        gr[H] = static_cast<scalar_t>(dpre.f);
        gr[2 * H] = static_cast<scalar_t>(dpre.g);
        gr[3 * H] = static_cast<scalar_t>(dpre.o);
        a.hprev[row * H + j] = static_cast<scalar_t>(cur[gi].h_prev);
      }
      cur[gi] = next[gi];
      if constexpr (kRagged) on_before = on;
      trace.mark(4);
    }
  }
  report_one_cluster_trace(trace, "backward one-cluster", T, B, H, CL);
#pragma unroll
  for (int gi = 0; gi < kGroups; ++gi) {
    if (live[gi]) {
      a.grad_h0[static_cast<int64_t>(b[gi]) * H + j] = dh_rec[gi];
      a.grad_c0[static_cast<int64_t>(b[gi]) * H + j] = dc_carry[gi];
    }
  }
  cluster_sync();  // no block leaves while another of its cluster may still address its shared memory
#endif
}

template <class scalar_t, int KS, bool kRagged, int kGroups = 1>
bool launch_backward(const OneClusterBackwardArgs<scalar_t, kRagged>& args, bool waves) {
  // Dynamic shared memory: per group 2 receive buffers and 2 staging slices per destination (floats);
  // the dG slice.
  constexpr int kSmem = kGroups * 4 * cluster_of(KS) * kPartialElems * static_cast<int>(sizeof(float)) +
                        kGateSliceElems * static_cast<int>(sizeof(scalar_t));
  return launch_groups(&lstm_persistent_backward_one_cluster_kernel<scalar_t, KS, kRagged, kGroups>, args,
                       cluster_of(KS), kSmem, waves, kGroups);
}

}  // namespace

bool one_cluster_forward_fits(const LstmSizes& s, int sm_major) {
  SegTable steps;
  return sm_major >= 9 && s.P == 0 && s.T >= 1 && s.B >= 1 && s.B <= kOneClusterMaxRows &&
         (s.H == 128 || s.H == 256 || s.H == 512) && (all_steps_full(s) || build_segments(s, steps));
}

bool one_cluster_forward_applies(const LstmSizes& s, int sm_major) {
  return switch_on("SEQKERNELS_LSTM_ONE_CLUSTER") && one_cluster_forward_fits(s, sm_major);
}

template <class scalar_t>
bool lstm_one_cluster_forward(const LstmSizes& s, bool reverse, bool training, bool trace, const float* pre,
                              const scalar_t* b_ih, const scalar_t* b_hh, const scalar_t* w_hh, const scalar_t* h0,
                              const scalar_t* c0, scalar_t* y, scalar_t* gates, scalar_t* cells, scalar_t* h_n,
                              float* c_n) {
  static_assert(kHalfType<scalar_t>, "the one-cluster kernel multiplies bf16 / fp16");
  const cudaDeviceProp& prop = *at::cuda::getCurrentDeviceProperties();
  // W_hh's pairs are read as 32-bit words.
  if (!one_cluster_forward_applies(s, prop.major) || reinterpret_cast<uintptr_t>(w_hh) % 4 != 0) return false;
  auto run = [&](auto steps) {
    constexpr bool kRagged = std::is_same_v<decltype(steps), SegTable>;
    const OneClusterArgs<scalar_t, kRagged> args{static_cast<int>(s.T), static_cast<int>(s.B), reverse, trace, pre,
                                                 b_ih, b_hh, w_hh, h0, c0, y, gates, cells, h_n, c_n, steps};
    return training ? launch_for_sizes<scalar_t, true>(s, args) : launch_for_sizes<scalar_t, false>(s, args);
  };
  return with_call_steps(s, run);
}

bool one_cluster_waves(const LstmSizes& s) {
  return switch_on("SEQKERNELS_LSTM_ONE_CLUSTER_WAVES") && s.H == 512 && s.B > kOneClusterWideMaxBatch512 &&
         s.B <= kOneClusterMaxRows;
}

bool paired_groups(const LstmSizes& s) {
  const int mode = diagnostic_mode("SEQKERNELS_LSTM_ONE_CLUSTER_PAIRS");
  return mode != 0 && s.H == 512 && (mode == 1 || s.B > kOneClusterWideMaxBatch512) && s.B <= kOneClusterMaxRows &&
         all_steps_full(s);
}

bool paired_groups_first() { return diagnostic_mode("SEQKERNELS_LSTM_ONE_CLUSTER_PAIRS") == 1; }

bool packed_one_cluster_forward(const LstmSizes& s, int sm_major) {
  return !all_steps_full(s) && one_cluster_wide_sizes(s) && one_cluster_forward_applies(s, sm_major);
}

bool one_cluster_backward_applies(const LstmSizes& s, int sm_major) {
  return switch_on("SEQKERNELS_LSTM_ONE_CLUSTER_BACKWARD") && one_cluster_forward_fits(s, sm_major);
}

bool one_cluster_backward_wide(const LstmSizes& s, int sm_major) {
  return one_cluster_wide_sizes(s) && one_cluster_backward_applies(s, sm_major);
}

template <class scalar_t>
bool lstm_one_cluster_backward(const LstmSizes& s, bool reverse, bool trace, const scalar_t* w_hh,
                               const scalar_t* gates, const scalar_t* cells, const scalar_t* y, const scalar_t* grad_y,
                               const scalar_t* h0, const scalar_t* c0, const scalar_t* grad_h_n,
                               const scalar_t* grad_c_n, scalar_t* dG, scalar_t* hprev, float* grad_h0,
                               float* grad_c0) {
  static_assert(kHalfType<scalar_t>, "the one-cluster kernel multiplies bf16 / fp16");
  const cudaDeviceProp& prop = *at::cuda::getCurrentDeviceProperties();
  if (!one_cluster_backward_applies(s, prop.major)) return false;
  auto run = [&](auto steps) {
    constexpr bool kRagged = std::is_same_v<decltype(steps), SegTable>;
    const OneClusterBackwardArgs<scalar_t, kRagged> args{static_cast<int>(s.T), static_cast<int>(s.B), reverse,
                                                         trace, w_hh, gates, cells, y, grad_y, h0, c0, grad_h_n,
                                                         grad_c_n, dG, hprev, grad_h0, grad_c0, steps};
    const bool waves = one_cluster_waves(s), pairs = paired_groups(s);
    return with_hidden_steps(s.H, [&](auto ks_c) {
      constexpr int KS = decltype(ks_c)::value;
      return launch_one_or_paired(
          waves, [&](bool w) { return launch_backward<scalar_t, KS, kRagged>(args, w); },
          [&] {
            if constexpr (KS == 32 && !kRagged) return pairs && launch_backward<scalar_t, KS, kRagged, 2>(args, false);
            return false;
          });
    });
  };
  return with_call_steps(s, run);
}

template bool lstm_one_cluster_forward<c10::Half>(const LstmSizes&, bool, bool, bool, const float*, const c10::Half*,
                                                  const c10::Half*, const c10::Half*, const c10::Half*,
                                                  const c10::Half*, c10::Half*, c10::Half*, c10::Half*, c10::Half*,
                                                  float*);
template bool lstm_one_cluster_forward<c10::BFloat16>(const LstmSizes&, bool, bool, bool, const float*,
                                                      const c10::BFloat16*, const c10::BFloat16*,
                                                      const c10::BFloat16*, const c10::BFloat16*,
                                                      const c10::BFloat16*, c10::BFloat16*, c10::BFloat16*,
                                                      c10::BFloat16*, c10::BFloat16*, float*);

template bool lstm_one_cluster_backward<c10::Half>(const LstmSizes&, bool, bool, const c10::Half*, const c10::Half*,
                                                   const c10::Half*, const c10::Half*, const c10::Half*,
                                                   const c10::Half*, const c10::Half*, const c10::Half*,
                                                   const c10::Half*, c10::Half*, c10::Half*, float*, float*);
template bool lstm_one_cluster_backward<c10::BFloat16>(const LstmSizes&, bool, bool, const c10::BFloat16*,
                                                       const c10::BFloat16*, const c10::BFloat16*,
                                                       const c10::BFloat16*, const c10::BFloat16*,
                                                       const c10::BFloat16*, const c10::BFloat16*,
                                                       const c10::BFloat16*, const c10::BFloat16*, c10::BFloat16*,
                                                       c10::BFloat16*, float*, float*);

}  // namespace cuda
}  // namespace seqkernels
