// The persistent LSTM loop's backward kernels (general and split) and lstm_persistent_backward:
// lstm_persistent.cu has the loop's design (its "Backward" paragraph), lstm_persistent_common.cuh
// its shared parts.

#include "lstm_persistent_common.cuh"

namespace seqkernels {
namespace cuda {
namespace persistent {
namespace {

// ---------------------------------------------------------------------------------------
// Backward kernel
// ---------------------------------------------------------------------------------------
// What a gate item's backward at step st reads, loaded one step ahead: its activated gates,
// c_t and grad_y of the step, and c_{t-1} / h_{t-1} from the step its state came from (t-1
// forward, t+1 reverse; its first n_prev rows are rows [0, n_prev) of step t) or, for rows
// that start at step t, from c0 / h0.
template <class scalar_t>
struct BwdInputs {
  using acc_t = at::opmath_type<scalar_t>;
  acc_t act[4], c, cp, gy;
  scalar_t hp;
};

template <class scalar_t>
__device__ __forceinline__ void load_backward_inputs(const BwdArgs<scalar_t>& a, const SegTable* seg,
                                                     const Item& it, const StepInfo& st, int kseg,
                                                     BwdInputs<scalar_t>& in) {
  using acc_t = at::opmath_type<scalar_t>;
  if (!it.valid || it.n >= st.bt) return;
  const int H = a.g.H;
  const int64_t prev_row = previous_row(seg, a.g.T, a.reverse, st.t, it.n, kseg);
  const int64_t row = st.off + it.n;
  const scalar_t* gr = a.gates + row * 4 * static_cast<int64_t>(H) + it.j;
#pragma unroll
  for (int q = 0; q < 4; ++q) in.act[q] = static_cast<acc_t>(gr[q * static_cast<int64_t>(H)]);
  in.c = static_cast<acc_t>(a.cells[row * H + it.j]);
  in.gy = static_cast<acc_t>(a.grad_y[row * H + it.j]);
  if (prev_row >= 0) {
    in.cp = static_cast<acc_t>(a.cells[prev_row * H + it.j]);
    in.hp = a.y[prev_row * H + it.j];
  } else {
    in.cp = static_cast<acc_t>(a.c0[it.n * H + it.j]);
    in.hp = a.h0[it.n * H + it.j];
  }
}

template <class scalar_t, Path P>
__global__ void __launch_bounds__(kThreads, 1)
    lstm_persistent_backward_kernel(const __grid_constant__ BwdArgs<scalar_t> a) {
  using acc_t = at::opmath_type<scalar_t>;
  using Math = CudaMath;
  constexpr int kCH = gather_batch<P>();
  constexpr int kKP = P == Path::kFma ? 0 : kWarps;  // depth of red: the warps (MMA) or run time (FMA)
  constexpr int sz = sizeof(scalar_t);
  const Geometry& g = a.g;
  extern __shared__ __align__(16) unsigned char smem[];
  scalar_t* xs = reinterpret_cast<scalar_t*>(smem);  // [Bp16][ldx] dG_t (chunk)
  acc_t* red = reinterpret_cast<acc_t*>(smem + g.off_red);
  scalar_t* stage = reinterpret_cast<scalar_t*>(smem + g.off_stage);  // [B][4][U] own slice of dG_t
  scalar_t* ws = reinterpret_cast<scalar_t*>(smem + g.off_w);
  SegTable* seg = reinterpret_cast<SegTable*>(smem + g.off_seg);

  const int H = g.H, U = g.U, B = g.B, T = g.T, Hp = g.Hp;
  const int j0 = blockIdx.x * U;
  const int64_t G4 = 4 * static_cast<int64_t>(H);
  init_shared(smem, g, a.seg, seg, g.off_red);

  // Wres[k][c] = W_hh[gate * H + jj][j0 + c], k = gate * Hp + jj (dG columns in the padded layout).
  const scalar_t* __restrict__ w_hh = a.w_hh;
  auto wf = [&](int k, int c) -> scalar_t {
    const int gate = k / Hp, jj = k - gate * Hp;
    if (c >= U || gate >= 4 || jj >= H || j0 + c >= H) return static_cast<scalar_t>(0.0f);
    return w_hh[static_cast<int64_t>(gate * H + jj) * H + j0 + c];
  };
  Resident<scalar_t, P, true> res;
  res.load(wf, g, ws);

  Item items[kItems];
  acc_t dh_st[kItems], dc_st[kItems];
#pragma unroll
  for (int p = 0; p < kItems; ++p) {
    items[p] = make_item(g, p);
    const Item& it = items[p];
    dh_st[p] = it.valid ? static_cast<acc_t>(a.grad_h_n[it.n * H + it.j]) : acc_t(0);
    dc_st[p] = it.valid ? static_cast<acc_t>(a.grad_c_n[it.n * H + it.j]) : acc_t(0);
  }
  __syncthreads();

  // Inputs of the next step's gate backward, loaded one step ahead.
  BwdInputs<scalar_t> nx[kItems];
  auto prefetch = [&](const StepInfo& st, int kseg) {
#pragma unroll
    for (int p = 0; p < kItems; ++p) load_backward_inputs(a, seg, items[p], st, kseg, nx[p]);
  };
  int k_cur = a.reverse ? 0 : seg->count - 1;
  StepInfo cur = step_at(seg, a.reverse ? 0 : T - 1, k_cur);
  prefetch(cur, k_cur);

  PhaseTrace trace;
  trace.start(a.trace);
  for (int s = 0; s < T; ++s) {
    const int bt = cur.bt;
    const int64_t off = cur.off;
    // 1. Gate backward of the own units: dc and the own slice of dG_t, staged for
    //    publication; dG rows and h_{t-1} are stored after it (off the critical path).
    scalar_t d_r[kItems][4], hp_r[kItems];
#pragma unroll
    for (int p = 0; p < kItems; ++p) {
      const Item& it = items[p];
      if (!it.exists || it.n >= bt) continue;
      scalar_t* st_row = stage + it.n * 4 * U + it.u;
      if (it.valid) {
        const LstmGates<acc_t> act{nx[p].act[0], nx[p].act[1], nx[p].act[2], nx[p].act[3]};
        LstmGates<acc_t> d;
        acc_t dc_prev, m;
        lstm_cell_backward<Math>(act, nx[p].c, nx[p].cp, dh_st[p] + nx[p].gy, dc_st[p], d, dc_prev, m);
        dc_st[p] = dc_prev;
        d_r[p][0] = static_cast<scalar_t>(d.i);
        d_r[p][1] = static_cast<scalar_t>(d.f);
        d_r[p][2] = static_cast<scalar_t>(d.g);
        d_r[p][3] = static_cast<scalar_t>(d.o);
        hp_r[p] = nx[p].hp;
#pragma unroll
        for (int q = 0; q < 4; ++q) st_row[q * U] = d_r[p][q];
      } else {
        st_row[0] = st_row[U] = st_row[2 * U] = st_row[3 * U] = static_cast<scalar_t>(0.0f);
      }
    }
    const int64_t off_cur = off;
    if (s + 1 < T) {
      cur = step_at(seg, a.reverse ? s + 1 : T - 2 - s, k_cur);
      prefetch(cur, k_cur);
    }
    __syncthreads();
    trace.mark(2);

    // 2. Publish the own slice of dG_t (rows [0, bt), columns gate * Hp + [j0, j0 + U)), flag s + 1.
    const unsigned flag = static_cast<unsigned>(s + 1);
    u64* dbuf = a.dbuf + static_cast<int64_t>(s & 1) * B * g.row_words;
    {
      const int gate_words = g.row_words / 4;
      u64* dst = dbuf + blockIdx.x * g.wpb;
      const int per_row = 4 * g.wpb;
      for (int e = threadIdx.x; e < bt * per_row; e += kThreads) {
        const int n = e >> (g.lg_wpb + 2);
        const int gate = (e >> g.lg_wpb) & 3, q = e & (g.wpb - 1);
        const uint32_t payload = reinterpret_cast<const uint32_t*>(stage + (n * 4 + gate) * U)[q];
        ll_store(dst + static_cast<int64_t>(n) * g.row_words + gate * gate_words + q, payload, flag);
      }
    }
#pragma unroll
    for (int p = 0; p < kItems; ++p) {
      const Item& it = items[p];
      if (!it.valid || it.n >= bt) continue;
      const int64_t row = off_cur + it.n;
      a.hprev[row * H + it.j] = hp_r[p];
      scalar_t* gr = a.dG + row * G4 + it.j;
#pragma unroll
      for (int q = 0; q < 4; ++q) gr[q * static_cast<int64_t>(H)] = d_r[p][q];
    }
    trace.mark(3);

    // 3. All of dG_t into the X tile (chunk by chunk) and dh_{t-1}[:, own units] = dG_t · W_hh[:, own].
    for (int ch = 0; ch < g.nch; ++ch) {
      if (ch > 0) {
        __syncthreads();
        trace.mark(1);
      }
      const int col0 = ch * g.CK;
      const int ncol = max(0, min(g.CK, g.Kx - col0));
      if (ncol > 0) {
        ll_gather<kCH>(dbuf + col0 * sz / 4, g.row_words, ncol * sz / 4, bt, flag, smem, g.ldx * sz);
      }
      if (g.nch > 1 && ncol < g.CK) {
        const int w = g.CK - ncol;
        for (int e = threadIdx.x; e < bt * w; e += kThreads) {
          const int r = e / w;
          xs[r * g.ldx + ncol + (e - r * w)] = static_cast<scalar_t>(0.0f);
        }
      }
      __syncthreads();
      trace.mark(0);
      res.gemm(g, xs, ws, ch, bt, red);
    }
    __syncthreads();
    trace.mark(1);

    // 4. dh_{t-1} of rows [0, bt) (rows >= bt keep theirs, as lstm.cu's dhbuf does).
#pragma unroll
    for (int p = 0; p < kItems; ++p) {
      const Item& it = items[p];
      if (it.valid && it.n < bt) dh_st[p] = sum_partials<kKP>(red, g.kp, g.red_stride, it.n * g.NCp + it.u);
    }
  }
  report_trace(trace, "backward", g);

#pragma unroll
  for (int p = 0; p < kItems; ++p) {
    const Item& it = items[p];
    if (it.valid) {
      a.grad_h0[it.n * H + it.j] = dh_st[p];
      a.grad_c0[it.n * H + it.j] = dc_st[p];
    }
  }
}

// ---------------------------------------------------------------------------------------
// Backward kernel, split variant: tensor cores, B <= 16, partial sums of dh exchanged
// ---------------------------------------------------------------------------------------
// Why. The kernel above exchanges dG_t [bt, 4H] and every block reads all of it: four times
// the forward's state, in the input dtype, twice that in the LL format (float32 B = 1,
// H = 1024: 32 KB per block and step). Here each block multiplies its own slice of dG_t
// [bt, 4U] (its items' results, already in shared memory) by its own rows of W_hh [4U, H],
// resident, which gives a partial dh_{t-1} [bt, H] over its 4U gate rows; dh_{t-1}[:, j] is
// the sum of all blocks' partials at column j, which block j / U adds up. A block writes bt·Hp
// partials and reads bt·U·nblocks = bt·Hp of them per step, instead of reading 4·bt·Hp values
// of dG; two partials per LL word (24-bit floats, fp24_pair above; 2026-11-26: fp32 B = 8 / 16,
// H = 1024 training calls 9% shorter on an H200 than with one fp32 value per word).
//
// Exchange layout: pbuf[s & 1][b][n][k / 2] for producing block b, row n and hidden column k,
// so that a producer's C fragments go out as one 8-byte store per row and column pair, 32
// contiguous bytes per four lanes (scattered stores, one per column, were the slowest part of
// a first version: ~5 cycles per word). A consumer reads its U columns of each producer's row,
// U / 4 16-byte loads of two words: lane l takes column quad l % (U / 4) of producer l / (U / 4)
// (+ 32 / (U / 4) per warp, + 8x that per round, at most two rounds), adds its rounds in order,
// and a butterfly of shuffles over the lanes of one column quad adds the warp's producers: a
// fixed order (deterministic results). The eight warps' sums meet in shared memory and the item
// thread adds them in warp order. Two buffers alternate, as in the kernels above: a block writes
// step s only after it has read every block's step s - 1, which they wrote after reading step
// s - 2 from the buffer about to be overwritten.
//
// Product. With A = dG_t's own slice (m16 rows, K = 4U = 16 or 32: one to four k-steps) and
// B = W_hh[own rows][k] for k in the warp's columns (NTW n8 tiles per warp, resident
// fragments: NTW x 4U / kStep x 2 registers), each n-tile is a chain of at most four MMAs whose
// result is published at once. A fragments: m16n8k16 a0 = A[g][2t, 2t+1], a1 = A[g+8][...],
// a2/a3 at k + 8; m16n8k8 a0 = A[g][t], a1 = A[g+8][t], a2/a3 at k + 4 (lstm_device.cuh).
// Limits (else the kernel above): bf16/fp16 or TF32, B <= 16, H <= 8 warps x 16 tiles x 8 = 1024.
//
// Clustered instances (sm_90, lstm_persistent_backward_split_cluster_kernel). At B >= 8 the
// exchange above moves bt·Hp partials per block and step through L2 (fp32 B = 16, H = 512, 128
// blocks: 8 MB written and read per step), and consumers wait on every producer. In clusters of
// CL = 8 or 4 consecutive blocks, each block keeps its partials in shared memory
// ([2][16][ldp] fp32, alternating like the LL buffers), one cluster barrier (arrive.release /
// wait.acquire) makes them visible, and block r of the cluster adds columns
// [r, r + 1) · Hp / CL of its CL blocks' partials through distributed shared memory (rank order:
// deterministic) and publishes them as producer clusterid: CL times fewer words written and read
// through L2 and CL times fewer producers to wait on. The consumer's warp w takes rows w and
// w + 8 from all nprod = nblocks / CL producers at once, so a row's sum stays in one warp.
// Reuse of a partials buffer two steps later is safe: a block passes step s + 1's cluster barrier
// only after every block of its cluster arrived there, i.e. finished reading step s's partials;
// a last cluster barrier keeps every block's shared memory alive until the others are done. The
// launch needs the clusters co-resident as well: cudaOccupancyMaxActiveClusters · CL >= blocks
// (plan), or no clusters (on an H200 128 blocks fit in neither size: H = 1024 runs without).
constexpr int kSplitRows = 4;  // rows whose loads a lane has in flight at once
constexpr int kSplitClusterMinBatch = 4;  // clusters from B = 4 (at B = 1, H = 768 they were 5-12% slower)
constexpr int64_t kSplitMaxBHHalf = 1024;  // bf16 / fp16: faster than the general kernel while B·H <= 1024
constexpr int kSplitMinHiddenTf32 = 512;  // TF32: faster at B = 1 and from H = 512

// Two LL words (16 bytes) if `pred`: two single-copy-atomic 64-bit relaxed stores at GPU scope,
// predicated inside the instruction (no branch).
__device__ __forceinline__ void ll_store2_if(bool pred, u64* p, uint32_t payload0, uint32_t payload1,
                                             uint32_t flag) {
  const u64 v0 = (static_cast<u64>(flag) << 32) | payload0, v1 = (static_cast<u64>(flag) << 32) | payload1;
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %3, 0;\n @p st.relaxed.gpu.global.v2.u64 [%0], {%1, %2};\n}" ::"l"(p),
      "l"(v0), "l"(v1), "r"(static_cast<int>(pred))
      : "memory");
}

// Thread-block clusters (sm_90): the split kernel's clustered instances add the partials of a
// cluster's blocks through distributed shared memory before they go out (the kernel's comment).
// Compiled for an older architecture these trap; the host takes the clustered instance only
// where the kernel's PTX is for sm_90 or later (ptx_at_least, kernel_attributes.cuh). Clusters
// of CL blocks tile the 1-D grid in order: a block's rank in its cluster is blockIdx.x % CL and
// its cluster's index blockIdx.x / CL (cluster_sync: cluster.cuh).

__device__ __forceinline__ float4 ld_cluster4(uint32_t addr) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr));
#endif
  return v;
}

// Two floats to shared memory if `pred`, predicated inside the instruction (no branch).
__device__ __forceinline__ void st_shared2_if(bool pred, uint32_t addr, float v0, float v1) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %3, 0;\n @p st.shared.v2.f32 [%0], {%1, %2};\n}" ::"r"(addr),
               "f"(v0), "f"(v1), "r"(static_cast<int>(pred))
               : "memory");
}

// The split kernel without clusters exchanges its partials as pairs of 24-bit floats per LL word
// (fp32 rounded at a 15-bit mantissa, half-way cases away from zero: relative error <= 2^-16,
// 32 times below TF32's rounding of the product's inputs) and a 16-bit flag, 1 + step mod 65535
// (never 0, the memset's value; a stale word, two steps old, never matches): half the words of
// one fp32 value and a 32-bit flag each. Bits 0-23: the pair's first column, 24-47: the second,
// 48-63: the flag. Packing is two byte permutes (it runs for every tile of every step).
constexpr int kPairFlagShift = 48;
__device__ __forceinline__ unsigned fp24_pair_flag(int step) { return 1u + static_cast<unsigned>(step) % 65535u; }
__device__ __forceinline__ u64 fp24_pair(float first, float second, unsigned flag) {
  const uint32_t a = __float_as_uint(first) + 0x80u, b = __float_as_uint(second) + 0x80u;
  const uint32_t lo = __byte_perm(a, b, 0x5321);     // a bytes 1-3, b byte 1
  const uint32_t hi = __byte_perm(b, flag, 0x5432);  // b bytes 2-3, flag bytes 0-1
  return (static_cast<u64>(hi) << 32) | lo;
}
__device__ __forceinline__ float fp24_first(u64 w) { return __uint_as_float(static_cast<uint32_t>(w << 8)); }
__device__ __forceinline__ float fp24_second(u64 w) {
  return __uint_as_float(static_cast<uint32_t>(w >> 16) & 0xffffff00u);
}

// One LL word if `pred`, predicated inside the instruction (no branch).
__device__ __forceinline__ void ll_store_word_if(bool pred, u64* p, u64 v) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p st.relaxed.gpu.global.u64 [%0], %1;\n}" ::"l"(p),
               "l"(v), "r"(static_cast<int>(pred))
               : "memory");
}

// Clustered instances: a consumer lane has the loads of up to kClusterRounds producers per row
// in flight (producers c = bl + lpb * i; one pass while nprod <= kClusterRounds * 32 / (U / 2)).
constexpr int kClusterRounds = 4;
// Clustered instances: float4 sums a thread adds and publishes per pass (bt * Hp / cl / 4 in all).
constexpr int kClusterSums = 4;

// CL: blocks per cluster (1: the partials of every block go out to L2 as they are).
template <class scalar_t, Path P, int NTW, int CL>
__device__ __forceinline__ void split_backward(const BwdArgs<scalar_t>& a) {
  using acc_t = at::opmath_type<scalar_t>;  // float on this path
  using Math = CudaMath;
  constexpr int kStep = P == Path::kTf32 ? 8 : 16;
  constexpr int kKS = 32 / kStep;  // k-steps of 4U <= 32
  const Geometry& g = a.g;
  extern __shared__ __align__(16) unsigned char smem[];
  scalar_t* atile = reinterpret_cast<scalar_t*>(smem);       // [16][ldx] own slice of dG_t, column gate * U + u
  float* red = reinterpret_cast<float*>(smem + g.off_red);  // [kWarps][16][U] the warps' sums ([16][U] if CL > 1)
  SegTable* seg = reinterpret_cast<SegTable*>(smem + g.off_seg);

  const int H = g.H, U = g.U, B = g.B, T = g.T, Hp = g.Hp;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
  const int j0 = blockIdx.x * U;
  const int64_t G4 = 4 * static_cast<int64_t>(H);
  // Words per producer and buffer: Hp per row (CL > 1: one fp32 value per word) or Hp / 2
  // (without clusters: 24-bit pairs).
  const int64_t row_pw = CL > 1 ? Hp : Hp / 2, pstride = static_cast<int64_t>(B) * row_pw;
  init_shared(smem, g, a.seg, seg, g.off_seg);  // zeroes the A tile and red

  // Clustered: this block's partials [2][16][ldp] in shared memory (shared::cta address), and
  // where each block of the cluster keeps them (shared::cluster addresses).
  uint32_t part = 0, remote[CL];
  if constexpr (CL > 1) {
    part = shared_address(smem + g.off_part);
#pragma unroll
    for (int q = 0; q < CL; ++q) remote[q] = cluster_address(part, q);
  }

  // Resident B fragments: column col = (warp * NTW + nt) * 8 + g of dh, k = gate * U + u.
  uint32_t wb[NTW][kKS][2];
  {
    auto wt = [&](int k, int col) -> scalar_t {
      const int gate = k / U, u = k - gate * U;
      if (gate >= 4 || j0 + u >= H || col >= H) return static_cast<scalar_t>(0.0f);
      return a.w_hh[static_cast<int64_t>(gate * H + j0 + u) * H + col];
    };
#pragma unroll
    for (int nt = 0; nt < NTW; ++nt) {
      const int col = (warp * NTW + nt) * 8 + gq;
#pragma unroll
      for (int f = 0; f < kKS; ++f) {
        const int k0 = f * kStep;
        if constexpr (P == Path::kTf32) {
          wb[nt][f][0] = to_tf32(static_cast<float>(wt(k0 + tq, col)));
          wb[nt][f][1] = to_tf32(static_cast<float>(wt(k0 + tq + 4, col)));
        } else {
          wb[nt][f][0] = pack2(wt(k0 + 2 * tq, col), wt(k0 + 2 * tq + 1, col));
          wb[nt][f][1] = pack2(wt(k0 + 2 * tq + 8, col), wt(k0 + 2 * tq + 9, col));
        }
      }
    }
  }

  const Item it = make_item(g, 0);
  acc_t dh_st = it.valid ? static_cast<acc_t>(a.grad_h_n[it.n * H + it.j]) : acc_t(0);
  acc_t dc_st = it.valid ? static_cast<acc_t>(a.grad_c_n[it.n * H + it.j]) : acc_t(0);
  __syncthreads();

  // Inputs of the next step's gate backward, loaded one step ahead.
  BwdInputs<scalar_t> nx{};
  int k_cur = a.reverse ? 0 : seg->count - 1;
  StepInfo cur = step_at(seg, a.reverse ? 0 : T - 1, k_cur);
  load_backward_inputs(a, seg, it, cur, k_cur, nx);

  // The consumer's lane roles: columns per 16-byte load cpl = 2 (CL > 1) or 4 (24-bit pairs),
  // U / cpl column groups x 32 / (U / cpl) producers per warp and round.
  const int lg_up = g.lg_u - (CL > 1 ? 1 : 2);
  const int kp = lane & ((1 << lg_up) - 1), bl = lane >> lg_up, lpb = 32 >> lg_up;

  PhaseTrace trace;
  trace.start(a.trace);
  for (int s = 0; s < T; ++s) {
    const int bt = cur.bt;
    const int64_t off = cur.off;
    // 1. Gate backward of the own units: dc and the own slice of dG_t into the A tile.
    scalar_t d_r[4], hp_r = static_cast<scalar_t>(0.0f);
    const bool active = it.valid && it.n < bt;
    if (active) {
      const LstmGates<acc_t> act{nx.act[0], nx.act[1], nx.act[2], nx.act[3]};
      LstmGates<acc_t> d;
      acc_t dc_prev, m;
      lstm_cell_backward<Math>(act, nx.c, nx.cp, dh_st + nx.gy, dc_st, d, dc_prev, m);
      dc_st = dc_prev;
      d_r[0] = static_cast<scalar_t>(d.i);
      d_r[1] = static_cast<scalar_t>(d.f);
      d_r[2] = static_cast<scalar_t>(d.g);
      d_r[3] = static_cast<scalar_t>(d.o);
      hp_r = nx.hp;
      scalar_t* ar = atile + it.n * g.ldx + it.u;
#pragma unroll
      for (int q = 0; q < 4; ++q) ar[q * U] = d_r[q];
    }
    if (s + 1 < T) {
      cur = step_at(seg, a.reverse ? s + 1 : T - 2 - s, k_cur);
      load_backward_inputs(a, seg, it, cur, k_cur, nx);
    }
    __syncthreads();
    trace.mark(2);

    // 2. Partial dh_{t-1} of the warp's columns over the own 4U gate rows (rows < bt, columns
    //    < Hp; columns >= H are zeros): published per n-tile with flag s + 1, or (CL > 1) kept
    //    in shared memory for the cluster's sum (2b).
    const unsigned flag = CL > 1 ? static_cast<unsigned>(s + 1) : fp24_pair_flag(s);
    u64* pbuf = a.dbuf + static_cast<int64_t>(s & 1) * B * g.row_words;
    {
      // A fragments of the k-steps over 4U (zeros past 4U: the MMAs below run unconditionally,
      // with zero W fragments there as well).
      uint32_t af[kKS][4];
      const scalar_t* x0 = atile + gq * g.ldx;
      const scalar_t* x1 = x0 + 8 * g.ldx;
#pragma unroll
      for (int f = 0; f < kKS; ++f) {
        const int k = f * kStep;
        const bool in = f < g.kpc;
        if constexpr (P == Path::kTf32) {
          af[f][0] = in ? to_tf32(x0[k + tq]) : 0u;
          af[f][1] = in ? to_tf32(x1[k + tq]) : 0u;
          af[f][2] = in ? to_tf32(x0[k + tq + 4]) : 0u;
          af[f][3] = in ? to_tf32(x1[k + tq + 4]) : 0u;
        } else {
          af[f][0] = in ? *reinterpret_cast<const uint32_t*>(x0 + k + 2 * tq) : 0u;
          af[f][1] = in ? *reinterpret_cast<const uint32_t*>(x1 + k + 2 * tq) : 0u;
          af[f][2] = in ? *reinterpret_cast<const uint32_t*>(x0 + k + 8 + 2 * tq) : 0u;
          af[f][3] = in ? *reinterpret_cast<const uint32_t*>(x1 + k + 8 + 2 * tq) : 0u;
        }
      }
      // The n-tiles in groups of up to 8: every MMA chain of a group first (independent, so
      // they overlap), then its stores, predicated without branches (a branch per tile kept
      // each tile's MMAs, their latency and its store in sequence: measured ~2x slower).
      const bool row0 = gq < bt, row1 = gq + 8 < bt;
      u64* p0 = pbuf + blockIdx.x * pstride + gq * row_pw;
      u64* p1 = p0 + 8 * row_pw;
      const uint32_t q0 = part + static_cast<uint32_t>(((s & 1) * 16 + gq) * g.ldp) * 4u;  // CL > 1: rows gq
      const uint32_t q1 = q0 + static_cast<uint32_t>(8 * g.ldp) * 4u;                     // and gq + 8
      constexpr int kGroup = NTW < 8 ? NTW : 8;
#pragma unroll
      for (int t0 = 0; t0 < NTW; t0 += kGroup) {
        float acc[kGroup][4];
#pragma unroll
        for (int i = 0; i < kGroup; ++i) {
          acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
#pragma unroll
          for (int f = 0; f < kKS; ++f) MmaInst<scalar_t>::run(acc[i], af[f], wb[t0 + i][f][0], wb[t0 + i][f][1]);
        }
#pragma unroll
        for (int i = 0; i < kGroup; ++i) {
          const int col = (warp * NTW + t0 + i) * 8 + 2 * tq;
          const bool in = col < Hp;  // Hp is even: the pair is whole
          if constexpr (CL > 1) {
            st_shared2_if(row0 && in, q0 + col * 4u, acc[i][0], acc[i][1]);
            st_shared2_if(row1 && in, q1 + col * 4u, acc[i][2], acc[i][3]);
          } else {
            ll_store_word_if(row0 && in, p0 + col / 2, fp24_pair(acc[i][0], acc[i][1], flag));
            ll_store_word_if(row1 && in, p1 + col / 2, fp24_pair(acc[i][2], acc[i][3], flag));
          }
        }
      }
    }
    trace.mark(1);
    if constexpr (CL > 1) {
      // 2b. Block r of the cluster adds columns [r, r + 1) * Hp / CL of its CL blocks' partials
      //     (in rank order: deterministic) and publishes them as producer clusterid.
      cluster_sync();
      trace.mark(0);
      const int cw4 = Hp / CL / 4;  // float4 columns of the chunk
      const int c0 = static_cast<int>(blockIdx.x % CL) * cw4 * 4;  // cluster rank
      const int total = bt * cw4;
      u64* pub = pbuf + static_cast<int64_t>(blockIdx.x / CL) * pstride;  // the cluster's index
      const uint32_t base = static_cast<uint32_t>((s & 1) * 16 * g.ldp) * 4u;
      for (int v0 = 0; v0 < total; v0 += kClusterSums * kThreads) {  // one pass at B <= 16, Hp / CL <= 256
        float4 sum[kClusterSums];
        int n_of[kClusterSums], c_of[kClusterSums];
#pragma unroll
        for (int v = 0; v < kClusterSums; ++v) {
          const int idx = v0 + threadIdx.x + v * kThreads;
          n_of[v] = idx / cw4;
          c_of[v] = c0 + (idx - n_of[v] * cw4) * 4;
          sum[v] = make_float4(0.f, 0.f, 0.f, 0.f);
          if (idx < total) {
            const uint32_t at = base + static_cast<uint32_t>(n_of[v] * g.ldp + c_of[v]) * 4u;
#pragma unroll
            for (int q = 0; q < CL; ++q) {
              const float4 x = ld_cluster4(remote[q] + at);
              sum[v].x += x.x;
              sum[v].y += x.y;
              sum[v].z += x.z;
              sum[v].w += x.w;
            }
          }
        }
#pragma unroll
        for (int v = 0; v < kClusterSums; ++v) {
          const bool in = v0 + threadIdx.x + v * kThreads < total;
          u64* w = pub + n_of[v] * Hp + c_of[v];
          ll_store2_if(in, w, __float_as_uint(sum[v].x), __float_as_uint(sum[v].y), flag);
          ll_store2_if(in, w + 2, __float_as_uint(sum[v].z), __float_as_uint(sum[v].w), flag);
        }
      }
    }
    // dG rows and h_{t-1} for the whole-sequence GEMMs, off the critical path.
    if (active) {
      const int64_t row = off + it.n;
      a.hprev[row * H + it.j] = hp_r;
      scalar_t* gr = a.dG + row * G4 + it.j;
#pragma unroll
      for (int q = 0; q < 4; ++q) gr[q * static_cast<int64_t>(H)] = d_r[q];
    }
    trace.mark(3);

    if constexpr (CL > 1) {
      const u64* src0 = pbuf + j0 + 2 * kp;
      // 3. Rows n = warp and warp + 8 of dh_{t-1}[n][j0 + 2kp, +1], each from the nprod cluster
      //    sums c = bl + lpb * i, the loads of kClusterRounds values of i for both rows in flight
      //    at once (one pass up to 32 / 64 clusters at U = 8 / 4); a row's sum stays in its warp.
      float s0[2] = {0.f, 0.f}, s1[2] = {0.f, 0.f};
      for (int i0 = 0; lpb * i0 < g.nprod; i0 += kClusterRounds) {
        u64 lo[2][kClusterRounds], hi[2][kClusterRounds];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
#pragma unroll
          for (int i = 0; i < kClusterRounds; ++i) {
            const int n = warp + 8 * r, c = bl + lpb * (i0 + i);
            lo[r][i] = hi[r][i] = static_cast<u64>(flag) << 32;  // no producer: payload 0
            if (n < bt && c < g.nprod) ll_load(src0 + c * pstride + n * Hp, lo[r][i], hi[r][i]);
          }
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
#pragma unroll
          for (int i = 0; i < kClusterRounds; ++i) {
            if (!ll_valid(lo[r][i], hi[r][i], flag)) {
              const ulonglong2 w = ll_wait(src0 + (bl + lpb * (i0 + i)) * pstride + (warp + 8 * r) * Hp, flag);
              lo[r][i] = w.x;
              hi[r][i] = w.y;
            }
            s0[r] += __uint_as_float(static_cast<uint32_t>(lo[r][i]));
            s1[r] += __uint_as_float(static_cast<uint32_t>(hi[r][i]));
          }
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int n = warp + 8 * r;
        for (int m = 16; m >= (U >> 1); m >>= 1) {  // the lanes of one column pair
          s0[r] += __shfl_xor_sync(0xffffffffu, s0[r], m);
          s1[r] += __shfl_xor_sync(0xffffffffu, s1[r], m);
        }
        if (bl == 0 && n < bt) {
          red[n * U + 2 * kp] = s0[r];
          red[n * U + 2 * kp + 1] = s1[r];
        }
      }
    } else {
      // 3. The warp's share of dh_{t-1}[n][j0 + 4kp, +4): producers b = bl + lpb * (warp + 8 i),
      //    rows n in batches of kSplitRows, every load of a batch in flight at once.
      const u64* src0 = pbuf + (j0 >> 1) + 2 * kp;
      for (int n0 = 0; n0 < bt; n0 += kSplitRows) {
        u64 lo[kSplitRows][2], hi[kSplitRows][2];
#pragma unroll
        for (int r = 0; r < kSplitRows; ++r) {
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int b = bl + lpb * (warp + kWarps * i);
            lo[r][i] = hi[r][i] = static_cast<u64>(flag) << kPairFlagShift;  // no producer: payload 0
            if (n0 + r < bt && b < g.nprod) ll_load(src0 + b * pstride + (n0 + r) * row_pw, lo[r][i], hi[r][i]);
          }
        }
#pragma unroll
        for (int r = 0; r < kSplitRows; ++r) {
          float q[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            if (!ll_valid(lo[r][i], hi[r][i], flag, kPairFlagShift)) {
              const int b = bl + lpb * (warp + kWarps * i);
              const ulonglong2 w = ll_wait(src0 + b * pstride + (n0 + r) * row_pw, flag, kPairFlagShift);
              lo[r][i] = w.x;
              hi[r][i] = w.y;
            }
            q[0] += fp24_first(lo[r][i]);
            q[1] += fp24_second(lo[r][i]);
            q[2] += fp24_first(hi[r][i]);
            q[3] += fp24_second(hi[r][i]);
          }
          if (n0 + r >= bt) continue;  // uniform: no butterflies for rows past bt (B = 1: 3 of 4)
          for (int m = 16; m >= (1 << lg_up); m >>= 1) {  // the lanes of one column group
#pragma unroll
            for (int c = 0; c < 4; ++c) q[c] += __shfl_xor_sync(0xffffffffu, q[c], m);
          }
          if (bl == 0) {
            float* rr = red + (warp * 16 + n0 + r) * U + 4 * kp;
#pragma unroll
            for (int c = 0; c < 4; ++c) rr[c] = q[c];
          }
        }
      }
    }
    __syncthreads();
    trace.mark(0);

    // 4. dh_{t-1} of rows [0, bt) (rows >= bt keep theirs, as lstm.cu's dhbuf does).
    if (active) {
      const float* rr = red + it.n * U + it.u;
      float sum = rr[0];
      if constexpr (CL == 1) {
#pragma unroll
        for (int w = 1; w < kWarps; ++w) sum += rr[w * 16 * U];
      }
      dh_st = sum;
    }
  }
  report_trace(trace, CL > 1 ? "backward (split, clustered)" : "backward (split)", g);
  // Clustered: no block leaves while another may still read its partials.
  if constexpr (CL > 1) cluster_sync();

  if (it.valid) {
    a.grad_h0[it.n * H + it.j] = dh_st;
    a.grad_c0[it.n * H + it.j] = dc_st;
  }
}

template <class scalar_t, Path P, int NTW>
__global__ void __launch_bounds__(kThreads, 1)
    lstm_persistent_backward_split_kernel(const __grid_constant__ BwdArgs<scalar_t> a) {
  split_backward<scalar_t, P, NTW, 1>(a);
}

// Launched with clusters of CL blocks (consecutive blockIdx.x).
template <class scalar_t, Path P, int NTW, int CL>
__global__ void __launch_bounds__(kThreads, 1)
    lstm_persistent_backward_split_cluster_kernel(const __grid_constant__ BwdArgs<scalar_t> a) {
  split_backward<scalar_t, P, NTW, CL>(a);
}

// Geometry of the split backward kernel for U units per block; false beyond its limits
// (B > 16, H > 1024). g.nt is the n8 tiles per warp that cover Hp; the kernel instance is
// split_ntw(g.nt).
// With cl > 1, the clustered instance's geometry: clusters of cl blocks, whose partials meet in
// shared memory (false where cl does not divide the blocks).
template <class scalar_t, Path P>
bool make_split_geometry(const LstmSizes& s, const cudaDeviceProp& prop, int U, int cl, Geometry& g) {
  constexpr int sz = sizeof(scalar_t);
  if (s.B > 16 || s.H > kSplitBackwardMaxHidden) return false;
  base_geometry(s, U, sz, /*backward=*/true, g);
  if (g.nblocks % cl != 0) return false;
  g.cl = cl;
  g.nprod = g.nblocks / cl;
  g.kpc = 4 * U / MmaCfg<P, true>::kStep;  // k-steps over the own 4U gate rows
  g.nt = ceil_div(g.Hp, kWarps * 8);       // n8 tiles per warp over the Hp columns
  // LL words per row n: every producer's Hp partials, one per word (clusters) or two (without).
  g.row_words = cl > 1 ? g.nprod * g.Hp : g.nprod * g.Hp / 2;
  g.ldx = 4 * U + (sz == 2 ? 8 : 4);       // A tile row stride: conflict-free fragment loads
  size_t off = align16(static_cast<size_t>(16) * g.ldx * sz);
  g.off_red = static_cast<int>(off);
  off += static_cast<size_t>(kWarps) * 16 * U * sizeof(float);
  off = align16(off);
  if (cl > 1) {
    // Row stride = 8 mod 32 floats: a warp's 8-byte stores of rows gq = 0..3 (one half-warp)
    // cover 32 distinct banks.
    g.ldp = g.Hp + (8 - g.Hp % 32 + 32) % 32;
    g.off_part = static_cast<int>(off);
    off += 2 * 16 * static_cast<size_t>(g.ldp) * sizeof(float);
    off = align16(off);
  }
  g.off_seg = static_cast<int>(off);
  off += sizeof(SegTable);
  g.smem = static_cast<int>(off);
  return off <= prop.sharedMemPerBlockOptin;
}

// Where the split kernel is faster than the general one (both forced on an H200, T = 256,
// scripts/lstm_backend_grid.py --variants persistent-nosplit, 2026-11-24; docs/kernels.md):
// always at B = 1 (bf16 H = 1024: 2.00 against 2.09 ms per training call; TF32: 2.58 against
// 4.03), and with TF32 from H = 512 (B = 8, H = 1024: 4.75 against 5.98); slower for 16-bit
// types at B = 8 (the partials it writes and reads in fp32 are as many bytes as the 16-bit dG
// the general kernel reads, and its reduction waits on more producers) and for TF32 at H = 256.
// TF32 moves dG in 4-byte words, four times the split kernel's reads.
bool split_is_faster(const LstmSizes& s, bool half) {
  return half ? s.B * s.H <= kSplitMaxBHHalf : (s.B == 1 || s.H >= kSplitMinHiddenTf32);
}

// The compiled n8-tiles-per-warp instance of the split backward kernel that covers nt tiles.
int split_ntw(int nt) { return nt <= 2 ? 2 : nt <= 4 ? 4 : nt <= 8 ? 8 : 16; }

// SEQKERNELS_LSTM_PERSISTENT_SPLIT (diagnostic, like SEQKERNELS_LSTM_PERSISTENT_DIRECT for the
// forward): unset, the split backward kernel where split_is_faster; 0, never; 1, wherever it can
// run (tests reach its code paths at any shape with it).
int split_backward_mode() { return diagnostic_mode("SEQKERNELS_LSTM_PERSISTENT_SPLIT"); }

// Whether the split backward kernel runs in clusters of cl blocks where they fit: on sm_90 and
// later, cl = 8 or 4 (8 first), from B = kSplitClusterMinBatch. SEQKERNELS_LSTM_PERSISTENT_CLUSTER
// (diagnostic, like the two above): 0, never; 4 or 8, that size only, at any B (tests reach
// each instance with it).
bool split_cluster_wanted(const LstmSizes& s, const cudaDeviceProp& prop, int cl) {
  if (prop.major < 9) return false;
  const char* env = std::getenv("SEQKERNELS_LSTM_PERSISTENT_CLUSTER");
  if (env == nullptr || env[0] == '\0') return s.B >= kSplitClusterMinBatch;
  return std::string(env) == std::to_string(cl);
}

template <class scalar_t, Path P>
bool run_backward(const LstmSizes& s, const cudaDeviceProp& prop, BwdArgs<scalar_t>& args, const at::Tensor& like) {
  if constexpr (P == Path::kMma16) {
    // H <= 512: the whole layer in one cluster per 8 batch rows (lstm_one_cluster.cu).
    if (lstm_one_cluster_backward<scalar_t>(s, args.reverse, args.trace != 0, args.w_hh, args.gates, args.cells, args.y,
                                            args.grad_y, args.h0, args.c0, args.grad_h_n, args.grad_c_n, args.dG,
                                            args.hprev, args.grad_h0, args.grad_c0)) {
      return true;
    }
    // H = 1024, B <= 16: the batch rows split over 128 blocks of 16 units (lstm_row_split_backward.cu).
    if (run_row_split_backward(s, prop, args, like)) return true;
  }
  if constexpr (P != Path::kFma) {
    auto try_split = [&](auto ntw_c, auto cl_c) {
      constexpr int NTW = decltype(ntw_c)::value, CL = decltype(cl_c)::value;
      auto split = [] {
        if constexpr (CL > 1) return &lstm_persistent_backward_split_cluster_kernel<scalar_t, P, NTW, CL>;
        else return &lstm_persistent_backward_split_kernel<scalar_t, P, NTW>;
      }();
      if (CL > 1 && !(split_cluster_wanted(s, prop, CL) && ptx_at_least(reinterpret_cast<const void*>(split), 90))) {
        return false;
      }
      auto make = [&](int U, Geometry& g) {
        return make_split_geometry<scalar_t, P>(s, prop, U, CL, g) && split_ntw(g.nt) == NTW;
      };
      return plan(s, prop, split, args.g, make) && launch_with_exchange(split, args, args.dbuf, like);
    };
    // The instances for 4, 8 and 16 n8 tiles per warp in clusters of cl_c blocks (1: none).
    auto try_ntw_4_to_16 = [&](auto cl_c) {
      return try_split(IntConst<4>{}, cl_c) || try_split(IntConst<8>{}, cl_c) || try_split(IntConst<16>{}, cl_c);
    };
    const int mode = split_backward_mode();
    // In clusters of 8 blocks, else 4, where they fit (instances for 4-16 n8 tiles per warp:
    // H > 128): faster than both kernels without clusters wherever they ran at B >= 4 (H200,
    // docs/kernels.md); else without clusters where split_is_faster.
    if (mode != 0 && (try_ntw_4_to_16(IntConst<8>{}) || try_ntw_4_to_16(IntConst<4>{}))) {
      return true;
    }
    if (mode == 1 || (mode == -1 && split_is_faster(s, P == Path::kMma16))) {
      if (try_split(IntConst<2>{}, IntConst<1>{}) || try_ntw_4_to_16(IntConst<1>{})) {
        return true;
      }
    }
  }
  auto kernel = &lstm_persistent_backward_kernel<scalar_t, P>;
  auto make = [&](int U, Geometry& g) { return make_geometry<scalar_t, P, true>(s, prop, U, g); };
  if (!plan(s, prop, kernel, args.g, make)) return false;
  return launch_with_exchange(kernel, args, args.dbuf, like);
}

}  // namespace
}  // namespace persistent

template <class scalar_t>
bool lstm_persistent_backward(const LstmSizes& s, bool reverse, bool tf32, const scalar_t* w_hh,
                              const scalar_t* gates, const scalar_t* cells, const scalar_t* y,
                              const scalar_t* grad_y, const scalar_t* h0, const scalar_t* c0,
                              const scalar_t* grad_h_n, const scalar_t* grad_c_n, scalar_t* dG, scalar_t* hprev,
                              at::opmath_type<scalar_t>* grad_h0, at::opmath_type<scalar_t>* grad_c0,
                              const at::Tensor& like) {
  using namespace persistent;
  const cudaDeviceProp& prop = *at::cuda::getCurrentDeviceProperties();
  if (!common_preconditions(s, prop)) return false;
  BwdArgs<scalar_t> args{};
  if (!build_segments(s, args.seg)) return false;
  args.trace = trace_requested();
  args.reverse = reverse;
  args.w_hh = w_hh;
  args.gates = gates;
  args.cells = cells;
  args.y = y;
  args.grad_y = grad_y;
  args.h0 = h0;
  args.c0 = c0;
  args.grad_h_n = grad_h_n;
  args.grad_c_n = grad_c_n;
  args.dG = dG;
  args.hprev = hprev;
  args.grad_h0 = grad_h0;
  args.grad_c0 = grad_c0;
  return with_path<scalar_t>(tf32, [&](auto path) {
    return run_backward<scalar_t, decltype(path)::value>(s, prop, args, like);
  });
}

#define SK_INSTANTIATE_PERSISTENT_BACKWARD(T)                                                                     \
  template bool lstm_persistent_backward<T>(const LstmSizes&, bool, bool, const T*, const T*, const T*, const T*, \
                                            const T*, const T*, const T*, const T*, const T*, T*, T*,             \
                                            at::opmath_type<T>*, at::opmath_type<T>*, const at::Tensor&);
SK_INSTANTIATE_PERSISTENT_BACKWARD(float)
SK_INSTANTIATE_PERSISTENT_BACKWARD(double)
SK_INSTANTIATE_PERSISTENT_BACKWARD(c10::Half)
SK_INSTANTIATE_PERSISTENT_BACKWARD(c10::BFloat16)
#undef SK_INSTANTIATE_PERSISTENT_BACKWARD

}  // namespace cuda
}  // namespace seqkernels
