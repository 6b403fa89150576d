// Large CPU buffers on transparent huge pages, where the OS offers them on request.
//
// An LSTM call's big buffers (y, the saved gates and cells, the backward's dL/dz: 134 MB each
// for gates and dL/dz at T = 256, B = 64, H = 512) are fresh mmaps on every call: glibc serves
// allocations above its mmap threshold (32 MB at most) that way, and PyTorch's CPU allocator
// keeps nothing. Their first touch then faults in every 4 KB page: page faults were ~6% of a
// B = 64, H = 512 `train` call on the 2-core AVX-512 EPYC (perf: exc_page_fault 3.1%,
// clear_page_erms 2.0%, the rest of the fault path ~1.5%). Advised before that first touch,
// such a buffer takes 2 MB pages where the kernel's transparent huge pages are on
// ("always" or "madvise"): 512 times fewer faults for the same bytes. Advice only: where it
// is refused or THP is off, nothing changes. SEQKERNELS_CPU_HUGE_PAGES=0 turns it off (a
// diagnostic switch for A/B runs).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace seqkernels::cpu {

constexpr size_t kHugePageBytes = size_t(2) << 20;
constexpr size_t kHugePagesMinBytes = 8 * kHugePageBytes;  // smaller buffers: too few faults to matter

inline bool huge_pages_requested() {
  const char* env = std::getenv("SEQKERNELS_CPU_HUGE_PAGES");
  return env == nullptr || std::strcmp(env, "0") != 0;
}

// Asks for huge pages over the whole 2 MB pages inside t's memory; call it before t is first
// written. Returns t.
inline const at::Tensor& on_huge_pages(const at::Tensor& t) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const size_t bytes = t.nbytes();
  if (bytes < kHugePagesMinBytes || !huge_pages_requested()) return t;
  const auto begin = reinterpret_cast<uintptr_t>(t.data_ptr());
  const uintptr_t first = (begin + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
  const uintptr_t last = (begin + bytes) & ~(kHugePageBytes - 1);
  if (last > first) (void)madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
#endif
  return t;
}

}  // namespace seqkernels::cpu
