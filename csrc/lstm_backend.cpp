#include "seqkernels/lstm_backend.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <string>

namespace seqkernels {

LstmBackend lstm_backend_from_env() {
  const char* env = std::getenv("SEQKERNELS_LSTM_BACKEND");
  const std::string backend = env ? env : "auto";
  if (backend == "auto") return LstmBackend::kAuto;
  if (backend == "persistent") return LstmBackend::kPersistent;
  if (backend == "gemm" || backend == "cublas") return LstmBackend::kGemm;
  if (backend == "fused") return LstmBackend::kFused;
  TORCH_CHECK(false, "SEQKERNELS_LSTM_BACKEND must be auto, persistent, fused, gemm or cublas, got '", backend, "'");
}

}  // namespace seqkernels
