// The persistent loop's backward kernel at H = 1024 for bf16 / fp16, B <= 16: the forward's row
// split (lstm_persistent_cluster.cu) run in reverse time on dG. lstm_persistent.cu has the loop's
// design, lstm_persistent_common.cuh its shared parts, flagged_exchange.cuh the exchange.
//
// Shape legend: T steps, B batch, H = 1024 hidden, G = 4H gate rows (i, f, g, o), N = T·B rows
// (every step full), 128 blocks = 64 unit groups of 16 units x 2 row halves of RB = ceil(B / 2)
// rows.
//
// Why. At H = 1024 the other persistent backward kernels run 128 blocks of 8 units, which fit no
// thread-block cluster on an H200 (132 SMs): without clusters the split kernel's partial sums
// (B·H per block and step) or the general kernel's gather of all of dG_t (B·4H) cross L2 with
// every block waiting on every other, and the fused loop (one kernel per step, ~8 µs a step at
// B = 16) was the faster loop there. The backward's product is the forward's turned around,
//     dh_rec[n][j] = sum over the 4H gate rows m of dG_t[n][m] · W_hh[m][j],
// so the forward's row split carries over with K = 4H: block r of group c takes batch rows
// [r RB, r RB + RB) for the 16 units j = 16 c .. 16 c + 15, and all of K. It gathers only its own
// rows of dG_{t} (RB x 4H 16-bit values, 64 KB at B = 16), from the rank-r blocks that produce them,
// and nothing crosses between the two halves. Per step the gathered bytes are four times the
// forward's (dG has 4H columns): the price of keeping W_hh on chip without clusters.
//
// The product: W_hhᵀ's 16 rows of the block's units (one m16 tile) are the A operand over K = 4H,
// the gathered rows the n8 B operand (ldmatrix of the row tile). K runs in the exchange's order
// (group c', gate q, unit u: k = 64 c' + 16 q + u for gate row m = q H + 16 c' + u), so that a
// block's published slice of a row (its 16 units' 4 gates) is 128 contiguous bytes. Warp w takes K
// eighth w (512 k, the slices of groups 8 w .. 8 w + 7: 32 k16 steps), its A fragments in registers
// (the 16-bit [16, 4H] slice is 128 KB a block, 128 registers a thread); it gathers only that eighth of the
// rows (lanes 0..7 wait for those 8 groups' step flags unless it polls the data) and multiplies it
// without a block barrier. The 8 warps' partials meet in shared memory and the item thread adds them
// in warp order (deterministic).
//
// Per iteration i = 0 .. T - 1 (step s = T - 1 - i, time t = reverse ? T - 1 - s : s): thread x <
// 16 RB takes the item (unit 16 c + x % 16, block row x / 16): dh = grad_y_t + dh_rec (grad_h_n at the
// first iteration), the saved gates, c_t and c_{t-1} (c0 at s = 0), loaded one iteration ahead;
// lstm_cell_backward gives dG_s of the item and dc_{t-1} (a register). dG_s goes to the exchange as
// 16-bit pairs (two adjacent units' values, swapped between lane pairs by shuffles) and to global
// memory for the whole-sequence GEMMs of lstm.cu (dx, dW_ih, dW_hh, db), hprev gets h_{t-1}.
// Iteration T only multiplies: grad_h0 = dG_0 · W_hh; grad_c0 is the last dc.
// The exchange is the forward cluster kernels' (flagged_exchange.cuh): kClusterBuffers buffers of
// [B][4H] 16-bit values by iteration, poisoned until written, each block poisoning iteration i + 2's
// words of its slice after publishing iteration i's, then its flag i + 1 after a block barrier. A
// block at iteration i has seen iteration i - 1's words of all 64 rank-r blocks, each of which had
// gathered iteration i - 2's buffer (the one poisoned now) before publishing them.
// Limits: bf16 / fp16, H = 1024, B <= 16, equal batch sizes, sm_90 with >= 128 SMs
// (row_split_backward_applies, lstm_persistent.cuh).

#include "flagged_exchange.cuh"
#include "lstm_persistent_common.cuh"

namespace seqkernels {
namespace cuda {
namespace persistent {
namespace {

constexpr int kRowSplitBackwardBlocks = 128;
// Row stride (floats) of the partials [warp][unit][row]: the item threads' reads (unit u, row n: 10 u
// + n) hit distinct banks, and the float2 stores stay 8-byte aligned.
constexpr int kRowSplitBackwardLdr = 10;

// The kernel's compile-time shape and shared-memory layout (scalar_t: bf16 or fp16).
template <class scalar_t>
struct RowSplitBackwardLayout {
  static constexpr int H = static_cast<int>(kRowSplitBackwardHidden), G = 4 * H;
  static constexpr int UB = 16, ROWS = 8;  // units a block, batch rows a block at most (one n8 tile)
  static constexpr int ES = sizeof(scalar_t), LDX = G + 16 / ES;  // row tile stride: 16 mod 128 bytes
  static constexpr int KSTEPS = G / 16 / kWarps;                 // k16 steps a warp: 32
  static constexpr int kRowWords = G * ES / 4;      // 32-bit words of a row of dG
  static constexpr int kGateWords = UB * ES / 4;   // a block's words of one gate in a row: 8 (its slice: 4 of them)
  static constexpr int kVecPerRow = G * ES / 16 / kWarps;  // 16-byte words of a row in a K eighth: 64
  // Shared memory: the row tile [ROWS][LDX], the partials [warp][UB][kRowSplitBackwardLdr].
  static constexpr int kTileBytes = ROWS * LDX * ES;
  static constexpr int kPartialBytes = kWarps * UB * kRowSplitBackwardLdr * 4;
  static_assert(KSTEPS % 2 == 0, "row-split backward: whole k-step pairs");
  static_assert(UB * ROWS <= kThreads, "row-split backward: one item a thread");
};

template <class scalar_t>
__global__ void __launch_bounds__(kThreads, 1)
    lstm_persistent_backward_row_split_kernel(const __grid_constant__ BwdArgs<scalar_t> a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using L = RowSplitBackwardLayout<scalar_t>;
  constexpr int H = L::H, UB = L::UB, LDX = L::LDX, ES = L::ES, KSTEPS = L::KSTEPS;
  constexpr int kRowWords = L::kRowWords, kVecPerRow = L::kVecPerRow, kGateWords = L::kGateWords;
  constexpr int LDR = kRowSplitBackwardLdr;
  constexpr int64_t G = L::G;
  constexpr int kAcc = 4;  // independent MMA chains
  const Geometry& g = a.g;
  extern __shared__ __align__(16) unsigned char smem[];
  scalar_t* const xt = reinterpret_cast<scalar_t*>(smem);            // [ROWS][LDX]: this block's rows of dG
  float* const part = reinterpret_cast<float*>(smem + g.off_part);   // [warp][UB][LDR]
  const int B = g.B, T = g.T;
  const RowHalf half = row_half(B);
  const int rank = half.rank, group = half.pair, row0 = half.row0, nrows = half.nrows;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
  if (nrows <= 0) return;

  // Rows >= nrows of the tile stay zero (finite) for the whole sequence.
  for (int i = threadIdx.x; i < L::kTileBytes / 16; i += kThreads) reinterpret_cast<uint4*>(smem)[i] = uint4{};

  // A fragments of W_hhᵀ, all in registers (128; ptxas: 254 registers, no spills): tile row gq /
  // gq + 8 = unit 16 group + gq / + 8; k-step f of this warp's K eighth covers k = 16 (warp KSTEPS +
  // f) + 2 tq (+ 1, + 8, + 9), in the exchange's order.
  uint32_t afr[KSTEPS][4];
  {
    const int u_lo = group * UB + gq, u_hi = u_lo + 8;
    auto w_pair = [&](int k, int unit) {  // W_hh[m(k)][unit], W_hh[m(k + 1)][unit] (k even: m(k + 1) = m(k) + 1)
      const int src_group = k >> 6, q = (k >> 4) & 3, u = k & 15;
      const int64_t m = static_cast<int64_t>(q) * H + src_group * UB + u;
      return pack2(a.w_hh[m * H + unit], a.w_hh[(m + 1) * H + unit]);
    };
#pragma unroll
    for (int f = 0; f < KSTEPS; ++f) {
      const int k0 = (warp * KSTEPS + f) * 16 + 2 * tq;
      afr[f][0] = w_pair(k0, u_lo);
      afr[f][1] = w_pair(k0, u_hi);
      afr[f][2] = w_pair(k0 + 8, u_lo);
      afr[f][3] = w_pair(k0 + 8, u_hi);
    }
  }

  // The item: unit j = 16 group + u of batch row grow = row0 + n (threads 0 .. 16 nrows - 1).
  const int u = threadIdx.x % UB, n = threadIdx.x / UB;
  const bool active = n < nrows;
  const int j = group * UB + u, grow = row0 + n;
  const bool odd = (u & 1) != 0;
  // The item's inputs of iteration i (step s = T - 1 - i), loaded one iteration ahead.
  auto load = [&](int i, BackwardItemInputs& in) {
    if (active) load_backward_item<H>(a, T, B, i, grow, j, /*live=*/true, in);
  };
  BackwardItemInputs cur{}, next{};
  load(0, cur);
  float dc_carry = active ? static_cast<float>(a.grad_c_n[static_cast<int64_t>(grow) * H + j]) : 0.0f;
  float dh_rec = active ? static_cast<float>(a.grad_h_n[static_cast<int64_t>(grow) * H + j]) : 0.0f;

  // ldmatrix.x4 of two k-steps' B fragments: lane l gives row l % 8 of the n8 tile at k + 8 (l / 8).
  const uint32_t xt_lane = shared_address(xt) + ((lane & 7) * LDX + (lane >> 3) * 8) * ES;
  float* const part_warp = part + warp * (UB * LDR);
  const float* const own = part + u * LDR + n;  // the item's partial in each warp's [UB][LDR] (items only)

  const int64_t buf_words = static_cast<int64_t>(B) * kRowWords;
  uint32_t* const dx = reinterpret_cast<uint32_t*>(a.dbuf);
  uint32_t* const flags = dx + kClusterBuffers * buf_words;
  // The item pair's words in a buffer: gates 0, 1 written by the even unit, 2, 3 by the odd one.
  const int64_t word_at = static_cast<int64_t>(grow) * kRowWords + (group * 4 * UB + (u & ~1)) * ES / 4;
  PhaseTrace trace;
  trace.start(a.trace);
  __syncthreads();  // the tile's zeros before the first gather

  for (int i = 0; i <= T; ++i) {
    if (i > 0) {
      if (i + 1 <= T - 1) load(i + 1, next);
      // 1. This warp's K eighth of this block's rows of iteration i - 1's dG (the slices of the 8
      // groups that produce it, whose rank-r blocks' flags lanes 0..7 wait for unless a.poll_data).
      // Only this warp reads these columns of the tile (its ldmatrix below): a __syncwarp orders them.
      constexpr int kPartGroups = kRowSplitBackwardBlocks / 2 / kWarps;
      if (!a.poll_data) wait_step_flags<kPartGroups>(flags, warp * kPartGroups, rank, lane, static_cast<unsigned>(i));
      // 16-byte words: 64 a row in a K eighth, in two passes of 4 rows (8 a lane in flight).
      constexpr int kPassRows = 4, kVecs = kPassRows * kVecPerRow / 32;
      const uint32_t* src = dx + ((i - 1) % kClusterBuffers) * buf_words + static_cast<int64_t>(row0) * kRowWords;
#pragma unroll 1
      for (int r0 = 0; r0 < nrows; r0 += kPassRows) {
        auto word_of = [&](int e) {  // element e's row (of this block's) and 16-byte word
          const int idx = lane + e * 32;
          return make_int2(r0 + idx / kVecPerRow, warp * kVecPerRow + idx % kVecPerRow);
        };
        gather_row_words<kVecs, kRowWords, LDX>(xt, src, nrows, word_of, static_cast<unsigned>(i));
      }
      __syncwarp();
      trace.mark(0);

      // 2. dh_rec's partials over this warp's K eighth: D[unit][row] = W_hhᵀ[unit][k] · dG[row][k].
      float acc[kAcc][4] = {};
#pragma unroll
      for (int f = 0; f < KSTEPS; f += 2) {
        uint32_t b[4];
        ldmatrix_x4(b, xt_lane + (warp * KSTEPS + f) * 16 * ES);
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) MmaInst<scalar_t>::run(acc[(f + h2) % kAcc], afr[f + h2], b[2 * h2], b[2 * h2 + 1]);
      }
      trace.mark(1);
      // The partials: unit gq / gq + 8, batch rows 2tq / 2tq + 1 (the chains added in a fixed order).
      // The items read the last iteration's before its publish barrier.
      float d[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) d[e] = (acc[0][e] + acc[1][e]) + (acc[2][e] + acc[3][e]);
      *reinterpret_cast<float2*>(part_warp + gq * LDR + 2 * tq) = make_float2(d[0], d[1]);
      *reinterpret_cast<float2*>(part_warp + (gq + 8) * LDR + 2 * tq) = make_float2(d[2], d[3]);
      __syncthreads();
      // The item's dh_rec: the 8 warps' partials, in a fixed pairwise order.
      if (active) {
        float v[kWarps];
#pragma unroll
        for (int w = 0; w < kWarps; ++w) v[w] = own[w * (UB * LDR)];
#pragma unroll
        for (int w = 1; w < kWarps; w *= 2) {
#pragma unroll
          for (int sl = 0; sl + w < kWarps; sl += 2 * w) v[sl] += v[sl + w];
        }
        dh_rec = v[0];
      }
      trace.mark(4);
    } else if (T > 1) {
      load(1, next);
    }
    if (i == T) break;

    // 3. The item's cell backward at step s = T - 1 - i.
    const int s = T - 1 - i;
    const int64_t t = a.reverse ? T - 1 - s : s;
    const int64_t row = t * B + grow;
    float dq[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (active) {
      const LstmGates<float> act{cur.act[0], cur.act[1], cur.act[2], cur.act[3]};
      LstmGates<float> dpre;
      float dc_prev, m;
      lstm_cell_backward<CudaMath>(act, cur.c, cur.c_prev, cur.dy + dh_rec, dc_carry, dpre, dc_prev, m);
      dc_carry = dc_prev;
      dq[0] = dpre.i;
      dq[1] = dpre.f;
      dq[2] = dpre.g;
      dq[3] = dpre.o;
    }
    trace.mark(2);
    // 4. Publish dG_s (flag i + 1) and poison iteration i + 2's words. Lanes u, u ^ 1 hold one row's
    // adjacent units: the even one sends gates 2, 3 and writes the pairs of gates 0, 1, the odd one
    // the other way round (all lanes shuffle: inactive ones send zeros).
    const float o0 = __shfl_xor_sync(0xffffffffu, odd ? dq[0] : dq[2], 1);
    const float o1 = __shfl_xor_sync(0xffffffffu, odd ? dq[1] : dq[3], 1);
    if (active) {
      const int q0 = odd ? 2 : 0;
      const uint32_t w0 = odd ? pack2(static_cast<scalar_t>(o0), static_cast<scalar_t>(dq[2]))
                              : pack2(static_cast<scalar_t>(dq[0]), static_cast<scalar_t>(o0));
      const uint32_t w1 = odd ? pack2(static_cast<scalar_t>(o1), static_cast<scalar_t>(dq[3]))
                              : pack2(static_cast<scalar_t>(dq[1]), static_cast<scalar_t>(o1));
      uint32_t* const pub = dx + (i % kClusterBuffers) * buf_words + word_at + q0 * kGateWords;
      uint32_t* const ahead = dx + ((i + 2) % kClusterBuffers) * buf_words + word_at + q0 * kGateWords;
      st_relaxed_u32(pub, unpoisoned(w0));
      st_relaxed_u32(pub + kGateWords, unpoisoned(w1));
      st_relaxed_u32(ahead, kClusterPoison);
      st_relaxed_u32(ahead + kGateWords, kClusterPoison);
    }
    publish_step_flag(flags, static_cast<uint32_t>(i + 1));
    // The outputs for lstm.cu's whole-sequence GEMMs.
    if (active) {
      scalar_t* gr = a.dG + row * G + j;
      gr[0] = static_cast<scalar_t>(dq[0]);
      gr[H] = static_cast<scalar_t>(dq[1]);
      gr[2 * H] = static_cast<scalar_t>(dq[2]);
      gr[3 * H] = static_cast<scalar_t>(dq[3]);
      a.hprev[row * H + j] = static_cast<scalar_t>(cur.h_prev);
    }
    cur = next;
    trace.mark(3);
  }
  report_trace(trace, "backward row split", g);
  if (active) {
    a.grad_h0[static_cast<int64_t>(grow) * H + j] = dh_rec;
    a.grad_c0[static_cast<int64_t>(grow) * H + j] = dc_carry;
  }
#else
  __trap();
#endif
}

}  // namespace

template <class scalar_t>
bool run_row_split_backward(const LstmSizes& s, const cudaDeviceProp& prop, BwdArgs<scalar_t>& args,
                            const at::Tensor& like) {
  static_assert(kHalfType<scalar_t>, "the row-split backward kernel multiplies bf16 / fp16");
  if (!row_split_backward_applies(s, sizeof(scalar_t), prop.major, prop.multiProcessorCount)) return false;
  using L = RowSplitBackwardLayout<scalar_t>;
  auto kernel = &lstm_persistent_backward_row_split_kernel<scalar_t>;
  const void* fn = reinterpret_cast<const void*>(kernel);
  if (!ptx_at_least(fn, 90)) return false;
  Geometry& g = args.g;
  g = Geometry{};
  g.T = static_cast<int>(s.T);
  g.B = static_cast<int>(s.B);
  g.H = g.Hp = L::H;
  g.U = L::UB;
  g.Kx = L::G;
  g.nblocks = kRowSplitBackwardBlocks;
  g.cl = 1;
  g.nch = 1;
  g.row_words = L::kRowWords;
  g.off_part = static_cast<int>(align16(L::kTileBytes));
  g.smem = g.off_part + L::kPartialBytes;
  if (static_cast<size_t>(g.smem) > prop.sharedMemPerBlockOptin || !co_resident(fn, g, prop)) return false;
  // What a block gathers of dG a step: its ceil(B / 2) rows of 4H values.
  args.poll_data =
      cluster_polls_data(static_cast<int64_t>((s.B + 1) / 2) * L::G * L::ES, kRowSplitBackwardPollDataMaxBytes);
  return launch_with_flagged_exchange(kernel, args, args.dbuf, like);
}

template bool run_row_split_backward<c10::Half>(const LstmSizes&, const cudaDeviceProp&, BwdArgs<c10::Half>&,
                                                const at::Tensor&);
template bool run_row_split_backward<c10::BFloat16>(const LstmSizes&, const cudaDeviceProp&,
                                                    BwdArgs<c10::BFloat16>&, const at::Tensor&);

}  // namespace persistent
}  // namespace cuda
}  // namespace seqkernels
