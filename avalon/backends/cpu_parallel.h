// Work split over XLA's intra-op threads, for the FFI kernels beside this file.
#ifndef AVALON_BACKENDS_CPU_PARALLEL_H_
#define AVALON_BACKENDS_CPU_PARALLEL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace avalon {

// Runs fn(part) for every part in [0, parts) on the calling thread and on the workers of XLA's
// intra-op pool, and returns when all are done. The caller takes parts too, so it finishes
// alone if no worker is free (no deadlock when the pool is busy); a task that starts after
// every part is taken returns at once (its state is shared, not on this stack).
template <typename F>
void ParallelFor(xla::ffi::ThreadPool& pool, int64_t parts, const F& fn) {
  if (parts <= 1) {
    if (parts == 1) fn(0);
    return;
  }
  struct Shared {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
  };
  auto shared = std::make_shared<Shared>();
  auto work = [shared, parts, fn]() {
    for (int64_t p = shared->next.fetch_add(1); p < parts; p = shared->next.fetch_add(1)) {
      fn(p);
      shared->done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int64_t t = 1; t < parts; ++t) pool.Schedule([work]() { work(); });
  work();
  while (shared->done.load(std::memory_order_acquire) < parts) std::this_thread::yield();
}

}  // namespace avalon

#endif  // AVALON_BACKENDS_CPU_PARALLEL_H_
