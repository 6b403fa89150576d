// The ConvLSTM on the GPU: convlstm_forward / convlstm_backward (schemas in
// csrc/registration.cpp, checks in csrc/convlstm_checks.cpp, the time loop in
// seqkernels/convlstm_loop.h with cuDNN's convolutions). This file is the fused pointwise
// pass of a step: one thread per channels-last (b, pixel, c) element reads its four gates from
// the two convolutions' outputs, applies the cell of seqkernels/convlstm_cell.h in float
// (double for float64) and writes h, c, y and the saved gates (backward: dz and dc); and
// StepGraph, which replays each step's convolution from a CUDA graph.
//
// Shape legend: B batch, P = H·W pixels, C hidden channels, G = 4C; layouts in convlstm_loop.h.
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "kept_pools.cuh"
#include "lstm_loop.cuh"
#include "seqkernels/convlstm_cell.h"
#include "seqkernels/convlstm_loop.h"

namespace seqkernels {
namespace {

using at::Tensor;

template <class acc_t>
struct CudaMath {
  static __device__ __forceinline__ acc_t sigmoid(acc_t x) { return acc_t(1) / (acc_t(1) + exp(-x)); }
  static __device__ __forceinline__ acc_t tanh(acc_t x) { return ::tanh(x); }
};

// A block is kTile x kRows threads over a tile of kTile pixels x kTile channels. The gate math
// runs with threadIdx.x along channels (the channels-last buffers: coalesced); y_t (and in
// backward dL/dy_t) is in the output's layout, channels P apart, so it goes through the
// tile in shared memory and is written (read) with threadIdx.x along pixels.
constexpr int kTile = 32;
constexpr int kRows = 8;

struct TileGrid {
  int64_t pixel_tiles;
  dim3 grid;
};

// Tiles over B·P pixels (grid x, capped: the kernels stride over the rest) and over `tiles`
// channel tiles (grid y).
TileGrid tile_grid(int64_t pixels, int64_t tiles) {
  TORCH_CHECK(tiles >= 1 && tiles <= 65535, "seqkernels.convlstm: too many channels for the CUDA kernel (",
              tiles * kTile, ")");
  const int64_t pixel_tiles = (pixels + kTile - 1) / kTile;
  const int64_t max_x = int64_t(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * 32;
  return {pixel_tiles, dim3(unsigned(std::max<int64_t>(1, std::min(pixel_tiles, max_x))), unsigned(tiles))};
}

// Channel tiles [0, gate_tiles): the cell of channels blockIdx.y·kTile + threadIdx.x. Tiles
// from gate_tiles on (inference, not the last step): x_{t+1}'s channels, from x's layout into
// the next convolution's input.
template <bool kPeephole, bool kTraining, bool kAdd, class scalar_t>
__global__ void __launch_bounds__(kTile* kRows)
    forward_kernel(ConvLstmForwardStep<scalar_t> s, int64_t pixel_tiles, int gate_tiles) {
  using acc_t = at::opmath_type<scalar_t>;
  __shared__ scalar_t tile[kTile][kTile + 1];  // +1: no bank conflicts along either index
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t C = s.C, G = 4 * C, P = s.P, PC = P * C, pixels = s.B * P;
  for (int64_t pt = blockIdx.x; pt < pixel_tiles; pt += gridDim.x) {
    const int64_t p0 = pt * kTile;
    if (int(blockIdx.y) < gate_tiles) {
      const int64_t c0 = int64_t(blockIdx.y) * kTile, c_idx = c0 + tx;
      for (int k = ty; k < kTile; k += kRows) {
        const int64_t pixel = p0 + k;
        if (pixel >= pixels || c_idx >= C) continue;
        const int64_t z = pixel * G + c_idx;
        // All four pre-activations are read before any gate is written over them (training).
        LstmGates<acc_t> pre{acc_t(s.z[z]), acc_t(s.z[z + C]), acc_t(s.z[z + 2 * C]), acc_t(s.z[z + 3 * C])};
        if constexpr (kAdd) {  // training: w_hh * h_{t-1}; inference: the bias
          const scalar_t* add = kTraining ? s.zh + pixel * G + c_idx : s.bias + c_idx;
          pre.i += acc_t(add[0]);
          pre.f += acc_t(add[C]);
          pre.g += acc_t(add[2 * C]);
          pre.o += acc_t(add[3 * C]);
        }
        Peephole<acc_t> w{};
        if constexpr (kPeephole) {
          const int64_t within = (pixel % P) * C + c_idx;
          w = {acc_t(s.peep[within]), acc_t(s.peep[PC + within]), acc_t(s.peep[2 * PC + within])};
        }
        LstmGates<acc_t> act;
        acc_t c, h;
        convlstm_cell_forward<kPeephole, CudaMath<acc_t>>(pre, acc_t(s.c_prev[pixel * C + c_idx]), w, act, c, h);
        s.h[pixel * s.h_stride + c_idx] = scalar_t(h);
        s.c[pixel * C + c_idx] = scalar_t(c);
        tile[k][tx] = scalar_t(h);
        if constexpr (kTraining) {
          s.z[z] = scalar_t(act.i);
          s.z[z + C] = scalar_t(act.f);
          s.z[z + 2 * C] = scalar_t(act.g);
          s.z[z + 3 * C] = scalar_t(act.o);
        }
      }
      __syncthreads();
      const int64_t pixel = p0 + tx;  // y_t: along pixels
      if (pixel < pixels) {
        const int64_t b = pixel / P, p = pixel - b * P;
        for (int k = ty; k < kTile && c0 + k < C; k += kRows) s.y[(b * C + c0 + k) * P + p] = tile[tx][k];
      }
    } else {
      const int64_t Ci = s.Ci, ci0 = int64_t(int(blockIdx.y) - gate_tiles) * kTile;
      const int64_t pixel = p0 + tx;  // read along pixels (x's layout)
      if (pixel < pixels) {
        const int64_t b = pixel / P, p = pixel - b * P;
        for (int k = ty; k < kTile && ci0 + k < Ci; k += kRows) tile[k][tx] = s.x_next[b * s.x_stride_b + (ci0 + k) * P + p];
      }
      __syncthreads();
      const int64_t ci = ci0 + tx;  // write along channels (the input buffer's layout)
      if (ci < Ci) {
        for (int k = ty; k < kTile && p0 + k < pixels; k += kRows) s.x_slot[(p0 + k) * s.h_stride + ci] = tile[tx][k];
      }
    }
    __syncthreads();  // the tile is reused for the next pixel tile
  }
}

template <bool kPeephole, class scalar_t>
__global__ void __launch_bounds__(kTile* kRows)
    backward_kernel(ConvLstmBackwardStep<scalar_t> s, int64_t pixel_tiles) {
  using acc_t = at::opmath_type<scalar_t>;
  __shared__ scalar_t tile[kTile][kTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t C = s.C, G = 4 * C, P = s.P, PC = P * C, pixels = s.B * P;
  const int64_t c0 = int64_t(blockIdx.y) * kTile, c_idx = c0 + tx;
  for (int64_t pt = blockIdx.x; pt < pixel_tiles; pt += gridDim.x) {
    const int64_t p0 = pt * kTile;
    if (s.dy) {  // dL/dy_t in grad_y's strides: read along pixels into the tile
      const int64_t pixel = p0 + tx;
      if (pixel < pixels) {
        const int64_t b = pixel / P, p = pixel - b * P, py = p / s.W, px = p - py * s.W;
        const scalar_t* dy = s.dy + b * s.dy_stride[0] + py * s.dy_stride[2] + px * s.dy_stride[3];
        for (int k = ty; k < kTile && c0 + k < C; k += kRows) tile[k][tx] = dy[(c0 + k) * s.dy_stride[1]];
      }
      __syncthreads();
    }
    for (int k = ty; k < kTile; k += kRows) {
      const int64_t pixel = p0 + k;
      if (pixel >= pixels || c_idx >= C) continue;
      const int64_t e = pixel * C + c_idx, z = pixel * G + c_idx;
      const LstmGates<acc_t> act{acc_t(s.act[z]), acc_t(s.act[z + C]), acc_t(s.act[z + 2 * C]),
                                 acc_t(s.act[z + 3 * C])};
      Peephole<acc_t> w{};
      if constexpr (kPeephole) {
        const int64_t within = (pixel % P) * C + c_idx;
        w = {acc_t(s.peep[within]), acc_t(s.peep[PC + within]), acc_t(s.peep[2 * PC + within])};
      }
      const acc_t dh = (s.dy ? acc_t(tile[tx][k]) : acc_t(0)) + (s.dh_rec ? acc_t(s.dh_rec[e]) : acc_t(0));
      LstmGates<acc_t> dpre;
      acc_t dc_prev;
      convlstm_cell_backward<kPeephole, CudaMath<acc_t>>(act, acc_t(s.c[e]), acc_t(s.c_prev[e]), w, dh, s.dc[e], dpre,
                                                        dc_prev);
      s.dc[e] = dc_prev;
      s.dz[z] = scalar_t(dpre.i);
      s.dz[z + C] = scalar_t(dpre.f);
      s.dz[z + 2 * C] = scalar_t(dpre.g);
      s.dz[z + 3 * C] = scalar_t(dpre.o);
    }
    __syncthreads();  // the tile is reused for the next pixel tile
  }
}

// A call's staging copies (convlstm_loop.h, CopyList) in one launch: each is a [N, C, H, W]
// copy in any strides, element (n, c, h, w) at n·s[0] + c·s[1] + h·s[2] + w·s[3] on either side,
// tiled kTile channels x kTile pixels of one n. Read with threadIdx.x along pixels and written
// with it along channels (the NCHW sources, the channels-last destinations: both coalesced).
// Only the bits move (element_t: an unsigned integer of the dtype's size).
constexpr int kMaxCopies = 8;
struct StridedCopy {
  const void* src;
  void* dst;
  int64_t N, C, H, W;
  int64_t src_stride[4], dst_stride[4];
  int64_t channel_tiles, pixel_tiles, first_tile;  // first_tile: the tiles of the copies before
};
struct StridedCopies {
  StridedCopy copy[kMaxCopies];
  int count;
  int64_t tiles;
};

template <class element_t>
__global__ void __launch_bounds__(kTile* kRows) strided_copy_kernel(StridedCopies copies) {
  __shared__ element_t tile[kTile][kTile + 1];
  // The tile's pixels' offsets (h·s[2] + w·s[3]) in src and dst: one division per pixel and
  // tile (64-bit divisions per element had made the copy 3x slower than its memory traffic).
  __shared__ int64_t src_pixel[kTile], dst_pixel[kTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (int64_t t = blockIdx.x; t < copies.tiles; t += gridDim.x) {
    int j = 0;
    while (j + 1 < copies.count && t >= copies.copy[j + 1].first_tile) ++j;
    const StridedCopy& cp = copies.copy[j];
    const int64_t local = t - cp.first_tile, per_n = cp.channel_tiles * cp.pixel_tiles;
    const int64_t n = local / per_n, c0 = (local % per_n) / cp.pixel_tiles * kTile,
                  p0 = local % cp.pixel_tiles * kTile, P = cp.H * cp.W;
    const int pixels = int(std::min<int64_t>(kTile, P - p0)), channels = int(std::min<int64_t>(kTile, cp.C - c0));
    if (ty == 0 && tx < pixels) {
      const int64_t h = (p0 + tx) / cp.W, w = p0 + tx - h * cp.W;
      src_pixel[tx] = h * cp.src_stride[2] + w * cp.src_stride[3];
      dst_pixel[tx] = h * cp.dst_stride[2] + w * cp.dst_stride[3];
    }
    __syncthreads();
    const element_t* src = static_cast<const element_t*>(cp.src) + n * cp.src_stride[0] + c0 * cp.src_stride[1];
    element_t* dst = static_cast<element_t*>(cp.dst) + n * cp.dst_stride[0] + c0 * cp.dst_stride[1];
    if (tx < pixels) {
      for (int k = ty; k < channels; k += kRows) tile[k][tx] = src[k * cp.src_stride[1] + src_pixel[tx]];
    }
    __syncthreads();
    if (tx < channels) {
      for (int k = ty; k < pixels; k += kRows) dst[tx * cp.dst_stride[1] + dst_pixel[k]] = tile[tx][k];
    }
    __syncthreads();  // the tile and the offsets are reused for the next tile
  }
}

// dst.copy_(src) for every pair of `staging`, in one launch per kMaxCopies pairs.
void copy_all_cuda(const convlstm_detail::CopyList& staging) {
  StridedCopies copies{};
  at::ScalarType dtype = at::ScalarType::Undefined;
  const auto launch = [&] {
    if (copies.tiles == 0) return;
    const int64_t max_blocks = int64_t(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * 32;
    const dim3 grid(unsigned(std::min(copies.tiles, max_blocks))), block(kTile, kRows);
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    switch (c10::elementSize(dtype)) {
      case 2: strided_copy_kernel<uint16_t><<<grid, block, 0, stream>>>(copies); break;
      case 4: strided_copy_kernel<uint32_t><<<grid, block, 0, stream>>>(copies); break;
      case 8: strided_copy_kernel<uint64_t><<<grid, block, 0, stream>>>(copies); break;
      default: TORCH_CHECK(false, "seqkernels.convlstm: no staging copy for dtype ", dtype);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    copies = StridedCopies{};
  };
  for (const auto& [dst, src] : staging) {
    TORCH_CHECK(dst.dim() == 4 && dst.sizes() == src.sizes() && dst.scalar_type() == src.scalar_type() &&
                    dst.is_cuda() && src.device() == dst.device(),
                "seqkernels.convlstm: a staging copy needs two 4-D CUDA tensors of one size, dtype and device, got ",
                src.sizes(), " ", src.scalar_type(), " into ", dst.sizes(), " ", dst.scalar_type());
    if (dst.numel() == 0) continue;
    if (copies.count == kMaxCopies || (copies.count > 0 && dst.scalar_type() != dtype)) launch();
    dtype = dst.scalar_type();
    StridedCopy& cp = copies.copy[copies.count++];
    cp.src = src.data_ptr();
    cp.dst = dst.data_ptr();
    cp.N = dst.size(0);
    cp.C = dst.size(1);
    cp.H = dst.size(2);
    cp.W = dst.size(3);
    for (int d = 0; d < 4; ++d) {
      cp.src_stride[d] = src.stride(d);
      cp.dst_stride[d] = dst.stride(d);
    }
    cp.channel_tiles = (cp.C + kTile - 1) / kTile;
    cp.pixel_tiles = (cp.H * cp.W + kTile - 1) / kTile;
    cp.first_tile = copies.tiles;
    copies.tiles += cp.N * cp.channel_tiles * cp.pixel_tiles;
  }
  launch();
}

template <bool kPeephole, class scalar_t>
void launch_forward(const ConvLstmForwardStep<scalar_t>& s) {
  const int64_t gate_tiles = (s.C + kTile - 1) / kTile, x_tiles = s.x_next ? (s.Ci + kTile - 1) / kTile : 0;
  const TileGrid g = tile_grid(s.B * s.P, gate_tiles + x_tiles);
  const dim3 block(kTile, kRows);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (s.training) {  // adds w_hh * h_{t-1}
    forward_kernel<kPeephole, true, true><<<g.grid, block, 0, stream>>>(s, g.pixel_tiles, int(gate_tiles));
  } else if (s.bias) {
    forward_kernel<kPeephole, false, true><<<g.grid, block, 0, stream>>>(s, g.pixel_tiles, int(gate_tiles));
  } else {
    forward_kernel<kPeephole, false, false><<<g.grid, block, 0, stream>>>(s, g.pixel_tiles, int(gate_tiles));
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// A captured step: the graph, its result (in the graph's memory; replays write it again) and
// the input buffer the capture read. Declared in this order so that the result goes back to
// the pool before the graph that holds the pool.
template <class Result>
struct CapturedStep {
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  Result out;
  const void* input = nullptr;
};

// A loop's step graph, kept from one call to the next with the buffers it reads and writes
// (StepGraph::buffer: the forward's step weight and state buffer; the backward's staged
// inputs, weights and gradient accumulators): a call of the same sizes writes (or zeroes) them
// and replays every step. A capture per call cost ~190 µs of host time in a forward (H100: the
// convolution's capture, cudaGraphInstantiate, two generator fills, the graph's destruction)
// of a ~600 µs inference call at the benchmark's first shape, and more in a backward.
template <class Result>
struct KeptStep {
  std::vector<Tensor> buffers;            // in the order the loop asks for them
  cudaStream_t buffers_stream = nullptr;  // the stream they were allocated on
  CapturedStep<Result> step;
  uint64_t last_use = 0;
};

using ForwardResult = Tensor;                     // the step's convolution output
using BackwardResult = std::array<Tensor, 2>;     // {dL/dh_{t-1}'s recurrent part, dL/dx_t}

// The memory and stream every StepGraph of a thread captures with, per device: one private
// memory pool, kept alive by the kept graphs captured into it, and one capture stream (the
// pool's free blocks are found again by stream). A fresh pool per call cost a cudaMalloc
// (~190 µs) and later a synchronising cudaFree (~290 µs of host stall) per call on the H100
// host. The graphs share the pool's blocks apart from their results and the kept buffers,
// which stay allocated; `done` (recorded where a call's replays ran, on `done_stream`) orders
// the next call's replays and buffer writes after them when the caller has switched streams
// in between. `seen` holds the keys of the step calls that have run plainly on this thread
// (cuDNN's plan and benchmark caches are per thread too): those are captured at their first
// call. At most kKeptSteps forward and kKeptSteps backward graphs are kept, the least recently
// used dropped. Never freed, not even when the thread ends (the thread's map forgets it):
// destroying graphs at process exit could outlive the CUDA context. release_step_graphs()
// drops every thread's graphs and buffers.
struct StepGraphPool {
  static constexpr size_t kKeptSteps = 4;
  c10::DeviceIndex device;
  decltype(at::cuda::graph_pool_handle()) id;  // MempoolId_t (its namespace moved between torch versions)
  c10::cuda::CUDAStream capture_stream;
  // Held by the pool's thread while a loop uses it, and by release_step_graphs(), which may
  // run on another thread (autograd runs a CUDA backward on its own device thread).
  std::mutex mutex;
  cudaEvent_t done = nullptr;
  bool done_recorded = false;
  cudaStream_t done_stream = nullptr;
  std::unordered_set<std::string> seen;
  std::unordered_map<std::string, KeptStep<ForwardResult>> kept_forward;
  std::unordered_map<std::string, KeptStep<BackwardResult>> kept_backward;
  uint64_t uses = 0;
  // Graphs captured into `id` and alive. The caching allocator frees a private pool when its last
  // graph goes, and its id cannot be captured into again: a new id then.
  int graphs = 0;

  // A new id once no graph holds the pool (the caching allocator has freed it then).
  void renew_if_unused() {
    if (graphs == 0) id = at::cuda::graph_pool_handle();
  }

  void graph_gone() {
    --graphs;
    renew_if_unused();
  }

  // Destroys a captured step: its result first (back to the pool), then its graph.
  template <class Result>
  void drop(CapturedStep<Result>& step) {
    step.out = Result();
    if (step.graph) {
      step.graph.reset();  // an in-flight replay finishes first: cudaGraphExecDestroy defers
      graph_gone();
    }
  }

  template <class Result>
  std::unordered_map<std::string, KeptStep<Result>>& kept() {
    if constexpr (std::is_same_v<Result, ForwardResult>) {
      return kept_forward;
    } else {
      static_assert(std::is_same_v<Result, BackwardResult>, "a step graph returns a forward or a backward result");
      return kept_backward;
    }
  }

  // The kept step of `key`, made if new (then the least recently used other one of its kind
  // goes over the limit).
  template <class Result>
  KeptStep<Result>& keep(const std::string& key) {
    return cuda::keep_recent(kept<Result>(), key, uses, kKeptSteps,
                             [this](KeptStep<Result>& oldest) { drop(oldest.step); });
  }

  void drop_all() {
    for (auto& entry : kept_forward) drop(entry.second.step);
    for (auto& entry : kept_backward) drop(entry.second.step);
    kept_forward.clear();
    kept_backward.clear();
  }
};

StepGraphPool& step_graph_pool(c10::DeviceIndex device) {
  return cuda::thread_pool<StepGraphPool>(device, [](c10::DeviceIndex dev) {
    auto* pool = new StepGraphPool{dev, at::cuda::graph_pool_handle(),
                                   c10::cuda::getStreamFromPool(/*isHighPriority=*/false, dev)};
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&pool->done, cudaEventDisableTiming));
    return pool;
  });
}

// A step's convolutions, replayed: fn is captured into a CUDA graph (StepGraphPool) and
// replayed on the current stream at every later call, in this loop and the next loops of the
// same key (KeptStep). fn reads and writes only the buffers handed out by `buffer` (`input`,
// asserted, is one of them) and its results land in the graph's memory, so a replay computes
// what a call would, with the same kernels, for a few µs of host time instead of ATen's and
// cuDNN's ~30-60 µs per convolution (the eager loop was host-bound: 92 µs of wall time
// against 44 µs of kernels per step at B = 16, 16 x 16, K = 5 on an H100). The results are
// valid until the next replay.
// The capture comes at the first call where `key` (the calls' shapes and dtype, to which the
// device and cuDNN's switches are added here) has run plainly on this thread before, else at
// the second: the first plain call fills cuDNN's caches (benchmark mode's search cannot run
// inside a capture). Every call is a plain call, with fresh buffers, where the caller is
// capturing already (its graph holds the whole loop), where there are fewer than three calls,
// and where PyTorch's caching allocator is off (PYTORCH_NO_CUDA_MEMORY_CACHING, as under
// compute-sanitizer: a capture cannot allocate then). A capture that fails anyway is
// abandoned with a warning and the calls run plain.
template <class Result>
class StepGraph {
 public:
  StepGraph(int64_t calls, const std::string& key)
      : replay_(calls >= 3 && caching_allocator_on() &&
                c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None) {
    if (!replay_) return;
    at::Context& ctx = at::globalContext();
    device_ = c10::cuda::current_device();
    key_ = key;  // no std::ostream: seqkernels/error_format.h
    key_ += " device ";
    key_ += num(device_);
    key_ += " cudnn";
    for (const bool flag : {ctx.userEnabledCuDNN(), ctx.benchmarkCuDNN(), ctx.deterministicCuDNN(),
                            ctx.allowTF32CuDNN(at::Float32Op::CONV), ctx.deterministicAlgorithms()}) {
      key_ += flag ? " 1" : " 0";
    }
    pool_ = &step_graph_pool(device_);
    lock_ = std::unique_lock<std::mutex>(pool_->mutex);
    seen_ = pool_->seen.count(key_) > 0;
    replay_stream_ = c10::cuda::getCurrentCUDAStream(device_).stream();
    kept_ = &pool_->keep<Result>(key_);
    // The kept buffers and the pool's memory were last used by work on another stream.
    if (pool_->done_recorded && pool_->done_stream != replay_stream_) {
      C10_CUDA_CHECK(cudaStreamWaitEvent(replay_stream_, pool_->done, 0));
    }
  }

  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  ~StepGraph() {
    if (!replayed_) return;
    C10_CUDA_CHECK_WARN(cudaEventRecord(pool_->done, replay_stream_));
    pool_->done_recorded = true;
    pool_->done_stream = replay_stream_;
  }

  // A buffer for fn: the kept one (made at the key's first call, or again where the sizes,
  // dtype or format differ, which drops the kept graph) or, when nothing replays, a fresh one.
  Tensor buffer(at::IntArrayRef sizes, const at::TensorOptions& options, at::MemoryFormat format) {
    if (!kept_) return at::empty(sizes, options.memory_format(format));
    const size_t index = next_buffer_++;
    if (index < kept_->buffers.size()) {
      const Tensor& b = kept_->buffers[index];
      if (b.sizes() == sizes && b.dtype() == options.dtype() && b.is_contiguous(format)) {
        // Used on another stream than its own: the caching allocator must not hand the block
        // to its own stream's next allocation before this stream's work on it is done (the
        // buffer is freed later, with its KeptStep).
        if (replay_stream_ != kept_->buffers_stream) {
          c10::cuda::CUDACachingAllocator::recordStream(b.storage().data_ptr(),
                                                         c10::cuda::getCurrentCUDAStream(device_));
        }
        return b;
      }
      kept_->buffers.resize(index);
      pool_->drop(kept_->step);
    }
    if (index == 0) kept_->buffers_stream = replay_stream_;
    kept_->buffers.push_back(at::empty(sizes, options.memory_format(format)));
    return kept_->buffers.back();
  }

  // The parts side by side along the input channels ([G, sum of their channels, KH, KW]),
  // channels-last, as cuDNN's NHWC convolution reads them without a copy (AtenConvolution's
  // to_nhwc): copied into a buffer every call (the copies staged), so a replay reads this call's
  // weights whatever changed them (`.data` included).
  Tensor weights(at::TensorList parts, convlstm_detail::CopyList& staging) {
    std::vector<int64_t> sizes = parts[0].sizes().vec();
    sizes[1] = 0;
    for (const Tensor& part : parts) sizes[1] += part.size(1);
    Tensor w = buffer(sizes, parts[0].options(), at::MemoryFormat::ChannelsLast);
    int64_t offset = 0;
    for (const Tensor& part : parts) {
      staging.emplace_back(w.narrow(1, offset, part.size(1)), part);
      offset += part.size(1);
    }
    return w;
  }

  template <class F>
  Result operator()(const void* input, F&& fn) {
    if (!replay_) return fn();
    CapturedStep<Result>& step = kept_->step;
    if (!step.graph) {
      if (!seen_) {  // the first call of this key on this thread
        Result out = fn();
        pool_->seen.insert(key_);
        seen_ = true;
        return out;
      }
      if (!capture(input, fn)) return fn();
    }
    TORCH_INTERNAL_ASSERT(input == step.input, "seqkernels.convlstm: a replayed step convolution changed its input");
    step.graph->replay();
    replayed_ = true;
    return step.out;
  }

 private:
  // PyTorch's own test of the variable: set and not "0".
  static bool caching_allocator_on() {
    const char* v = std::getenv("PYTORCH_NO_CUDA_MEMORY_CACHING");
    return v == nullptr || std::string(v) == "0";
  }

  // Captures fn; false (and plain calls from then on) if the capture failed.
  template <class F>
  bool capture(const void* input, F& fn) {
    StepGraphPool& pool = *pool_;
    CapturedStep<Result>& step = kept_->step;
    auto graph = std::make_unique<at::cuda::CUDAGraph>();
    {
      const c10::cuda::CUDAStreamGuard on_capture_stream(pool.capture_stream);
      // Thread-local: another thread's CUDA calls do not invalidate this capture.
      graph->capture_begin(pool.id, cudaStreamCaptureModeThreadLocal);
      try {
        step.out = fn();
      } catch (const std::exception& e) {  // leave the stream and the allocator as they were
        cudaGraph_t partial = nullptr;
        (void)cudaStreamEndCapture(pool.capture_stream.stream(), &partial);
        if (partial) (void)cudaGraphDestroy(partial);
        (void)cudaGetLastError();
        c10::cuda::CUDACachingAllocator::endAllocateToPool(device_, pool.id);
        c10::cuda::CUDACachingAllocator::releasePool(device_, pool.id);
        pool.renew_if_unused();  // the released pool is gone unless a kept graph holds it
        step.out = Result();
        replay_ = false;
        TORCH_WARN_ONCE("seqkernels.convlstm: capturing a step convolution in a CUDA graph failed (", e.what(),
                        "); the steps call it directly instead");
        return false;
      }
      graph->capture_end();
    }
    // An earlier graph of this pool may still be replaying on another stream: its freed memory
    // is this graph's now.
    if (pool.done_recorded) C10_CUDA_CHECK(cudaStreamWaitEvent(replay_stream_, pool.done, 0));
    step.graph = std::move(graph);
    step.input = input;
    ++pool.graphs;
    return true;
  }

  bool replay_;
  bool seen_ = false;
  bool replayed_ = false;
  c10::DeviceIndex device_ = 0;
  std::string key_;
  StepGraphPool* pool_ = nullptr;
  KeptStep<Result>* kept_ = nullptr;  // the pool's entry of the key (where calls replay)
  size_t next_buffer_ = 0;
  cudaStream_t replay_stream_ = nullptr;
  std::unique_lock<std::mutex> lock_;  // the pool's, until the destructor's body has run
};

// Drops every thread's kept step graphs and their buffers, on every device (waiting for a loop
// that is using them to end), the LSTM's replayed loops' too: seqkernels.release_step_graphs().
// Their memory goes back to PyTorch's caching allocator.
void release_step_graphs() {
  cuda::release_lstm_step_graphs();
  cuda::release_all_pools<StepGraphPool>([](StepGraphPool& pool) { pool.drop_all(); });
}

struct CudaPointwise {
  static void check(const Tensor& x) {
    TORCH_CHECK(x.is_cuda(), "seqkernels.convlstm: CUDA kernel called with a tensor on ", x.device());
  }

  static constexpr bool kStridedDy = true;  // read through the tile: no per-step copy
  // One step per backward chunk (convlstm_loop.h): each step's convolutions, the weight
  // gradients included, replay as one graph, and one step's dL/dz is all the loop holds.
  static constexpr int64_t kChunkPixels = 1;
  // Inference: every step's frames in one group (one convolution, replayed from the step's graph).
  static constexpr int64_t kInferenceGroupPixels = std::numeric_limits<int64_t>::max() / 2;
  template <class Result>
  using StepCall = StepGraph<Result>;

  using Convolution = convlstm_detail::AtenConvolution;  // cuDNN's

  static void copy_all(const convlstm_detail::CopyList& staging) { copy_all_cuda(staging); }

  template <class scalar_t>
  static void forward_step(const ConvLstmForwardStep<scalar_t>& s) {
    if (s.peep) launch_forward<true>(s);
    else launch_forward<false>(s);
  }

  template <class scalar_t>
  static void backward_step(const ConvLstmBackwardStep<scalar_t>& s) {
    const TileGrid g = tile_grid(s.B * s.P, (s.C + kTile - 1) / kTile);
    const dim3 block(kTile, kRows);
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    if (s.peep) backward_kernel<true><<<g.grid, block, 0, stream>>>(s, g.pixel_tiles);
    else backward_kernel<false><<<g.grid, block, 0, stream>>>(s, g.pixel_tiles);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
};

// The kernels launch on the current device: make it x's before anything runs.
void require_cuda(const Tensor& x) {
  TORCH_CHECK(x.defined() && x.is_cuda(), "seqkernels.convlstm: x must be a CUDA tensor for the CUDA kernel");
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> convlstm_forward_cuda(
    const Tensor& x, const Tensor& h0, const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh,
    const std::optional<Tensor>& bias, const std::optional<Tensor>& peephole, bool training) {
  require_cuda(x);
  const c10::cuda::CUDAGuard guard(x.device());
  return convlstm_forward_loop<CudaPointwise>(x, h0, c0, w_ih, w_hh, bias, peephole, training);
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> convlstm_backward_cuda(
    const std::optional<Tensor>& grad_y, const std::optional<Tensor>& grad_h_n, const std::optional<Tensor>& grad_c_n,
    const Tensor& x, const Tensor& h0, const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh,
    const std::optional<Tensor>& peephole, const Tensor& y, const Tensor& gates, const Tensor& cells, bool has_bias) {
  require_cuda(x);
  const c10::cuda::CUDAGuard guard(x.device());
  return convlstm_backward_loop<CudaPointwise>(grad_y, grad_h_n, grad_c_n, x, h0, c0, w_ih, w_hh, peephole, y, gates,
                                               cells, has_bias);
}

}  // namespace
}  // namespace seqkernels

TORCH_LIBRARY_FRAGMENT(seqkernels, m) {
  // No tensor arguments: a catch-all kernel. Only CUDA builds have it (seqkernels.release_step_graphs).
  m.def("release_step_graphs() -> ()", &seqkernels::release_step_graphs);
}

TORCH_LIBRARY_IMPL(seqkernels, CUDA, m) {
  m.impl("convlstm_forward", &seqkernels::convlstm_forward_cuda);
  m.impl("convlstm_backward", &seqkernels::convlstm_backward_cuda);
}
