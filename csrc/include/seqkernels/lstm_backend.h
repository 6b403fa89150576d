// The LSTM time loop a user asked for: SEQKERNELS_LSTM_BACKEND, read on every call, shared
// by the CPU and CUDA operators (docs/kernels.md).
#pragma once

namespace seqkernels {

enum class LstmBackend {
  kAuto,        // the device's heuristic picks (default)
  kPersistent,  // the persistent loop wherever it applies
  kGemm,        // the GEMM loop: never the persistent or fused-step loop ("gemm" or "cublas")
  kFused,       // CUDA: the fused-step loop wherever it applies; the CPU has no such loop and
                // runs its GEMM loop
};

// Raises (TORCH_CHECK) on any other value.
LstmBackend lstm_backend_from_env();

}  // namespace seqkernels
