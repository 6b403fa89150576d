// Device helpers shared by the CUDA LSTM kernels (lstm.cu, lstm_persistent.cu,
// lstm_fused_step.cu): the cell nonlinearities, the bias sum, the tensor-core MMA instructions and
// programmatic dependent launch.
#pragma once

#include <ATen/OpMathType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "seqkernels/lstm_cell.h"

namespace seqkernels {
namespace cuda {

// The 16-bit dtypes: always on tensor cores (float32 is where TF32 is allowed).
template <class scalar_t>
constexpr bool kHalfType = std::is_same_v<scalar_t, c10::Half> || std::is_same_v<scalar_t, c10::BFloat16>;

#if defined(__CUDA_ARCH__)
// 1 / d for d >= 1: the fast path of IEEE float division (rcp.approx, then one Newton step),
// which gives the correctly rounded quotient for 1 <= d < 2^126. Without the division's
// out-of-range check and its out-of-line slow path, the three sigmoids of a cell need no
// branch and the compiler can interleave them (the gate math is on the critical path of every
// step of the persistent kernels). d >= 2^126 (x < -87.3 in the sigmoid) returns 0 instead of
// a result below 2^-126. The Newton step takes d clamped to 2^126: at d = inf (x < -88.7, where
// expf overflows) -d * r was -inf * 0 = NaN, so a gate's sigmoid gave NaN instead of 0. A NaN d
// still gives NaN (through r; fminf would return the bound for it).
__device__ __forceinline__ float reciprocal_at_least_one(float d) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  return fmaf(r, fmaf(-fminf(d, 0x1p126f), r, 1.0f), r);
}
#endif

// Cell nonlinearities on the GPU: IEEE-accurate expf/tanhf (a few ulp, never fast-math
// intrinsics) in float, exp/tanh in double. Host-callable too, so that the __host__
// __device__ cell functions of lstm_cell.h can be instantiated with it.
struct CudaMath {
  static SK_HOST_DEVICE float sigmoid(float x) {
#if defined(__CUDA_ARCH__)
    return reciprocal_at_least_one(1.0f + expf(-x));
#else
    return 1.0f / (1.0f + expf(-x));
#endif
  }
  static SK_HOST_DEVICE double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
  static SK_HOST_DEVICE float tanh(float x) { return tanhf(x); }
  static SK_HOST_DEVICE double tanh(double x) { return ::tanh(x); }
};

#if defined(__CUDACC__)

// b_ih + b_hh of gate row r in acc_t; 0 without bias (b_ih == nullptr). Every loop kernel adds
// the two biases itself (lstm.cu's per-step kernel in a vectorised form of the same sum).
template <class scalar_t>
__device__ __forceinline__ at::opmath_type<scalar_t> bias_sum(const scalar_t* b_ih, const scalar_t* b_hh, int64_t r) {
  using acc_t = at::opmath_type<scalar_t>;
  return b_ih != nullptr ? static_cast<acc_t>(b_ih[r]) + static_cast<acc_t>(b_hh[r]) : acc_t(0);
}

// float -> TF32 (round to nearest, ties away: cuBLAS's FAST_TF32 operand rounding), as bits.
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

// float32 without TF32 on tensor cores (3xTF32): x = TF32(x) + small + O(2^-22 |x|), small the
// TF32 value of the remainder (the subtraction is exact), given big = to_tf32(x); as bits.
__device__ __forceinline__ uint32_t tf32_small(float x, uint32_t big) { return to_tf32(x - __uint_as_float(big)); }

// float32 with TF32 on fp16 tensor cores: fp16 has TF32's 10-bit mantissa, and powers of two
// (exact) scale operands into its exponent range (the cluster forward kernel's W_hh and h0, the
// input projection's x and W_ih). The larger of m and |x| for a finite x (inf and NaN, which fp16
// keeps, set no scale).
__device__ __forceinline__ float finite_abs_max(float m, float x) { return isfinite(x) ? fmaxf(m, fabsf(x)) : m; }
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// The powers of two that take a largest magnitude m into [2^14, 2^15) (fp16's largest finite value
// is 65504) and back; 1 for m = 0. The exponent stays in float32's normal range: both are exact.
__device__ __forceinline__ void power_of_two_scales(float m, float& scale, float& unscale) {
  const int e = m > 0.0f ? min(max(14 - ilogbf(m), -126), 126) : 0;
  scale = ldexpf(1.0f, e);
  unscale = ldexpf(1.0f, -e);
}

// One warp: the largest finite magnitude over kRows rows of kCols floats, row r at row(r) (16-byte
// aligned), broadcast to every lane. One float4 a lane per load, unrolled so that 16 loads are in
// flight: the scaled-operand kernels' scan of their W_hh slice before the first step, which with
// one scalar load a lane took up to 256 L2 round trips in a row.
template <int kRows, int kCols, class RowFn>
__device__ __forceinline__ float warp_rows_abs_max(RowFn row, int lane) {
  constexpr int kVecsPerRow = kCols / 4, kVecs = kRows * kVecsPerRow;
  static_assert(kCols % 4 == 0 && kVecs % 32 == 0 && (kVecsPerRow & (kVecsPerRow - 1)) == 0,
                "warp_rows_abs_max: whole float4s, a power of two of them a row, 32 a lane round");
  float m = 0.0f;
#pragma unroll 16
  for (int i = 0; i < kVecs / 32; ++i) {
    const int v = i * 32 + lane;
    const float4 q = *reinterpret_cast<const float4*>(row(v / kVecsPerRow) + v % kVecsPerRow * 4);
    m = finite_abs_max(finite_abs_max(finite_abs_max(finite_abs_max(m, q.x), q.y), q.z), q.w);
  }
  return warp_max(m);
}

// A bf16 / fp16 pair in 32 bits, lo in the low half (the lower k of an MMA fragment).
template <class T>
__device__ __forceinline__ uint32_t pack2(T lo, T hi) {
  return static_cast<uint32_t>(lo.x) | (static_cast<uint32_t>(hi.x) << 16);
}

// One warp: row src[0, cols) (cols % 4 == 0, 16-byte aligned) scaled by the power of two that
// takes its largest finite magnitude into [2^14, 2^15), in fp16 (dst, 8-byte aligned); returns the
// inverse scale. The second pass re-reads the row (L1 / L2).
__device__ __forceinline__ float scale_row_to_half(const float* src, int64_t cols, int lane, c10::Half* dst) {
  const float4* row = reinterpret_cast<const float4*>(src);
  const int64_t vecs = cols / 4;
  float m = 0.0f;
  for (int64_t v = lane; v < vecs; v += 32) {
    const float4 q = row[v];
    m = finite_abs_max(finite_abs_max(finite_abs_max(finite_abs_max(m, q.x), q.y), q.z), q.w);
  }
  float scale, unscale;
  power_of_two_scales(warp_max(m), scale, unscale);
  uint2* out = reinterpret_cast<uint2*>(dst);
  for (int64_t v = lane; v < vecs; v += 32) {
    const float4 q = row[v];
    out[v] = make_uint2(pack2(c10::Half(q.x * scale), c10::Half(q.y * scale)),
                        pack2(c10::Half(q.z * scale), c10::Half(q.w * scale)));
  }
  return unscale;
}

// Part 0 (the TF32 value) or 1 (tf32_small) of x, as bits.
__device__ __forceinline__ uint32_t tf32_part(float x, int part) {
  const uint32_t big = to_tf32(x);
  return part == 0 ? big : tf32_small(x, big);
}

// d += a · b on tensor cores, fp32 accumulation, one warp:
//   bf16 / fp16: mma.m16n8k16 (A 16x16 row-major, B 16x8 "col"), 4 + 2 registers of pairs;
//   float:       mma.m16n8k8 with TF32 operands (already rounded with to_tf32).
// Fragment layouts (g = lane / 4, t = lane % 4):
//   m16n8k16: a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1], a2/a3 = the same at k + 8;
//             b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]
//   m16n8k8:  a0 = A[g][t], a1 = A[g+8][t], a2/a3 = the same at k + 4; b0 = B[t][g], b1 = B[t+4][g]
//   d (both): d0/d1 = D[g][2t, 2t+1], d2/d3 = D[g+8][2t, 2t+1]
template <class T>
struct MmaInst;
template <>
struct MmaInst<c10::BFloat16> {
  static __device__ __forceinline__ void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <>
struct MmaInst<c10::Half> {
  static __device__ __forceinline__ void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <>
struct MmaInst<float> {  // TF32 operands
  static __device__ __forceinline__ void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// Four 8x8 matrices of 16-bit values from shared memory (lane l gives the address of row l % 8
// of matrix l / 8), e.g. a 16x16 tile as the A fragments of mma.m16n8k16 (lane l: row l % 16,
// columns 8 (l / 16) ...). Volatile: it must stay after the waits that make its data valid.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// The backward kernels' item (batch row b, unit j) at iteration i, step s = T - 1 - i (time t =
// reverse ? T - 1 - s : s): the saved activated gates, c_t, grad_y_t, and c_{t-1} and h_{t-1} (c0 and
// h0 at s = 0), as floats, loaded one iteration ahead of their use (the one-cluster and row-split
// backward kernels; `a` holds gates, cells, y, grad_y, h0, c0 and reverse, G = 4H gate rows); nothing
// where !live (no item).
struct BackwardItemInputs {
  float act[4], c, c_prev, dy, h_prev;
};
// The item's inputs at packed row `row`; its state came from packed row prev_row, or from h0 / c0
// (row b) where prev_row < 0.
template <int H, class Args>
__device__ __forceinline__ void load_backward_rows(const Args& a, int64_t row, int64_t prev_row, int b, int j,
                                                   BackwardItemInputs& in) {
  constexpr int64_t G = 4 * static_cast<int64_t>(H);
#pragma unroll
  for (int q = 0; q < 4; ++q) in.act[q] = static_cast<float>(a.gates[row * G + q * H + j]);
  in.c = static_cast<float>(a.cells[row * H + j]);
  in.dy = static_cast<float>(a.grad_y[row * H + j]);
  if (prev_row >= 0) {
    in.c_prev = static_cast<float>(a.cells[prev_row * H + j]);
    in.h_prev = static_cast<float>(a.y[prev_row * H + j]);
  } else {
    in.c_prev = static_cast<float>(a.c0[static_cast<int64_t>(b) * H + j]);
    in.h_prev = static_cast<float>(a.h0[static_cast<int64_t>(b) * H + j]);
  }
}
// Every step full (B rows): iteration i's step s = T - 1 - i.
template <int H, class Args>
__device__ __forceinline__ void load_backward_item(const Args& a, int T, int B, int i, int b, int j, bool live,
                                                   BackwardItemInputs& in) {
  const int s = T - 1 - i;
  const int64_t t = a.reverse ? T - 1 - s : s;
  if (!live) return;
  load_backward_rows<H>(a, t * B + b, s > 0 ? (a.reverse ? t + 1 : t - 1) * B + b : -1, b, j, in);
}

// Spin-wait guard: a wait longer than this (in SM clock cycles, ~10 s) means a bug or a
// broken co-residency assumption; trap so that the launch fails instead of hanging.
constexpr long long kSpinTimeoutCycles = 20'000'000'000LL;

__device__ __forceinline__ void check_spin_timeout(long long t0, unsigned want) {
  if (clock64() - t0 > kSpinTimeoutCycles) {
    printf("seqkernels: persistent LSTM block %d waited > 10 s for flag %u; aborting the kernel\n",
           static_cast<int>(blockIdx.x), want);
    __trap();
  }
}

// The GPU's global timer in ns (SEQKERNELS_LSTM_TRACE: wall time beside the SM cycles).
__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// SEQKERNELS_LSTM_TRACE: thread 0 of block 0 accumulates the SM cycles of up to five phases of a
// step (mark(k) ends phase k) and the wall time; each kernel prints the means per step at the end,
// named by its own phases. A uniform branch when off.
struct PhaseTrace {
  bool on;
  long long last, begin, acc[5];
  uint64_t begin_ns;
  __device__ __forceinline__ void start(bool flag) {
    on = flag && blockIdx.x == 0 && threadIdx.x == 0;
    acc[0] = acc[1] = acc[2] = acc[3] = acc[4] = 0;
    if (on) {
      last = begin = clock64();
      begin_ns = global_timer_ns();
    }
  }
  __device__ __forceinline__ void mark(int k) {
    if (on) {
      const long long now = clock64();
      acc[k] += now - last;
      last = now;
    }
  }
  // ns per step since start(), and the SM clock in GHz over that time (at the report).
  __device__ double ns_per_step(int T) const { return double(global_timer_ns() - begin_ns) / T; }
  __device__ double clock_ghz(int T) const { return double(last - begin) / T / ns_per_step(T); }
};

// Waits for the phase of parity `parity` of the mbarrier at shared address `bar` to complete,
// with the spin guard (cluster.cuh's mbarrier_wait has none) and an acquire at
// cluster scope (the st.async data of other blocks of the cluster). sm_90.
__device__ __forceinline__ void mbarrier_wait_guarded(uint32_t bar, uint32_t parity, unsigned step) {
  uint32_t done = 0;
  const long long t0 = clock64();
  while (true) {
    asm volatile(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    if (done) break;
    check_spin_timeout(t0, step);
  }
}

// Programmatic dependent launch (sm_90+; no-ops below, and in a kernel launched without the
// attribute). A kernel launched with it (launch_kernel's `overlap`) may start before the
// kernel launched before it on the stream has finished, and must call pdl_wait() before it
// reads anything that kernel writes, or writes anything that kernel reads.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the kernel launched after this one (with the attribute) start now.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether the device has programmatic dependent launch (the attribute and the instructions).
inline bool pdl_supported(const cudaDeviceProp& prop) { return prop.major >= 9; }

// kernel<<<grid, block, smem, stream>>>(args...), with the PDL attribute where `overlap`
// (only where pdl_supported). Checked.
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool overlap,
                   Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = overlap ? 1 : 0;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

#endif  // __CUDACC__

}  // namespace cuda
}  // namespace seqkernels
