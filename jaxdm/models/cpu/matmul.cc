// Matmuls for XLA:CPU, called through XLA's FFI (jaxdm.models.cpu.matmul): bf16 on AMX tiles
// where the CPU has them, else on AVX-512 BF16 pair dot products (vdpbf16ps); fp32 on AVX-512
// FMAs.
//
// Why: XLA:CPU's bf16 dots (fp32 results) ran 1.7-3.3x slower than oneDNN's at the readout's
// shapes on an AMX CPU, and its fp32 dots ran at 75-85 % of an AMD Zen 4's FMA peak (2 x 116
// GFLOP/s) at 2,432 rows, at a third of it at 32-128 rows (issue 17).
//
// Operands: x [..., K] (leading dims flattened to M rows), w [K, N] or a stack of them
// [L, K, N], and layer (s32 scalar: which of the stack's matrices; 0 for [K, N]). Both bf16
// (JaxdmCpuMatmul; w may be the uint16 bits of bf16 weights) or both f32 (JaxdmCpuMatmulF32),
// row major; K and N multiples of 32. Result [..., N] f32, accumulated in f32 (bf16: products
// of bf16 pairs). The stack is read in place: a layer loop passes its whole weight stack and
// the loop index instead of a slice, which XLA would copy for every layer. valid (s32 [B],
// may be empty): x's M rows are B groups of M / B and only the first valid[b] rows of group b
// are computed, the others' results are zeros (the padding tail of a packed row costs no
// products); empty: every row.
//
// Work (bf16): w is packed into 16-column panels of bf16 pairs ([K/2][16][2]: a tile's B
// operand, and one vdpbf16ps operand per pair of rows), split over the threads. Then each item
// takes a chunk of x's rows and one of the threads' column ranges.
// - AMX: 32 rows at a time, x's rows are packed into 16 x 32 tiles (contiguous 1 KB loads) and
//   32 x 32 blocks of the result computed in four accumulator tiles over the whole of K.
// - AVX-512 BF16: 6 rows x 64 columns of the result in 24 registers over the whole of K, x's
//   pairs broadcast from x in place (no packing), w's four panels read in step.
// fp32 takes the AVX-512 BF16 path's blocking on FMAs (see MatmulF32).

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels.h"

namespace ffi = xla::ffi;

namespace {

#if defined(__AMX_BF16__) || defined(__AVX512BF16__)
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

#endif

#ifdef __AMX_BF16__
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

#endif

#if defined(__AMX_BF16__) || defined(__AVX512BF16__)
struct Problem {
  const uint16_t* x;
  const uint16_t* w;
  uint16_t* wp;  // w packed: [N/16] panels of [K/2][16][2]
  float* out;
  int64_t m, k, n;
  int64_t n_ranges, chunks;
};
#endif

#ifdef __AMX_BF16__
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

// The AVX-512 paths (BF16 pairs and fp32 FMAs): result blocks of 6 rows x 64 columns in 24
// registers over the whole of K; work items of 96 rows; packed w taken in 256 KB passes.
constexpr int kRows = 6;                // result rows per register block
constexpr int64_t kRowsPerChunk = 96;   // x rows per work item (16 blocks)
constexpr int64_t kWBytesPerPass = 256 << 10;  // packed w per pass over a chunk's rows

#ifdef __AVX512BF16__
// out[0:kRows, 0:16 * NP] = x[0:kRows, :] @ NP panels of bf16 pairs (panel p's pair of rows
// kk, kk + 1 at w + p * panel + kk * ldk), every row valid (x has kRows rows at stride ldx).
template <int NP>
inline void dot_block(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t k, int64_t ldk,
                      int64_t panel, float* out, int64_t ldo, int valid, bool stream) {
  __m512 acc[kRows][NP];
  for (int r = 0; r < kRows; ++r)
    for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_setzero_ps();
  for (int64_t kk = 0; kk < k; kk += 2) {
    __m512bh b[NP];
    for (int p = 0; p < NP; ++p)
      b[p] = (__m512bh)_mm512_loadu_si512(w + p * panel + kk * ldk);
    for (int r = 0; r < kRows; ++r) {
      int32_t pair;  // (x[r][kk], x[r][kk + 1])
      std::memcpy(&pair, x + r * ldx + kk, sizeof pair);
      const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
      for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_dpbf16_ps(acc[r][p], a, b[p]);
    }
  }
  for (int r = 0; r < valid; ++r)
    for (int p = 0; p < NP; ++p) {
      if (stream) _mm512_stream_ps(out + r * ldo + p * 16, acc[r][p]);
      else _mm512_storeu_ps(out + r * ldo + p * 16, acc[r][p]);
    }
}
#endif  // __AVX512BF16__

// fp32 on AVX-512 FMAs, blocked as the BF16 pairs. w is read in place below kPackMinRowsF32
// rows; from there it is first packed into 16-column panels [K][16] (contiguous reads; packing
// costs more than it saves on fewer rows).
constexpr int64_t kPackMinRowsF32 = 512;

struct ProblemF32 {
  const float* x;
  const float* w;
  const float* wp;  // w packed ([N/16] panels of [K][16]) or null: read w in place
  float* out;
  int64_t m, k, n;
  int64_t n_ranges;
};

void pack_w_f32(const float* w, int64_t k, int64_t n, int64_t j0, int64_t cols, float* out) {
  for (int64_t p = 0; p < cols / 16; ++p) {
    float* panel = out + p * k * 16;
    const float* src = w + j0 + p * 16;
    for (int64_t kk = 0; kk < k; ++kk)
      _mm512_storeu_ps(panel + kk * 16, _mm512_loadu_ps(src + kk * n));
  }
}

// out[0:kRows, 0:16 * NP] = x[0:kRows, :] @ NP 16-column panels of w: panel p's row kk at
// w + p * panel + kk * ldk.
template <int NP>
inline void dot_block_f32(const float* x, int64_t ldx, const float* w, int64_t k, int64_t ldk,
                          int64_t panel, float* out, int64_t ldo, int valid, bool stream) {
  __m512 acc[kRows][NP];
  for (int r = 0; r < kRows; ++r)
    for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_setzero_ps();
  for (int64_t kk = 0; kk < k; ++kk) {
    __m512 b[NP];
    for (int p = 0; p < NP; ++p) b[p] = _mm512_loadu_ps(w + p * panel + kk * ldk);
    for (int r = 0; r < kRows; ++r) {
      const __m512 a = _mm512_set1_ps(x[r * ldx + kk]);
      for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_fmadd_ps(a, b[p], acc[r][p]);
    }
  }
  for (int r = 0; r < valid; ++r)
    for (int p = 0; p < NP; ++p) {
      if (stream) _mm512_stream_ps(out + r * ldo + p * 16, acc[r][p]);
      else _mm512_storeu_ps(out + r * ldo + p * 16, acc[r][p]);
    }
}

// Item i of an AVX-512 path: rows [r_lo, r_hi) (chunks[i / n_ranges]), columns range
// i % n_ranges (in 32-column blocks). w: packed panels (bf16: [N/16][K/2][16][2], fp32:
// [N/16][K][16]) or, fp32 only, w itself (panel p's row kk at w + p * 16 + kk * n).
template <typename T>
void compute_item_avx512(const T* x, const T* w, bool packed, float* out, int64_t r_lo,
                         int64_t r_hi, int64_t k, int64_t n, int64_t n_ranges, int64_t nr) {
  const int64_t blocks = n / 32;
  const int64_t j_lo = blocks * nr / n_ranges * 32, j_hi = blocks * (nr + 1) / n_ranges * 32;
  // result rows start 64-byte aligned when the buffer does (N is a multiple of 32)
  const bool stream = reinterpret_cast<uintptr_t>(out) % 64 == 0;
  thread_local std::vector<T> tail;  // the last rows, padded with zeros to kRows
  const int64_t ldk = packed ? 16 : n, panel = packed ? k * 16 : 16;
  // Columns in sub-ranges whose packed w fits in L2 beside the chunk of x: each sub-range of w
  // (L2) meets every row block of the chunk (x's block in L1).
  const int64_t sub = std::max<int64_t>(64, kWBytesPerPass / (sizeof(T) * k) / 64 * 64);
  for (int64_t c_lo = j_lo; c_lo < j_hi; c_lo += sub) {
    const int64_t c_hi = std::min(j_hi, c_lo + sub);
    for (int64_t row = r_lo; row < r_hi; row += kRows) {
      const int valid = static_cast<int>(std::min<int64_t>(kRows, r_hi - row));
      const T* xs = x + row * k;
      if (valid < kRows) {
        tail.assign(kRows * k, T(0));
        std::memcpy(tail.data(), xs, valid * k * sizeof(T));
        xs = tail.data();
      }
      float* o = out + row * n;
      for (int64_t j = c_lo; j < c_hi; j += 64) {
        const T* wj = packed ? w + j * k : w + j;
        if constexpr (sizeof(T) == 2) {
#ifdef __AVX512BF16__
          if (j + 64 <= c_hi) dot_block<4>(xs, k, wj, k, ldk, panel, o + j, n, valid, stream);
          else dot_block<2>(xs, k, wj, k, ldk, panel, o + j, n, valid, stream);
#endif
        } else {
          if (j + 64 <= c_hi) dot_block_f32<4>(xs, k, wj, k, ldk, panel, o + j, n, valid, stream);
          else dot_block_f32<2>(xs, k, wj, k, ldk, panel, o + j, n, valid, stream);
        }
      }
    }
  }
  if (stream) _mm_sfence();  // the streamed stores are visible before the item counts as done
}

// The rows to compute (``valid``, see the top of the file) as chunks of at most `chunk` rows,
// or an error naming what is wrong.
ffi::ErrorOr<std::vector<std::array<int64_t, 2>>> row_chunks(ffi::Buffer<ffi::S32> valid,
                                                             int64_t m, int64_t chunk) {
  using Bad = ffi::Unexpected<ffi::Error>;
  const int64_t groups = static_cast<int64_t>(valid.element_count());
  if (groups > 0 && m % groups != 0)
    return Bad(ffi::Error::InvalidArgument("valid's length " + std::to_string(groups) +
                                           " does not divide x's " + std::to_string(m) + " rows"));
  const int64_t per = groups > 0 ? m / groups : m;
  std::vector<std::array<int64_t, 2>> chunks;
  for (int64_t g = 0; g < std::max<int64_t>(groups, 1); ++g) {
    const int64_t rows = groups > 0 ? valid.typed_data()[g] : m;
    if (rows < 0 || rows > per)
      return Bad(ffi::Error::InvalidArgument("valid[" + std::to_string(g) + "] = " +
                                             std::to_string(rows) + " is outside [0, " +
                                             std::to_string(per) + "]"));
    for (int64_t r = 0; r < rows; r += chunk)
      chunks.push_back({g * per + r, g * per + std::min(rows, r + chunk)});
  }
  return chunks;
}

// Zeros the result rows that `valid` leaves out.
void zero_skipped_rows(ffi::Buffer<ffi::S32> valid, int64_t m, int64_t n, float* out) {
  const int64_t groups = static_cast<int64_t>(valid.element_count());
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t per = m / groups, rows = valid.typed_data()[g];
    std::memset(out + (g * per + rows) * n, 0, (per - rows) * n * sizeof(float));
  }
}

// The checks both dtypes' handlers make: (m, k, n, offset of w[layer] in elements) or an
// error naming what is wrong; k == 0 writes zeros.
template <typename Out>
ffi::ErrorOr<std::array<int64_t, 4>> check_shapes(ffi::AnyBuffer::Dimensions xd,
                                                  ffi::AnyBuffer::Dimensions wd,
                                                  ffi::Buffer<ffi::S32> layer, Out& out) {
  using Bad = ffi::Unexpected<ffi::Error>;
  if (xd.size() < 1 || (wd.size() != 2 && wd.size() != 3))
    return Bad(ffi::Error::InvalidArgument("x must be [..., K], w [K, N] or [L, K, N]"));
  if (layer.element_count() != 1) return Bad(ffi::Error::InvalidArgument("layer must be a scalar"));
  const int64_t stack = wd.size() == 3 ? wd[0] : 1, k = wd[wd.size() - 2], n = wd.back();
  const int64_t index = *layer.typed_data();
  if (index < 0 || index >= stack)
    return Bad(ffi::Error::InvalidArgument("layer index " + std::to_string(index) +
                                           " is outside w's stack of " + std::to_string(stack)));
  if (xd.back() != k) return Bad(ffi::Error::InvalidArgument("x's last dim must be w's K"));
  if (k % 32 != 0 || n % 32 != 0) return Bad(ffi::Error::InvalidArgument("K and N must be multiples of 32"));
  int64_t m = 1;
  for (size_t i = 0; i + 1 < xd.size(); ++i) m *= xd[i];
  if (out->element_count() != static_cast<size_t>(m * n))
    return Bad(ffi::Error::InvalidArgument("result must be [..., N]"));
  if (k == 0) std::memset(out->typed_data(), 0, m * n * sizeof(float));
  return std::array<int64_t, 4>{m, k, n, index * k * n};
}

ffi::Error MatmulF32(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                     ffi::Buffer<ffi::S32> layer, ffi::Buffer<ffi::S32> valid,
                     ffi::ResultBuffer<ffi::F32> out) {
  const auto shape = check_shapes(x.dimensions(), w.dimensions(), layer, out);
  if (shape.has_error()) return shape.error();
  const auto chunks = row_chunks(valid, (*shape)[0], kRowsPerChunk);
  if (chunks.has_error()) return chunks.error();
  ProblemF32 pb;
  pb.m = (*shape)[0], pb.k = (*shape)[1], pb.n = (*shape)[2];
  if (pb.m == 0 || pb.n == 0 || pb.k == 0) return ffi::Error::Success();
  pb.x = x.typed_data();
  pb.w = w.typed_data() + (*shape)[3];
  pb.out = out->typed_data();
  pb.wp = nullptr;
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  thread_local std::vector<float> wp;  // the calling thread's: helpers only read it
  if (pb.m >= kPackMinRowsF32) {
    wp.resize(pb.k * pb.n);
    float* dst = wp.data();
    const int64_t panels = pb.n / 16;
    const int64_t pack_items = std::min<int64_t>(threads, panels);
    jaxdm::run_items(pool, pack_items, [&pb, dst, panels, pack_items](int64_t i) {
      const int64_t p_lo = panels * i / pack_items, p_hi = panels * (i + 1) / pack_items;
      pack_w_f32(pb.w, pb.k, pb.n, p_lo * 16, (p_hi - p_lo) * 16, dst + p_lo * 16 * pb.k);
    });
    pb.wp = dst;
  }
  pb.n_ranges = std::min<int64_t>(threads, pb.n / 32);
  zero_skipped_rows(valid, pb.m, pb.n, pb.out);
  const auto& rows = *chunks;
  jaxdm::run_items(pool, static_cast<int64_t>(rows.size()) * pb.n_ranges, [&pb, &rows](int64_t i) {
    const auto& r = rows[i / pb.n_ranges];
    compute_item_avx512<float>(pb.x, pb.wp ? pb.wp : pb.w, pb.wp != nullptr, pb.out, r[0], r[1],
                               pb.k, pb.n, pb.n_ranges, i % pb.n_ranges);
  });
  return ffi::Error::Success();
}

ffi::Error Matmul(ffi::ThreadPool pool, ffi::Buffer<ffi::BF16> x, ffi::AnyBuffer w,
                  ffi::Buffer<ffi::S32> layer, ffi::Buffer<ffi::S32> valid,
                  ffi::ResultBuffer<ffi::F32> out) {
#if !defined(__AMX_BF16__) && !defined(__AVX512BF16__)
  return ffi::Error::Internal("jaxdm cpu_matmul was built without AMX or AVX-512 BF16");
#else
  if (w.element_type() != ffi::DataType::BF16 && w.element_type() != ffi::DataType::U16)
    return ffi::Error::InvalidArgument("w must be bf16 (or its uint16 bits)");
  const auto shape = check_shapes(x.dimensions(), w.dimensions(), layer, out);
  if (shape.has_error()) return shape.error();
  const auto chunks = row_chunks(valid, (*shape)[0], kRowsPerChunk);
  if (chunks.has_error()) return chunks.error();
  Problem pb;
  pb.m = (*shape)[0], pb.k = (*shape)[1], pb.n = (*shape)[2];
  if (pb.m == 0 || pb.n == 0 || pb.k == 0) return ffi::Error::Success();
#ifdef __AMX_BF16__
  const bool amx = jaxdm::amx_allowed();
#else
  const bool amx = false;
#endif
#ifndef __AVX512BF16__
  if (!amx) return ffi::Error::Internal("the kernel refused AMX tile state");
#endif
  pb.x = reinterpret_cast<const uint16_t*>(x.typed_data());
  pb.w = static_cast<const uint16_t*>(w.untyped_data()) + (*shape)[3];
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
#ifdef __AMX_BF16__
  if (amx) {
    pb.chunks = ((pb.m + 31) / 32 + kStripsPerChunk - 1) / kStripsPerChunk;
    jaxdm::run_items(pool, pb.chunks * pb.n_ranges, [&pb](int64_t i) { compute_item(pb, i); });
    zero_skipped_rows(valid, pb.m, pb.n, pb.out);  // (the tiles computed every row)
    return ffi::Error::Success();
  }
#endif
#ifdef __AVX512BF16__
  zero_skipped_rows(valid, pb.m, pb.n, pb.out);
  const auto& rows = *chunks;
  jaxdm::run_items(pool, static_cast<int64_t>(rows.size()) * pb.n_ranges, [&pb, &rows](int64_t i) {
    const auto& r = rows[i / pb.n_ranges];
    compute_item_avx512<uint16_t>(pb.x, pb.wp, true, pb.out, r[0], r[1], pb.k, pb.n, pb.n_ranges,
                                  i % pb.n_ranges);
  });
#endif
  return ffi::Error::Success();
#endif
}

}  // namespace

// Both kernels' AMX switch (kernels.h), called once after loading the library.
extern "C" void JaxdmSetAmx(int on) { jaxdm::amx_wanted().store(on != 0); }

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxdmCpuMatmul, Matmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxdmCpuMatmulF32, MatmulF32,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
