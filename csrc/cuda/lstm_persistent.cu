// Persistent small-batch LSTM kernels: one cooperative launch runs a layer's whole time loop.
//
// Why. At small batch a time step of the cuBLAS path (csrc/cuda/lstm.cu: one recurrent GEMM
// and one pointwise kernel per step) costs ~8 µs of launches and of GEMM set-up, while the
// arithmetic of a step is a fraction of a microsecond. Here the grid stays resident for all
// T steps, W_hh stays on chip (registers or shared memory), and the blocks exchange the
// recurrent state through L2.
//
// Shape legend: T steps, N packed rows, B = batch_sizes[0], H hidden, G = 4H gate rows
// (i, f, g, o), U hidden units per block (4 or 8), Hp = nblocks * U (H padded), bt =
// batch_sizes[t]. acc_t is float for half types and scalar_t otherwise.
//
// Decomposition (forward). Block b owns units j in [b*U, b*U + U) and all four gates of them,
// so the gate math, c and h of those units stay in the block. Per step it needs all of
// h_{t-1} [bt, H] and computes
//     D[n][c] = sum_k h_{t-1}[n][k] * W_hh[row(c)][k],   c = gate*U + u, row(c) = gate*H + j
// with h_{t-1} staged in shared memory (the A operand, batch rows in m16 tiles) and its 4U
// rows of W_hh resident (the B operand): in registers as tensor-core fragments for bf16/fp16
// (mma.m16n8k16, fp32 accumulation) and for float32 with TF32 allowed (mma.m16n8k8.tf32,
// operands rounded to TF32 like cuBLAS's FAST_TF32); in shared memory for FFMA/DFMA (float32
// with TF32 off, float64: full precision; float32's direct forward kernel below multiplies on
// tensor cores instead, three TF32 MMAs per product). K is split over the 8 warps (FMA: over thread
// groups); the partial sums meet in shared memory and are added in a fixed order. Then the
// gate threads (one per (unit, batch row)) add pre = x·W_ihᵀ (one cuBLAS GEMM before the
// kernel) and the bias, apply lstm_cell.h, keep c in a register for the whole sequence,
// write y (and the saved gates/cells when training), and publish h_t.
//
// Exchange and synchronisation: one wait per step, no separate grid barrier. h_t is
// published in an "LL" (low-latency, as in NCCL) buffer: every 8-byte word holds 4 bytes of
// payload and a 4-byte flag = step + 1, written with one 64-bit store, which the memory
// model makes single-copy atomic. A consumer reads the words of h_{t-1} (16-byte vector loads
// = two atomic 64-bit accesses) and re-reads those whose flag is not yet its step: a word is
// valid exactly when it carries the expected flag, so no fence, counter or barrier is
// needed, and a step costs one store-to-load trip through L2 instead of a barrier followed by
// a load. Two buffers alternate (step s writes buffer s % 2); a block can only write step s
// after it has read every block's step s-1, which those wrote only after reading step s-2
// from the buffer being overwritten, so no word is overwritten before it was read. Flags are
// zeroed by a cudaMemsetAsync on the current stream before each launch (stale flags from an
// earlier launch could otherwise match), which a CUDA graph captures like the launch itself.
// The wait needs every block resident: the kernel is launched cooperatively
// (cudaLaunchKernelEx + cudaLaunchAttributeCooperative, capturable), after the occupancy API
// confirmed that nblocks fit; otherwise the host returns false and lstm.cu runs its cuBLAS
// loop, so a launch never deadlocks. A wait that exceeds 10 s traps instead of hanging.
//
// Backward (reverse processing order). Block b owns the same units. Phase 1: the gate
// backward of its units (lstm_cell_backward) with dh_t = dh_state + grad_y, writing
// dG[rows] (for the weight GEMMs after the loop) and h_{t-1} gathered into hprev; its slice
// of dG_t is published in the LL buffer. Phase 2 (after the same one wait): every block
// reads all of dG_t [bt, 4Hp] and forms dh_{t-1}[:, own units] = dG_t · W_hh[:, own units]
// with its W_hh columns resident (B operand), so the next phase 1 needs only its own
// results: one exchange per step. dW_hh, dW_ih, dx and dbias remain whole-sequence GEMMs in
// lstm.cu (deterministic: no atomics anywhere; every sum has a fixed order). At B <= 16 on
// tensor cores, where it was measured faster, a split variant exchanges each block's partial
// dh_{t-1} over its own gate rows instead of dG ("Backward kernel, split variant" in
// lstm_persistent_backward.cu).
//
// Packed sequences and reverse: the step table (runs of equal batch size, at most 64) is a
// kernel argument; rows b >= bt keep their state in registers exactly as lstm.cu's hbuf/cbuf
// keep untouched rows, and a row that starts late (reverse direction) takes h0/c0.
//
// Limits (else cuBLAS): no projection; one gate item per thread, U * B <= 256 (B <= 64 with
// 4 units per block, B <= 32 with 8, which H > 4 * #SMs needs); at most 64 distinct batch
// sizes; the resident weights must fit: MMA fragments cover Hp <= 1024, the FMA path keeps W
// in shared memory (float32 H <= 1024, float64 H <= ~512); the X tile is loaded in up to 8
// column chunks per step when B * K does not fit shared memory. Whether it runs at all
// (SEQKERNELS_LSTM_BACKEND, the auto heuristic): lstm_loop.cuh. SEQKERNELS_LSTM_TRACE=1 makes
// block 0 print the mean SM cycles per step and phase (wait + gather, product, gate math,
// publication) of each launch.
//
// Code size matters: every step runs the whole loop body, and at ~60 KB of SASS per step the
// kernels were bound by instruction fetch (measured with SEQKERNELS_LSTM_TRACE on an H200:
// ~2000 cycles for a B = 1 gate phase). Hence one gate item per thread, compact reductions,
// a small gather with an out-of-line slow path, and outputs stored after the publication.
//
// Forward at B <= 16 on tensor cores: lstm_persistent_forward_direct_kernel
// (lstm_persistent_direct.cu) skips the X tile: each warp loads its A fragments straight from the
// LL buffer, and one barrier per step is left (its comment has the details; docs/kernels.md the
// measurements).
//
// Files: the kernel families build as five translation units, in parallel (one file was the
// build's critical path): this one (the general forward kernel, the choice among the forward
// kernels, lstm_persistent_forward), lstm_persistent_direct.cu (the direct forward kernel),
// lstm_persistent_cluster.cu (the forward kernel in clusters of two blocks, and its row split),
// lstm_persistent_backward.cu (the general and split backward kernels, lstm_persistent_backward)
// and lstm_row_split_backward.cu (the backward's row split at H = 1024);
// lstm_persistent_common.cuh holds what they share, flagged_exchange.cuh the step flags and
// poisoned words of the row splits and the cluster kernel.

#include "lstm_persistent_common.cuh"

namespace seqkernels {
namespace cuda {
namespace persistent {
namespace {

// ---------------------------------------------------------------------------------------
// Forward kernel
// ---------------------------------------------------------------------------------------
template <class scalar_t, Path P, bool kTraining>
__global__ void __launch_bounds__(kThreads, 1)
    lstm_persistent_forward_kernel(const __grid_constant__ FwdArgs<scalar_t> a) {
  using acc_t = at::opmath_type<scalar_t>;
  using Math = CudaMath;
  constexpr int kCH = gather_batch<P>();
  constexpr int kKP = P == Path::kFma ? 0 : kWarps;  // depth of red: the warps (MMA) or run time (FMA)
  constexpr int sz = sizeof(scalar_t);
  const Geometry& g = a.g;
  extern __shared__ __align__(16) unsigned char smem[];
  scalar_t* xs = reinterpret_cast<scalar_t*>(smem);  // [Bp16][ldx] h_{t-1} (chunk)
  acc_t* red = reinterpret_cast<acc_t*>(smem + g.off_red);          // [kp][Bp16][NCp] partial sums
  scalar_t* stage = reinterpret_cast<scalar_t*>(smem + g.off_stage);  // [B][U] h_t of own units
  scalar_t* ws = reinterpret_cast<scalar_t*>(smem + g.off_w);       // FMA: [nch*CK][NCp] resident W
  SegTable* seg = reinterpret_cast<SegTable*>(smem + g.off_seg);

  const int H = g.H, U = g.U, B = g.B, T = g.T;
  const int j0 = blockIdx.x * U;
  const int64_t G4 = 4 * static_cast<int64_t>(H);
  init_shared(smem, g, a.seg, seg, g.off_red);

  // Wres[k][c] = W_hh[gate * H + j0 + u][k], c = gate * U + u.
  const scalar_t* __restrict__ w_hh = a.w_hh;
  auto wf = [&](int k, int c) -> scalar_t {
    const int u = c & (U - 1), gate = c >> g.lg_u;
    if (gate >= 4 || j0 + u >= H || k >= H) return static_cast<scalar_t>(0.0f);
    return w_hh[static_cast<int64_t>(gate * H + j0 + u) * H + k];
  };
  Resident<scalar_t, P, false> res;
  res.load(wf, g, ws);

  Item items[kItems];
  acc_t c_st[kItems], bias_r[kItems][4];
  scalar_t h_st[kItems];
#pragma unroll
  for (int p = 0; p < kItems; ++p) {
    items[p] = make_item(g, p);
    const Item& it = items[p];
    c_st[p] = it.valid ? static_cast<acc_t>(a.c0[it.n * H + it.j]) : acc_t(0);
    h_st[p] = it.valid ? a.h0[it.n * H + it.j] : static_cast<scalar_t>(0.0f);
#pragma unroll
    for (int q = 0; q < 4; ++q) bias_r[p][q] = it.valid ? bias_sum(a.b_ih, a.b_hh, q * H + it.j) : acc_t(0);
  }
  __syncthreads();

  // pre of the next step, loaded one step ahead so that its latency hides behind the wait.
  acc_t pv[kItems][4];
  auto prefetch = [&](const StepInfo& st) {
#pragma unroll
    for (int p = 0; p < kItems; ++p) {
      const Item& it = items[p];
      if (it.valid && it.n < st.bt) {
        const acc_t* pr = a.pre + (st.off + it.n) * G4 + it.j;
#pragma unroll
        for (int q = 0; q < 4; ++q) pv[p][q] = pr[q * H];
      }
    }
  };
  int k_cur = a.reverse ? seg->count - 1 : 0;
  int k_nxt = k_cur;
  StepInfo cur = step_at(seg, a.reverse ? T - 1 : 0, k_cur);
  prefetch(cur);

  PhaseTrace trace;
  trace.start(a.trace);
  int bt_prev = 0;
  for (int s = 0; s < T; ++s) {
    const int bt = cur.bt;
    const int64_t off = cur.off;
    // 1. h_{t-1} into the X tile: rows [0, nll) from the LL buffer of step s-1 (flag s),
    //    rows [nll, bt) start here (step 0, or sequences that start late in reverse) from h0.
    const int nll = s > 0 ? min(bt, bt_prev) : 0;
    for (int ch = 0; ch < g.nch; ++ch) {
      if (ch > 0) {
        __syncthreads();  // the previous chunk's products are done with the tile
        trace.mark(1);
      }
      const int col0 = ch * g.CK;
      const int ncol = max(0, min(g.CK, g.Kx - col0));
      if (nll > 0 && ncol > 0) {
        ll_gather<kCH>(a.xbuf + static_cast<int64_t>((s - 1) & 1) * B * g.row_words + col0 * sz / 4, g.row_words,
                       ncol * sz / 4, nll, static_cast<unsigned>(s), smem, g.ldx * sz);
      }
      if (g.nch > 1 && ncol < g.CK) {  // a short last chunk: zero the stale columns
        const int w = g.CK - ncol;
        for (int e = threadIdx.x; e < nll * w; e += kThreads) {
          const int r = e / w;
          xs[r * g.ldx + ncol + (e - r * w)] = static_cast<scalar_t>(0.0f);
        }
      }
      if (bt > nll) {
        for (int e = threadIdx.x; e < (bt - nll) * g.CK; e += kThreads) {
          const int r = nll + e / g.CK;
          const int k = e % g.CK;
          const int kg = col0 + k;
          xs[r * g.ldx + k] = kg < H ? a.h0[r * H + kg] : static_cast<scalar_t>(0.0f);
        }
      }
      __syncthreads();
      trace.mark(0);
      // 2. Partial gate pre-activations of this chunk.
      res.gemm(g, xs, ws, ch, bt, red);
    }
    __syncthreads();
    trace.mark(1);

    // 3. Gate math of the own units; h_t to the staging row for publication. The outputs
    //    (y, gates, cells) are stored after the publication, off the critical path.
    acc_t act_r[kItems][4], c_new_r[kItems];
#pragma unroll
    for (int p = 0; p < kItems; ++p) {
      const Item& it = items[p];
      if (!it.exists || it.n >= bt) continue;
      if (it.valid) {
        const int base = it.n * g.NCp + it.u;
        acc_t pq[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          pq[q] = pv[p][q] + bias_r[p][q] + sum_partials<kKP>(red, g.kp, g.red_stride, base + q * U);
        }
        const LstmGates<acc_t> pre_g{pq[0], pq[1], pq[2], pq[3]};
        LstmGates<acc_t> act;
        acc_t c_new, m;
        lstm_cell_forward<Math>(pre_g, c_st[p], act, c_new, m);
        c_st[p] = c_new;
        const scalar_t h = static_cast<scalar_t>(m);
        h_st[p] = h;
        act_r[p][0] = act.i;
        act_r[p][1] = act.f;
        act_r[p][2] = act.g;
        act_r[p][3] = act.o;
        c_new_r[p] = c_new;
        stage[it.n * U + it.u] = h;
      } else {
        stage[it.n * U + it.u] = static_cast<scalar_t>(0.0f);
      }
    }
    if (s + 1 < T) {
      cur = step_at(seg, a.reverse ? T - 2 - s : s + 1, k_nxt);
      prefetch(cur);
    }
    __syncthreads();
    trace.mark(2);

    // 4. Publish the own slice of h_t (rows [0, bt)) with flag s + 1, then the outputs.
    if (s + 1 < T) {
      u64* dst = a.xbuf + static_cast<int64_t>(s & 1) * B * g.row_words + blockIdx.x * g.wpb;
      for (int e = threadIdx.x; e < bt * g.wpb; e += kThreads) {
        const int n = e >> g.lg_wpb, q = e & (g.wpb - 1);
        const uint32_t payload = reinterpret_cast<const uint32_t*>(stage + n * U)[q];
        ll_store(dst + static_cast<int64_t>(n) * g.row_words + q, payload, static_cast<uint32_t>(s + 1));
      }
    }
#pragma unroll
    for (int p = 0; p < kItems; ++p) {
      const Item& it = items[p];
      if (!it.valid || it.n >= bt) continue;
      const int64_t row = off + it.n;
      a.y[row * H + it.j] = h_st[p];
      if constexpr (kTraining) {
        scalar_t* gr = a.gates + row * G4 + it.j;
#pragma unroll
        for (int q = 0; q < 4; ++q) gr[q * static_cast<int64_t>(H)] = static_cast<scalar_t>(act_r[p][q]);
        a.cells[row * H + it.j] = static_cast<scalar_t>(c_new_r[p]);
      }
    }
    trace.mark(3);
    bt_prev = bt;
  }
  report_trace(trace, kTraining ? "forward (training)" : "forward (inference)", g);

#pragma unroll
  for (int p = 0; p < kItems; ++p) {
    const Item& it = items[p];
    if (it.valid) {
      a.h_n[it.n * H + it.j] = h_st[p];
      a.c_n[it.n * H + it.j] = c_st[p];
    }
  }
}

// SEQKERNELS_LSTM_PERSISTENT_DIRECT=0 keeps B <= 16 on the general forward kernel: a diagnostic
// switch, so that one device run can time both forward kernels side by side.
bool direct_forward_enabled() { return switch_on("SEQKERNELS_LSTM_PERSISTENT_DIRECT"); }

template <class scalar_t, Path P, bool kTraining>
bool run_forward(const LstmSizes& s, const cudaDeviceProp& prop, FwdArgs<scalar_t>& args, const at::Tensor& like) {
  if (args.pre_unscale != nullptr) {  // a scaled projection is the scaled fp16 cluster kernel's alone
    if constexpr (P == Path::kTf32) {
      return run_cluster_forward<scalar_t, kTraining, ClusterOperands::kHalfScaled>(s, prop, args, like);
    }
    return false;
  }
  if constexpr (P == Path::kTf32) {
    // float32 with TF32 allowed: scaled fp16 operands where cluster_half_products says so.
    if (cluster_half_products()) {
      if (run_cluster_forward<scalar_t, kTraining, ClusterOperands::kHalfScaled>(s, prop, args, like)) return true;
    } else if (run_cluster_forward<scalar_t, kTraining, ClusterOperands::kTf32>(s, prop, args, like)) {
      return true;
    }
  } else if constexpr (P == Path::kMma16) {
    // H <= 512: the whole layer in one cluster per 8 batch rows (lstm_one_cluster.cu), where all
    // those clusters are resident at once; not where the cluster kernel is forced.
    if (cluster_forward_mode() != 1 &&
        lstm_one_cluster_forward<scalar_t>(s, args.reverse, kTraining, args.trace != 0, args.pre, args.b_ih, args.b_hh,
                                           args.w_hh, args.h0, args.c0, args.y, args.gates, args.cells, args.h_n,
                                           args.c_n)) {
      return true;
    }
    if (run_cluster_forward<scalar_t, kTraining, ClusterOperands::kSixteenBit>(s, prop, args, like)) return true;
  } else if constexpr (std::is_same_v<scalar_t, float>) {
    // float32 with TF32 off: three TF32 MMAs per product.
    if (run_cluster_forward<scalar_t, kTraining, ClusterOperands::kTf32x3>(s, prop, args, like)) return true;
  }
  if (direct_forward_enabled()) {
    if constexpr (P == Path::kTf32) {
      // float32 with TF32 allowed: scaled fp16 operands unless SEQKERNELS_LSTM_DIRECT_HALF=0.
      if (direct_half_products() && run_direct_forward<scalar_t, Path::kHalfScaled, kTraining>(s, prop, args, like)) {
        return true;
      }
    }
    if constexpr (P != Path::kFma) {
      if (run_direct_forward<scalar_t, P, kTraining>(s, prop, args, like)) return true;
    } else if constexpr (std::is_same_v<scalar_t, float>) {
      // float32 with TF32 off: the x3 products on fp16 parts at B <= 8, Hp > 512 unless
      // SEQKERNELS_LSTM_DIRECT_X3_HALF=0, else on TF32 parts (Hp <= 1024).
      if (direct_x3_half_products() && run_direct_forward<scalar_t, Path::kHalfX3, kTraining>(s, prop, args, like)) {
        return true;
      }
      if (run_direct_forward<scalar_t, Path::kTf32x3, kTraining>(s, prop, args, like)) return true;
    }
  }
  auto kernel = &lstm_persistent_forward_kernel<scalar_t, P, kTraining>;
  auto make = [&](int U, Geometry& g) { return make_geometry<scalar_t, P, false>(s, prop, U, g); };
  if (!plan(s, prop, kernel, args.g, make)) return false;
  return launch_with_exchange(kernel, args, args.xbuf, like);
}

}  // namespace
}  // namespace persistent

template <class scalar_t>
bool lstm_persistent_forward(const LstmSizes& s, bool reverse, bool training, bool tf32,
                             const at::opmath_type<scalar_t>* pre, const float* pre_unscale, const scalar_t* b_ih,
                             const scalar_t* b_hh, const scalar_t* w_hh, const scalar_t* h0, const scalar_t* c0,
                             scalar_t* y, scalar_t* gates, scalar_t* cells, scalar_t* h_n,
                             at::opmath_type<scalar_t>* c_n, const at::Tensor& like) {
  using namespace persistent;
  const cudaDeviceProp& prop = *at::cuda::getCurrentDeviceProperties();
  if (!common_preconditions(s, prop)) return false;
  FwdArgs<scalar_t> args{};
  if (!build_segments(s, args.seg)) return false;
  args.trace = trace_requested();
  args.reverse = reverse;
  args.pre = pre;
  args.pre_unscale = pre_unscale;
  args.b_ih = b_ih;
  args.b_hh = b_hh;
  args.w_hh = w_hh;
  args.h0 = h0;
  args.c0 = c0;
  args.y = y;
  args.gates = gates;
  args.cells = cells;
  args.h_n = h_n;
  args.c_n = c_n;
  return with_path<scalar_t>(tf32, [&](auto path) {
    constexpr Path kPath = decltype(path)::value;
    return training ? run_forward<scalar_t, kPath, true>(s, prop, args, like)
                    : run_forward<scalar_t, kPath, false>(s, prop, args, like);
  });
}

#define SK_INSTANTIATE_PERSISTENT_FORWARD(T)                                                                      \
  template bool lstm_persistent_forward<T>(const LstmSizes&, bool, bool, bool, const at::opmath_type<T>*,         \
                                           const float*, const T*, const T*, const T*, const T*, const T*, T*, T*, \
                                           T*, T*, at::opmath_type<T>*, const at::Tensor&);
SK_INSTANTIATE_PERSISTENT_FORWARD(float)
SK_INSTANTIATE_PERSISTENT_FORWARD(double)
SK_INSTANTIATE_PERSISTENT_FORWARD(c10::Half)
SK_INSTANTIATE_PERSISTENT_FORWARD(c10::BFloat16)
#undef SK_INSTANTIATE_PERSISTENT_FORWARD

}  // namespace cuda
}  // namespace seqkernels
