// Replaying a time loop's steps from kept CUDA graphs, for the loops that launch kernels per
// step (lstm.cu's cuBLAS loop, lstm_fused_step.cu's fused loop).
//
// Eager, such a loop is host-bound at small batches: the host spends more time launching a
// step than the device spends running it (docs/benchmarks.md). So where it applies, a call
// captures kReplaySteps steps into one CUDA graph once, keeps it for later calls of the same
// key, and launches it T / kReplaySteps times; the remaining T % kReplaySteps steps run eagerly
// with the same kernels. A captured graph fixes its kernels' arguments, so:
//  - what a step reads or writes at a fixed place (state buffers, packed weights, GEMM
//    workspace) lives in the key's kept buffers (ReplayedSteps::buffer);
//  - the call's own pointers (its inputs and outputs) and the step counter are in kept device
//    memory that the call's first launch writes (replay_store_args_kernel, or a loop's own
//    prologue), and each chunk ends with a one-thread kernel that advances the counter.
// It applies with equal batch sizes (a ragged PackedSequence too where the loop's step kernels
// read their rows from a table: the cuBLAS loop's, `ragged`), T >= kReplaySteps, and when the
// caller is not capturing a CUDA graph itself (its graph holds the plain loop then); the cuBLAS
// loop replays projected steps too (the fused loop takes no projection). Nothing is allocated inside a capture, so it also runs with the caching
// allocator off (compute-sanitizer). The kept graphs of every thread and device go with
// release_lstm_step_graphs() (lstm_loop.cuh).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <iterator>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "kept_pools.cuh"
#include "seqkernels/lstm_checks.h"

namespace seqkernels::cuda {

constexpr int kReplaySteps = 16;  // also lstm_loop.cuh's bound for its rules on ragged sequences

inline bool replay_applies(const LstmSizes& s, bool ragged = false) {
  return s.B > 0 && s.H > 0 && s.T >= kReplaySteps && (ragged || all_steps_full(s)) &&
         c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None;
}

// A chunk's last node: the next chunk starts `steps` later. (A template only so that the
// header can define it in every file that includes it.)
template <class Int>
__global__ void replay_advance_kernel(Int* step, Int steps) {
  *step += steps;
}

// The times a replayed step works on, for a call with equal batch sizes: t, the step's own, and
// prev_t, the forward step's whose state it continues (t - 1; t + 1 in the reverse direction),
// which exists unless t is the sequence's first step.
struct ReplayedTimes {
  int64_t t;
  int64_t prev_t;
  bool has_prev;
};

// Processing step `step` of a forward: time step, or T - 1 - step in the reverse direction.
__device__ __forceinline__ ReplayedTimes replayed_forward_times(int64_t step, int64_t T, bool reverse) {
  const int64_t t = reverse ? T - 1 - step : step;
  return {t, reverse ? t + 1 : t - 1, step > 0};
}

// Processing step `step` of a backward, which walks the forward's order in reverse.
__device__ __forceinline__ ReplayedTimes replayed_backward_times(int64_t step, int64_t T, bool reverse) {
  const int64_t t = reverse ? step : T - 1 - step;
  return {t, reverse ? t + 1 : t - 1, reverse ? t + 1 < T : t > 0};
}

// A replayed call's first launch where it has no other: the call's arguments into kept memory.
template <class Args>
__global__ void replay_store_args_kernel(Args* out, Args args) {
  *out = args;
}

// One key's captured chunk and the buffers it reads and writes.
struct ReplayEntry {
  std::vector<at::Tensor> buffers;            // made at the key's first call, in the order the loop asks
  cudaStream_t buffers_stream = nullptr;  // the stream they were allocated on
  cudaGraphExec_t chunk = nullptr;        // kReplaySteps steps and the counter's advance
  bool capture_failed = false;            // then the plain loop runs, for every call of the key
  uint64_t last_use = 0;

  void release() {
    // An in-flight launch completes first: cudaGraphExecDestroy frees it asynchronously.
    if (chunk != nullptr) (void)cudaGraphExecDestroy(chunk);
    chunk = nullptr;
    buffers.clear();
  }
};

// The replayed loops of one thread on one device. `done`, recorded on the stream of the last
// call, orders a call on another stream after it (the kept buffers are reused). One per thread and device
// (kept_pools.cuh's thread_pool), never freed: see release_lstm_step_graphs().
struct ReplayPool {
  static constexpr size_t kKept = 16;  // entries, the least recently used dropped
  c10::DeviceIndex device;
  c10::cuda::CUDAStream capture_stream;
  std::mutex mutex;  // held by a call using the pool, and by release_lstm_step_graphs()
  cudaEvent_t done = nullptr;
  cudaStream_t done_stream = nullptr;  // nullptr until a call has recorded `done`
  std::unordered_map<std::string, ReplayEntry> entries;
  uint64_t uses = 0;
  // Buffers that several keys' graphs read (ReplayedSteps::shared_buffer), by name, with the
  // stream they were allocated on. Each user entry holds the tensor too; one held by nothing
  // else is dropped when an entry goes.
  struct Shared {
    at::Tensor tensor;
    cudaStream_t stream = nullptr;
  };
  std::unordered_map<std::string, Shared> shared;

  ReplayEntry& entry(const std::string& key) {
    return cuda::keep_recent(entries, key, uses, kKept, [this](ReplayEntry& oldest) {
      oldest.release();
      prune_shared();
    });
  }

  void prune_shared() {
    for (auto it = shared.begin(); it != shared.end();) {
      it = it->second.tensor.use_count() == 1 ? shared.erase(it) : std::next(it);
    }
  }

  void release_all() {
    for (auto& kv : entries) kv.second.release();
    entries.clear();
    shared.clear();
  }
};

inline ReplayPool& replay_pool(c10::DeviceIndex device) {
  return thread_pool<ReplayPool>(device, [](c10::DeviceIndex dev) {
    // A stream of its own: a pool stream may carry another thread's work, which a capture
    // on it would take in.
    cudaStream_t capture_stream = nullptr;
    {
      const c10::cuda::CUDAGuard on_device(dev);
      C10_CUDA_CHECK(cudaStreamCreateWithFlags(&capture_stream, cudaStreamNonBlocking));
    }
    auto* pool = new ReplayPool{dev, c10::cuda::getStreamFromExternal(capture_stream, dev)};
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&pool->done, cudaEventDisableTiming));
    return pool;
  });
}

// The kept entry a replayed call uses, for the call's duration (the pool locked).
class ReplayedSteps {
 public:
  // `loop` names the replayed loop in the warning of a failed capture ("the cuBLAS loop's").
  ReplayedSteps(const std::string& key, const char* loop)
      : loop_(loop),
        device_(c10::cuda::current_device()),
        pool_(&replay_pool(device_)),
        lock_(pool_->mutex),
        stream_(c10::cuda::getCurrentCUDAStream(device_)),
        entry_(&pool_->entry(key)) {
    if (pool_->done_stream != nullptr && pool_->done_stream != stream_.stream()) {
      C10_CUDA_CHECK(cudaStreamWaitEvent(stream_.stream(), pool_->done, 0));
    }
  }
  ReplayedSteps(const ReplayedSteps&) = delete;
  ReplayedSteps& operator=(const ReplayedSteps&) = delete;
  ~ReplayedSteps() {
    C10_CUDA_CHECK_WARN(cudaEventRecord(pool_->done, stream_.stream()));
    pool_->done_stream = stream_.stream();
  }

  bool capture_failed() const { return entry_->capture_failed; }
  bool captured() const { return entry_->chunk != nullptr; }
  cudaStream_t stream() const { return stream_.stream(); }
  const c10::cuda::CUDAStream& capture_stream() const { return pool_->capture_stream; }

  // The entry's index-th buffer (the same sizes for every call of a key).
  at::Tensor buffer(size_t index, at::IntArrayRef sizes, const at::TensorOptions& options) {
    const at::Tensor& b = kept_buffer(index, sizes, [&] { return at::empty(sizes, options); });
    record_use(b, entry_->buffers_stream);
    return b;
  }

  // The entry's index-th buffer as buffer(), but one buffer per `name` across the pool's keys
  // (the x3 steps' split W_hh, which a layer's training and inference graphs both read).
  at::Tensor shared_buffer(size_t index, const std::string& name, at::IntArrayRef sizes,
                           const at::TensorOptions& options) {
    const at::Tensor& b = kept_buffer(index, sizes, [&] {
      auto it = pool_->shared.find(name);
      if (it == pool_->shared.end() || !it->second.tensor.sizes().equals(sizes)) {
        pool_->shared[name] = ReplayPool::Shared{at::empty(sizes, options), stream_.stream()};
        it = pool_->shared.find(name);
      }
      return it->second.tensor;
    });
    const auto it = pool_->shared.find(name);
    TORCH_INTERNAL_ASSERT(it != pool_->shared.end() && it->second.tensor.is_same(b),
                          "seqkernels.lstm: a replayed loop's shared buffer changed");
    record_use(b, it->second.stream);
    return b;
  }

  // The captured GEMM's workspace, what its plan needs, as the entry's last buffer; false (and
  // the plain loop for the key) without a cuBLASLt algorithm.
  template <class Gemm, class A, class B, class C>
  bool give_workspace(Gemm& gemm, int64_t M, const A* a, const B* b, const C* c) {
    const size_t index = entry_->buffers.size();  // after the loop's own buffers
    const int64_t bytes = gemm.plan_workspace(M, a, b, c);
    if (bytes < 0) {
      fail("no cuBLASLt algorithm for the step GEMM");
      return false;
    }
    at::Tensor workspace = buffer(index, {bytes}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA, device_));
    gemm.set_workspace(bytes > 0 ? workspace.data_ptr() : nullptr, static_cast<size_t>(bytes));
    return true;
  }

  // Captures one chunk: `record` issues it on the current stream, which must be
  // capture_stream(). False, with a warning and the plain loop for the key from then on, if
  // the capture fails.
  template <class F>
  bool capture(F&& record) {
    const cudaStream_t cs = pool_->capture_stream.stream();
    TORCH_INTERNAL_ASSERT(c10::cuda::getCurrentCUDAStream(device_).stream() == cs);
    // Thread-local: other threads' CUDA calls do not invalidate this capture.
    C10_CUDA_CHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
    cudaGraph_t graph = nullptr;
    try {
      record();
    } catch (const std::exception& e) {  // leave the stream as it was
      (void)cudaStreamEndCapture(cs, &graph);
      if (graph != nullptr) (void)cudaGraphDestroy(graph);
      (void)cudaGetLastError();
      fail(e.what());
      return false;
    }
    C10_CUDA_CHECK(cudaStreamEndCapture(cs, &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
    (void)cudaGraphDestroy(graph);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      fail(cudaGetErrorString(status));
      return false;
    }
    entry_->chunk = exec;
    return true;
  }

  // No cuBLASLt algorithm for a step GEMM, or a failed capture: the plain loop for this key.
  void fail(const char* why) {
    entry_->release();
    pool_->prune_shared();
    entry_->capture_failed = true;
    TORCH_WARN_ONCE("seqkernels.lstm: replaying ", loop_, " steps from a CUDA graph failed (", why,
                    "); those calls run the steps directly");
  }

  // capture() of one chunk: record_steps(stream) issues kReplaySteps steps on the capture
  // stream, then the one-thread kernel that advances the step counter by kReplaySteps.
  template <class F>
  bool capture_chunk(int64_t* counter, F&& record_steps) {
    return capture([&] {
      const cudaStream_t cs = pool_->capture_stream.stream();
      record_steps(cs);
      replay_advance_kernel<<<1, 1, 0, cs>>>(counter, int64_t{kReplaySteps});
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }

  void launch_chunks(int64_t chunks) {
    for (int64_t i = 0; i < chunks; ++i) C10_CUDA_CHECK(cudaGraphLaunch(entry_->chunk, stream_.stream()));
  }

 private:
  // The entry's index-th buffer, made by make() (on the call's stream, what buffers_stream says,
  // whichever stream is current) the first time it is asked for.
  template <class Make>
  const at::Tensor& kept_buffer(size_t index, at::IntArrayRef sizes, Make&& make) {
    if (index == entry_->buffers.size()) {
      const c10::cuda::CUDAStreamGuard on_call_stream(stream_);
      if (index == 0) entry_->buffers_stream = stream_.stream();
      entry_->buffers.push_back(make());
    }
    TORCH_INTERNAL_ASSERT(index < entry_->buffers.size() && entry_->buffers[index].sizes() == sizes,
                          "seqkernels.lstm: a replayed loop's buffers are asked for out of order");
    return entry_->buffers[index];
  }
  // A buffer used on another stream than the one it was allocated on: the caching allocator must
  // not hand the block to that stream's next allocation before this stream's work on it is done.
  void record_use(const at::Tensor& b, cudaStream_t allocated_on) const {
    if (stream_.stream() != allocated_on) {
      c10::cuda::CUDACachingAllocator::recordStream(b.storage().data_ptr(), stream_);
    }
  }

  const char* loop_;
  c10::DeviceIndex device_;
  ReplayPool* pool_;
  std::unique_lock<std::mutex> lock_;
  c10::cuda::CUDAStream stream_;
  ReplayEntry* entry_;
};

}  // namespace seqkernels::cuda
