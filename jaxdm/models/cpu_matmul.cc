// bf16 matmul on AMX tiles for XLA:CPU, called through XLA's FFI (jaxdm.models.cpu_matmul).
//
// Why: XLA:CPU's bf16 dots (fp32 results) ran 1.7-3.3x slower than oneDNN's at the readout's
// shapes on this CPU (issue 17).
//
// Operands: x [..., K] bf16 (leading dims flattened to M rows), w [K, N] bf16, row major;
// K and N multiples of 32. Result [..., N] f32: products of bf16 pairs accumulated in f32.
//
// Work: w is packed into 16-column panels of bf16 pairs (a tile's B operand, [K/2][16][2]),
// split over the threads. Then each item takes 128 rows of x and one of the threads' column
// ranges: 32 rows at a time, it packs x's rows into 16 x 32 tiles (contiguous 1 KB loads) and
// computes 32 x 32 blocks of the result in four accumulator tiles over the whole of K.

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_kernels.h"

namespace ffi = xla::ffi;

namespace {

#ifdef __AMX_BF16__
// w [K, N] columns [j0, j0 + cols) -> panels of 16 columns, each [K/2][16][2].
void pack_w(const uint16_t* w, int64_t k, int64_t n, int64_t j0, int64_t cols, uint16_t* out) {
  for (int64_t p = 0; p < cols / 16; ++p) {
    uint16_t* panel = out + p * k * 16;
    const uint16_t* src = w + j0 + p * 16;
    for (int64_t kk = 0; kk < k; kk += 2) {
      const uint16_t* r0 = src + kk * n;
      const uint16_t* r1 = r0 + n;
      uint16_t* o = panel + kk * 16;
      // interleave 16 columns of two rows: (r0[j], r1[j]) pairs
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1));
      const __m256i lo = _mm256_unpacklo_epi16(a, b), hi = _mm256_unpackhi_epi16(a, b);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), _mm256_permute2x128_si256(lo, hi, 0x20));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 16),
                          _mm256_permute2x128_si256(lo, hi, 0x31));
    }
  }
}

// x rows [i0, i0 + rows) -> tiles [rows/16][K/32][16][32]; rows past m are zeros.
void pack_x(const uint16_t* x, int64_t m, int64_t k, int64_t i0, int64_t rows, uint16_t* out) {
  for (int64_t s = 0; s < rows / 16; ++s)
    for (int r = 0; r < 16; ++r) {
      const int64_t row = i0 + s * 16 + r;
      uint16_t* dst = out + s * k * 16 + r * 32;
      if (row >= m) {
        for (int64_t kk = 0; kk < k; kk += 32) std::memset(dst + kk * 16, 0, 64);
        continue;
      }
      const uint16_t* src = x + row * k;
      for (int64_t kk = 0; kk < k; kk += 32) std::memcpy(dst + kk * 16, src + kk, 64);
    }
}

struct Problem {
  const uint16_t* x;
  const uint16_t* w;
  uint16_t* wp;  // w packed: [N/16] panels of [K/2][16][2]
  float* out;
  int64_t m, k, n;
  int64_t n_ranges, chunks;
};

constexpr int64_t kStripsPerChunk = 4;  // 32-row strips of x per work item

// Item i: rows chunk i / n_ranges, columns range i % n_ranges.
void compute_item(const Problem& pb, int64_t item) {
  const int64_t blocks = pb.n / 32;
  const int64_t nr = item % pb.n_ranges, chunk = item / pb.n_ranges;
  const int64_t j_lo = blocks * nr / pb.n_ranges * 32, j_hi = blocks * (nr + 1) / pb.n_ranges * 32;
  const int64_t s_lo = chunk * kStripsPerChunk;
  const int64_t s_hi = std::min((pb.m + 31) / 32, s_lo + kStripsPerChunk);
  const int64_t k = pb.k, n = pb.n;
  thread_local std::vector<uint16_t> xp;
  alignas(64) float buf[32 * 32];
  xp.resize(32 * k);
  // result rows start 64-byte aligned when the buffer does (N is a multiple of 32)
  const bool aligned = reinterpret_cast<uintptr_t>(pb.out) % 64 == 0;
  jaxdm::TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  _tile_loadconfig(&cfg);
  const int64_t strip = k * 16;  // elements of one 16-row half of xp / one 16-column panel
  const uint16_t* a0 = xp.data();
  const uint16_t* a1 = a0 + strip;
  // Rows outer: a 32-row strip of x (packed, L1/L2) meets every column block of the range
  // (packed w, L2).
  for (int64_t s = s_lo; s < s_hi; ++s) {
    const int64_t row = s * 32;
    pack_x(pb.x, pb.m, k, row, 32, xp.data());
    for (int64_t j = j_lo; j < j_hi; j += 32) {
      const uint16_t* p0 = pb.wp + j * k;
      const uint16_t* p1 = p0 + strip;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t kk = 0; kk < k; kk += 32) {
        // w's tiles two steps ahead into L1 (past the pair's end: the next pair's, read next;
        // a prefetch never faults): tile loads wait for the tile's previous reader to finish,
        // so an L2 latency per step would not be hidden.
        const char* f0 = reinterpret_cast<const char*>(p0 + (kk + 2 * 32) * 16);
        const char* f1 = reinterpret_cast<const char*>(p1 + (kk + 2 * 32) * 16);
        for (int line = 0; line < 16; ++line) {
          _mm_prefetch(f0 + line * 64, _MM_HINT_T0);
          _mm_prefetch(f1 + line * 64, _MM_HINT_T0);
        }
        _tile_loadd(6, p0 + kk * 16, 64);
        _tile_loadd(4, a0 + kk * 16, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, p1 + kk * 16, 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, a1 + kk * 16, 64);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      // Through a 32 x 32 buffer (L1), then streamed out: no read of the result's lines
      // before they are written (1.1-1.4x on the whole matmul at the readout's shapes).
      _tile_stored(0, buf, 128);
      _tile_stored(1, buf + 16, 128);
      _tile_stored(2, buf + 16 * 32, 128);
      _tile_stored(3, buf + 16 * 32 + 16, 128);
      float* o = pb.out + row * n + j;
      const int64_t valid = std::min<int64_t>(32, pb.m - row);
      if (aligned) {
        for (int64_t r = 0; r < valid; ++r) {
          _mm512_stream_ps(o + r * n, _mm512_load_ps(buf + r * 32));
          _mm512_stream_ps(o + r * n + 16, _mm512_load_ps(buf + r * 32 + 16));
        }
      } else {
        for (int64_t r = 0; r < valid; ++r) std::memcpy(o + r * n, buf + r * 32, 32 * sizeof(float));
      }
    }
  }
  _tile_release();
  _mm_sfence();  // the streamed stores are visible before the item counts as done
}
#endif  // __AMX_BF16__

ffi::Error Matmul(ffi::ThreadPool pool, ffi::Buffer<ffi::BF16> x, ffi::Buffer<ffi::BF16> w,
                  ffi::ResultBuffer<ffi::F32> out) {
#ifndef __AMX_BF16__
  return ffi::Error::Internal("jaxdm cpu_matmul was built without AMX");
#else
  if (!jaxdm::amx_allowed()) return ffi::Error::Internal("the kernel refused AMX tile state");
  const auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() < 1 || wd.size() != 2) return ffi::Error::InvalidArgument("x must be [..., K], w [K, N]");
  Problem pb;
  pb.k = wd[0];
  pb.n = wd[1];
  if (xd.back() != pb.k) return ffi::Error::InvalidArgument("x's last dim must be w's K");
  if (pb.k % 32 != 0 || pb.n % 32 != 0)
    return ffi::Error::InvalidArgument("K and N must be multiples of 32");
  pb.m = pb.k ? static_cast<int64_t>(x.element_count()) / pb.k : 0;
  if (out->element_count() != static_cast<size_t>(pb.m * pb.n))
    return ffi::Error::InvalidArgument("result must be [..., N]");
  if (pb.m == 0 || pb.n == 0) return ffi::Error::Success();
  if (pb.k == 0) {
    std::memset(out->typed_data(), 0, pb.m * pb.n * sizeof(float));
    return ffi::Error::Success();
  }
  pb.x = reinterpret_cast<const uint16_t*>(x.typed_data());
  pb.w = reinterpret_cast<const uint16_t*>(w.typed_data());
  pb.out = out->typed_data();
  thread_local std::vector<uint16_t> wp;  // the calling thread's: helpers only read it
  wp.resize(pb.k * pb.n);
  pb.wp = wp.data();
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t panels = pb.n / 16;
  const int64_t pack_items = std::min<int64_t>(threads, panels);
  jaxdm::run_items(pool, pack_items, [&pb, panels, pack_items](int64_t i) {
    const int64_t p_lo = panels * i / pack_items, p_hi = panels * (i + 1) / pack_items;
    pack_w(pb.w, pb.k, pb.n, p_lo * 16, (p_hi - p_lo) * 16, pb.wp + p_lo * 16 * pb.k);
  });
  // Items claimed in order: the threads share a chunk of rows, each on its own columns
  // (w's range stays in its L2); a thread slowed by another process takes fewer items.
  pb.n_ranges = std::min<int64_t>(threads, pb.n / 32);
  pb.chunks = ((pb.m + 31) / 32 + kStripsPerChunk - 1) / kStripsPerChunk;
  jaxdm::run_items(pool, pb.chunks * pb.n_ranges, [&pb](int64_t i) { compute_item(pb, i); });
  return ffi::Error::Success();
#endif
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxdmCpuMatmul, Matmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
