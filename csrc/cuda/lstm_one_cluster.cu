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
// Shape legend: T steps, B batch, H hidden, G = 4H, CL = H / 32 blocks per cluster, KS = H / 16
// k-steps of mma.m16n8k16, ceil(B / 8) clusters (batch groups) of one n8 tile of rows each.
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
// The launch is ceil(B / 8) clusters (each cluster's blocks co-scheduled by the hardware): the
// occupancy API's cluster answer is checked first, so no cluster waits for SMs that cannot come; a
// wait longer than ~10 s traps (lstm_device.cuh's guard).
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

template <class scalar_t>
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

template <class scalar_t, bool kTraining, int KS, bool kSplitK>
__global__ void __launch_bounds__(kThreads, 1)
    lstm_persistent_forward_one_cluster_kernel(const __grid_constant__ OneClusterArgs<scalar_t> a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int H = KS * 16;
  constexpr int CL = H / kUnitsPerBlock;    // blocks per cluster
  constexpr int kTiles = kSplitK ? 2 : 1;   // m16 tiles of a warp
  constexpr int kSteps = KS / kTiles;       // the warp's k-steps (its half of K where split)
  constexpr int kAcc = 4 / kTiles;          // accumulators per tile: independent MMA chains
  constexpr int64_t G = 4 * static_cast<int64_t>(H);
  static_assert(kSteps % 2 == 0 && CL >= 1 && CL <= 16, "one-cluster kernel: H in {128, 256, 512}");
  __shared__ __align__(128) scalar_t hbuf[2][CL][kSliceElems];  // h_s in hbuf[s % 2]; h0 in hbuf[1]
  __shared__ __align__(128) scalar_t stage[2][kSliceElems];      // the block's h_s, by step parity
  __shared__ __align__(8) uint64_t bars[2];                       // one mbarrier per buffer
  // kSplitK: the partial sums a warp pair swaps, [pair][the receiver's K half][lane].
  __shared__ __align__(16) float4 partials[kSplitK ? 4 * 2 * 32 : 1];

  const int T = a.T, B = a.B;
  // Clusters are CL consecutive blocks: cluster g = blockIdx.x / CL runs batch rows [8 g, 8 g + 8),
  // and a block's rank in its cluster is blockIdx.x % CL.
  const int rank = static_cast<int>(blockIdx.x) % CL;
  const int row0 = static_cast<int>(blockIdx.x) / CL * kGroupRows;
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

  // The group's rows of h0 into buffer 1; zeros in its rows past B in both buffers and in the
  // staging slices (rows that are sent but never computed).
  for (int i = threadIdx.x; i < 2 * kGroupRows * H; i += kThreads) {
    const int buf = i / (kGroupRows * H), rem = i - buf * kGroupRows * H, b = rem / H, k = rem - b * H;
    hbuf[buf][k / kUnitsPerBlock][slice_index(b, k % kUnitsPerBlock)] =
        buf == 1 && row0 + b < B ? a.h0[static_cast<int64_t>(row0 + b) * H + k] : scalar_t(0.0f);
  }
  for (int i = threadIdx.x; i < 2 * kSliceElems; i += kThreads) (&stage[0][0])[i] = scalar_t(0.0f);
  // The bulk copies (the async proxy) write these buffers after the threads' stores above.
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  if (threadIdx.x == 0) {
    mbarrier_init(&bars[0], 1);
    mbarrier_init(&bars[1], 1);
    // h_s is sent while s + 1 < T: arm the phases of h_0 and h_1.
    if (T > 1) mbarrier_arrive_expect(&bars[0], kStepBytes);
    if (T > 2) mbarrier_arrive_expect(&bars[1], kStepBytes);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cluster_sync();  // every block's mbarriers and zeroed rows are in place before anyone sends

  // The lane's item: (unit j, the group's row bl, batch row b = row0 + bl).
  const int bl = 2 * tq + upper, b = row0 + bl;
  const bool live = b < B;
  float bias[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) bias[q] = bias_sum(a.b_ih, a.b_hh, q * static_cast<int64_t>(H) + j);
  float c_st = live ? static_cast<float>(a.c0[static_cast<int64_t>(b) * H + j]) : 0.0f;
  scalar_t h_st = scalar_t(0.0f);

  // Sender d < CL - 1, lane d / 8 of warp d % 8, sends to block (rank + 1 + d) % CL: this block's
  // slice of that block's buffers, and its mbarriers. (Senders 0..CL - 2 all in warp 0, whose
  // instruction issues its lanes' copies one after the other, took 923 against 296 cycles a step
  // from the barrier to the last copy's issue at H = 512 and 0.397 against 0.365-0.368 ms a call at
  // B = 8: H200, docs/benchmarks.md.)
  constexpr uint32_t kBufBytes = CL * kSliceBytes;
  const uint32_t h_local = shared_address(&hbuf[0][0][0]);
  const uint32_t bar_local = shared_address(&bars[0]);
  const uint32_t stage_local = shared_address(&stage[0][0]);
  const int sender = lane < 2 ? lane * 8 + warp : CL;
  const bool sends = sender < CL - 1;
  const int dest = (rank + 1 + (sends ? sender : 0)) % CL;
  const uint32_t slice_remote = cluster_address(h_local + rank * kSliceBytes, dest);
  const uint32_t bar_remote = cluster_address(bar_local, dest);
  // ldmatrix: lane l gives row l % 8 of core matrix l / 8 (unit group l / 8 of a slice: the k
  // offsets 0, 8, 16, 24 of a pair of k-steps).
  const uint32_t ld_lane = h_local + ((lane >> 3) * kCoreElems + (lane & 7) * 8) * sizeof(scalar_t);

  auto load_pre = [&](int s, float (&pv)[4]) {
    const int64_t t = a.reverse ? T - 1 - s : s;
    const float* p = a.pre + (t * B + b) * G + j;
#pragma unroll
    for (int q = 0; q < 4; ++q) pv[q] = live ? p[q * static_cast<int64_t>(H)] : 0.0f;
  };
  float pv[4], pv_next[4];
  load_pre(0, pv);
  // SEQKERNELS_LSTM_TRACE (lstm_device.cuh): phases 0 wait, 1 product, 2 gates, 3 barrier and
  // copies, 4 stores.
  PhaseTrace trace;
  trace.start(a.trace);

  for (int s = 0; s < T; ++s) {
    const int rd = (s + 1) & 1;  // h_{s-1}'s buffer (h0's at s = 0)
    if (s > 0) {
      mbarrier_wait_guarded(bar_local + rd * 8, ((s - 1) >> 1) & 1, static_cast<unsigned>(s));
      if (threadIdx.x == 0 && s + 2 < T) mbarrier_arrive_expect(&bars[rd], kStepBytes);  // h_{s+1}'s phase
    }
    if (s + 1 < T) load_pre(s + 1, pv_next);
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
    const uint32_t ld_buf = ld_lane + rd * kBufBytes;
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
      // same fragment positions: lane for lane). The partner overwrites its slot only after the
      // next step's block barrier, which this warp passes only after its read here.
      // (Selects by value, not pointers: the arrays stay in registers.)
      float o[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) o[e] = half ? dsum[0][e] : dsum[1][e];
      partials[(pair * 2 + (1 - half)) * 32 + lane] = make_float4(o[0], o[1], o[2], o[3]);
      asm volatile("bar.sync %0, 64;" ::"r"(1 + pair) : "memory");  // the pair's two warps
      const float4 p = partials[(pair * 2 + half) * 32 + lane];
      const float q[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) dsum[0][e] = (half ? dsum[1][e] : dsum[0][e]) + q[e];
    }

    trace.mark(1);
    const int64_t t = a.reverse ? T - 1 - s : s;
    const float* d = dsum[0];  // this warp's tile (kSplitK: both halves of K)
    // All four gates of (unit j, row bl): the lower lanes keep column 2t, the upper 2t + 1.
    const float r0 = __shfl_xor_sync(0xffffffffu, upper ? d[0] : d[1], 16);
    const float r1 = __shfl_xor_sync(0xffffffffu, upper ? d[2] : d[3], 16);
    const LstmGates<float> pre_g{(upper ? r0 : d[0]) + pv[0] + bias[0], (upper ? d[1] : r0) + pv[1] + bias[1],
                                 (upper ? r1 : d[2]) + pv[2] + bias[2], (upper ? d[3] : r1) + pv[3] + bias[3]};
    LstmGates<float> act;
    float c_new, m;
    lstm_cell_forward<CudaMath>(pre_g, c_st, act, c_new, m);
    const scalar_t h = static_cast<scalar_t>(m);
    if (live) {
      stage[s & 1][slice_index(bl, quad * 4 + uq)] = h;
      hbuf[s & 1][rank][slice_index(bl, quad * 4 + uq)] = h;  // read after the barrier below
    }
    trace.mark(2);
    if (s + 1 < T) {
      // The staged slice to every block (the async proxy reads what the threads wrote).
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      __syncthreads();
      if (sends) {
        bulk_copy_to_cluster(slice_remote + (s & 1) * kBufBytes, stage_local + (s & 1) * kSliceBytes, kSliceBytes,
                             bar_remote + (s & 1) * 8);
      }
    }
    trace.mark(3);
    if (live) {
      c_st = c_new;
      h_st = h;
      const int64_t row = t * B + b;
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
    for (int q = 0; q < 4; ++q) pv[q] = pv_next[q];
    trace.mark(4);
  }
  if (trace.on) {
    const double t = T;
    printf("seqkernels trace forward one-cluster (%s): T=%d B=%d H=%d blocks=%d x %d clusters |"
           " ns/step %.0f (%.2f GHz) | cycles/step: total %.0f = wait %.0f + product %.0f + gates %.0f"
           " + barrier and copies %.0f + stores %.0f\n",
           kTraining ? "training" : "inference", T, B, H, CL, static_cast<int>(gridDim.x) / CL, trace.ns_per_step(T),
           trace.clock_ghz(T), (trace.last - trace.begin) / t, trace.acc[0] / t, trace.acc[1] / t, trace.acc[2] / t,
           trace.acc[3] / t, trace.acc[4] / t);
  }
  if (live) {
    a.h_n[static_cast<int64_t>(b) * H + j] = h_st;
    a.c_n[static_cast<int64_t>(b) * H + j] = c_st;
  }
  cluster_sync();  // no block leaves while another of its cluster may still address its shared memory
#endif
}

template <class scalar_t, bool kTraining, int KS, bool kSplitK>
bool launch(const OneClusterArgs<scalar_t>& args) {
  auto kernel = &lstm_persistent_forward_one_cluster_kernel<scalar_t, kTraining, KS, kSplitK>;
  const void* fn = reinterpret_cast<const void*>(kernel);
  const int cluster = KS * 16 / kUnitsPerBlock;
  const int groups = (args.B + kGroupRows - 1) / kGroupRows;
  // Every group's cluster resident at once (else the later ones would run after the first).
  if (!ptx_at_least(fn, 90) || !allow_large_clusters(fn) || max_active_clusters(fn, kThreads, 0, cluster) < groups) {
    return false;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(groups * cluster));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = at::cuda::getCurrentCUDAStream();
  cudaLaunchAttribute attr[1] = {cluster_dimension(cluster)};
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args));
  return true;
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

template <class scalar_t, bool kTraining>
bool launch_for_sizes(const LstmSizes& s, const OneClusterArgs<scalar_t>& args) {
  const bool split_k = split_k_wanted(s);
  auto with_steps = [&](auto ks_c) {
    constexpr int KS = decltype(ks_c)::value;
    return split_k ? launch<scalar_t, kTraining, KS, true>(args) : launch<scalar_t, kTraining, KS, false>(args);
  };
  switch (s.H) {
    case 128: return with_steps(std::integral_constant<int, 8>{});
    case 256: return with_steps(std::integral_constant<int, 16>{});
    case 512: return with_steps(std::integral_constant<int, 32>{});
    default: return false;
  }
}

}  // namespace

bool one_cluster_forward_fits(const LstmSizes& s, int sm_major) {
  return sm_major >= 9 && s.P == 0 && s.T >= 1 && s.B >= 1 && s.B <= kOneClusterMaxRows &&
         (s.H == 128 || s.H == 256 || s.H == 512) && all_steps_full(s);
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
  const OneClusterArgs<scalar_t> args{static_cast<int>(s.T), static_cast<int>(s.B), reverse, trace, pre, b_ih,
                                      b_hh, w_hh, h0, c0, y, gates, cells, h_n, c_n};
  return training ? launch_for_sizes<scalar_t, true>(s, args) : launch_for_sizes<scalar_t, false>(s, args);
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

}  // namespace cuda
}  // namespace seqkernels
