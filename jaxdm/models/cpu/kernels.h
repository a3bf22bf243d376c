// What jaxdm's XLA:CPU FFI kernels (attention.cc, matmul.cc) share: AMX tile set-up and
// spreading work items over XLA's intra-op thread pool.
#pragma once

#include <immintrin.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include <sys/syscall.h>
#include <unistd.h>

#include "xla/ffi/api/ffi.h"

namespace jaxdm {

// Whether the kernels may use AMX tiles where compiled for them (JAXDM_CPU_AMX, set from
// Python through JaxdmSetAmx): off, they take their AVX-512 BF16 paths, as on CPUs without AMX.
inline std::atomic<bool>& amx_wanted() {
  static std::atomic<bool> wanted{true};
  return wanted;
}

// Linux hands AMX tile state to a process only on request (once per process).
inline bool amx_allowed() {
  static const bool ok = [] {
    constexpr int kReqXcompPerm = 0x1023, kXtileData = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
  }();
  return amx_wanted().load(std::memory_order_relaxed) && ok;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Items [0, n_items) are claimed from a shared counter by the calling thread and by up to
// `threads - 1` tasks on XLA's intra-op pool; returns once every item is done (a task that
// starts late finds none left: the shared state outlives the call). `run(i)` must be safe to
// call from any thread.
inline void run_items(xla::ffi::ThreadPool& pool, int64_t n_items, std::function<void(int64_t)> run) {
  if (n_items <= 0) return;
  struct Shared {
    std::function<void(int64_t)> run;
    int64_t n_items;
    std::atomic<int64_t> next{0}, done{0};
    void work() {
      for (int64_t i; (i = next.fetch_add(1)) < n_items;) {
        run(i);
        done.fetch_add(1, std::memory_order_release);
      }
    }
  };
  auto shared = std::make_shared<Shared>();
  shared->run = std::move(run);
  shared->n_items = n_items;
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t helpers = std::min<int64_t>(threads, n_items) - 1;
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([shared] { shared->work(); });
  shared->work();
  while (shared->done.load(std::memory_order_acquire) < n_items) _mm_pause();
}

}  // namespace jaxdm
