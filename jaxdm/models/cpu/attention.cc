// Fused masked softmax attention for XLA:CPU, called through XLA's FFI (jaxdm.models.cpu.attention).
//
// Why: XLA:CPU has no fused attention; at head dim 64 the readout program spent ~58 % of its
// bf16 time in attention, the fp32 logits crossing memory 3-4 times per block (dot + bias,
// max, exp + cast, sum). Here a group of query vectors takes the keys in blocks of 16 in three
// passes (logits and exact max; probabilities; weighted values) whose logits and
// probabilities stay in L1/L2, and blocks masked for every vector of the group are skipped.
// fp32 runs on AVX-512 FMAs; bf16 at head dim 64 on AMX tiles where the CPU has them, else on
// AVX-512 BF16 pair dot products (vdpbf16ps) where it has those, else on fp32 FMAs.
//
// Operands (leading dims flattened to one batch):
//   q [Bq, S, K, G, H] (f32 or bf16), then per source: k, v [Bk, T, K, H] (q's dtype) and
//   mask [Bq, S, T] (pred, True = may attend). Bk divides Bq; query row b reads key row
//   b / (Bq / Bk) (Bk = 1: a cache shared by all rows). One softmax spans all sources.
// Attribute scale (f32): multiplies q.k. Result [Bq, S, K, G, H] in q's dtype, fp32 inside;
// a query vector that may attend to no key at all gets the uniform average of the values.
//
// JaxdmCpuAttentionSegments: one source k, v [Bq, T, K, H] whose mask is a rule on int32
// vectors instead of a pred array (rows holding a shared context and continuations of it,
// one call per layer whatever the layout): slot, seg, sees [Bq, S] per query and kseg
// [Bq, T] per key; key j is visible to query i iff (kseg[j] == 0 and j < sees[i]) or
// (seg[i] > 0 and kseg[j] == seg[i] and j <= slot[i]).
// Requires AVX-512 F/BW/VL (the Python side builds this file only where the CPU has them).

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include <sys/syscall.h>
#include <unistd.h>

#include "kernels.h"
#include "xla/ffi/api/ffi.h"

#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__)
#error "jaxdm cpu_attention needs AVX-512 F/BW/VL"
#endif

namespace ffi = xla::ffi;

namespace {

constexpr int kBlock = 16;  // keys per block: one zmm of fp32 logits
// Query vectors per group on the fp32 FMA path: 12 at head dim 64 (pass 3 in two register
// blocks of 6 over 64-key chunks), so each key and value is read from L2/L3 once per 12
// vectors; else as many as 24 accumulators hold.
template <int NV>
constexpr int kFmaGroup = NV == 4 ? 12 : (24 / NV < 8 ? 24 / NV : 8);

inline float bf16_to_f32(uint16_t x) {
  uint32_t bits = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {  // round to nearest even, as XLA's convert
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu)) return (bits >> 16) | 0x40;
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// 2^t on 16 lanes: t = n + f with n the nearest integer (|f| <= 1/2), a degree-6 polynomial
// for 2^f (relative error ~1e-7 as fp32 evaluates it) and 2^n by scalef, which flushes to zero
// far below 1 (and overflows to inf far above: callers zero masked lanes). The softmax passes
// t = logit * log2(e) - max * log2(e), one fused multiply-subtract: the max's rounding is one
// factor common to a row's probabilities, which its normalisation cancels.
inline __m512 exp2_512(__m512 t) {
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(1.5345806605e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3399930904e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6184890717e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5503286421e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022646248e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718246e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

constexpr float kLog2e = 1.44269504088896341f;

struct Source {
  const void* k;
  const void* v;
  const bool* mask;
  int64_t bk, t;
};

// The segment rule's vectors (JaxdmCpuAttentionSegments), row-major [Bq, S] and [Bq, T].
struct SegmentRule {
  const int32_t* slot;
  const int32_t* seg;
  const int32_t* sees;
  const int32_t* kseg;
  std::vector<int64_t> context;  // per key row: how many leading keys have kseg 0
};

struct Problem {
  const void* q;
  const SegmentRule* rule = nullptr;  // set: one source, masked by the rule (mask unused)
  void* out;
  float* lse = nullptr;  // set (pair paths): each vector's log2-sum-exp2 of its scaled logits
  bool bf16;
  int64_t bq, s, kh, g, h;
  float scale;
  std::vector<Source> sources;
  int64_t rows_per_item;
  struct Packed* packs;  // one per (source, key row, kv head), packed by the first item needing it
  std::vector<int64_t> pack_offset;  // per source: index of its (key row 0, head 0) in packs
};

// One source's keys for one (key row, kv head), ready for the kernel.
struct PackedSource {
  // FMA path, fp32: K transposed per block of 16 keys [blocks][H][16] (zero padded), V [T][H]
  std::vector<float> kt, v;
  // Pair paths (AMX, AVX-512 BF16), bf16 pairs, keys padded to a multiple of 32 with zeros:
  // K [blocks][H/2][16 keys] (lanes (K[key][2e], K[key][2e+1]): a tile's B operand, one zmm per
  // e), V [T/2][H] (lanes (V[2j][d], V[2j+1][d]))
  std::vector<uint32_t> kp, vp;
  int64_t t = 0;
};

// Rows r[0..16) of 32-bit lanes -> their transpose, in four stages that each swap the
// off-diagonal s x s blocks of every 2s x 2s block (s = 8, 4, 2, 1).
inline void transpose16x16(__m512i r[16]) {
  for (int s = 8; s >= 1; s /= 2) {
    alignas(64) int32_t lo[16], hi[16];
    for (int c = 0; c < 16; ++c) {
      lo[c] = (c & s) ? 16 + c - s : c;  // row i: its own low half, then row i + s's
      hi[c] = (c & s) ? 16 + c : c + s;  // row i + s: row i's high half, then its own
    }
    const __m512i il = _mm512_load_si512(lo), ih = _mm512_load_si512(hi);
    for (int i = 0; i < 16; ++i) {
      if (i & s) continue;
      const __m512i a = r[i], b = r[i + s];
      r[i] = _mm512_permutex2var_epi32(a, il, b);
      r[i + s] = _mm512_permutex2var_epi32(a, ih, b);
    }
  }
}

template <typename T>
void pack_source(const Problem& pb, const Source& src, int64_t krow, int64_t head,
                 PackedSource& out) {
  const int64_t t = src.t, h = pb.h, stride = pb.kh * h;
  const int64_t blocks = (t + kBlock - 1) / kBlock;
  out.t = t;
  const T* k = static_cast<const T*>(src.k) + (krow * t * pb.kh + head) * h;
  const T* v = static_cast<const T*>(src.v) + (krow * t * pb.kh + head) * h;
  out.kt.resize(blocks * h * kBlock);
  out.v.resize(t * h);
  int64_t j0 = 0;
  if constexpr (sizeof(T) == 4) {
    // Whole 16-key blocks: 16 x 16 tiles of K transposed in registers (the scalar loop below
    // stores one float per 64-byte stride); V rows copied as they are.
    if (h % 16 == 0) {
      for (; j0 + kBlock <= t; j0 += kBlock) {
        float* kt = out.kt.data() + (j0 / kBlock) * h * kBlock;
        for (int64_t d0 = 0; d0 < h; d0 += 16) {
          __m512i r[16];
          for (int i = 0; i < 16; ++i)
            r[i] = _mm512_castps_si512(_mm512_loadu_ps(k + (j0 + i) * stride + d0));
          transpose16x16(r);
          for (int i = 0; i < 16; ++i)
            _mm512_storeu_ps(kt + (d0 + i) * kBlock, _mm512_castsi512_ps(r[i]));
        }
        for (int i = 0; i < kBlock; ++i)
          std::memcpy(out.v.data() + (j0 + i) * h, v + (j0 + i) * stride, h * sizeof(float));
      }
    }
  }
  // The last, partial block (zeros past t); every key on the bf16 or odd-head-dim paths.
  std::fill(out.kt.begin() + (j0 / kBlock) * h * kBlock, out.kt.end(), 0.0f);
  for (int64_t j = j0; j < t; ++j) {
    float* kt = out.kt.data() + (j / kBlock) * h * kBlock + (j % kBlock);
    const T* kj = k + j * stride;
    const T* vj = v + j * stride;
    float* vo = out.v.data() + j * h;
    for (int64_t d = 0; d < h; ++d) {
      if constexpr (sizeof(T) == 2) {
        kt[d * kBlock] = bf16_to_f32(kj[d]);
        vo[d] = bf16_to_f32(vj[d]);
      } else {
        kt[d * kBlock] = kj[d];
        vo[d] = vj[d];
      }
    }
  }
}

inline __mmask16 load_mask(const bool* row, int64_t t0, int64_t t) {
  const int64_t n = std::min<int64_t>(kBlock, t - t0);
  __m128i bytes = n == kBlock
      ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + t0))
      : _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << n) - 1u), row + t0);
  return _mm_test_epi8_mask(bytes, bytes);
}

// The keys and values of one (source, key row, kv head), packed once per call by the first
// work item that needs them (state 0 -> 1 -> 2); other items wait for it. A cache shared by
// all rows (Bk = 1) is packed once per head, not once per row.
struct Packed {
  std::atomic<int> state{0};
  PackedSource source;
};

// pk's source packed by pack(pk.source) once: the first caller packs, the others wait.
template <typename Pack>
inline void packed_once(Packed& pk, Pack pack) {
  int expected = 0;
  if (pk.state.load(std::memory_order_acquire) == 2) return;
  if (pk.state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    pack(pk.source);
    pk.state.store(2, std::memory_order_release);
  } else {
    while (pk.state.load(std::memory_order_acquire) != 2) _mm_pause();
  }
}

// Whether the live block at gs.live-style index n (ascending) has its 32-key chunk's other
// half live too (else a pair path zeroes that half: it reads whole chunks).
inline bool chunk_partner_live(const std::vector<int32_t>& live, size_t n) {
  const int32_t gb = live[n], other = gb ^ 1;
  return gb % 2 ? n > 0 && live[n - 1] == other : n + 1 < live.size() && live[n + 1] == other;
}

// Per-thread working memory of one group of query vectors: logits then probabilities
// [M][blocks * 16], each block's 16-key masks per vector, and which blocks any vector sees.
struct GroupScratch {
  std::vector<float> p;
  std::vector<uint16_t> p16;  // bf16 probabilities (pair paths)
  std::vector<__mmask16> km;
  std::vector<int32_t> live;  // global block indices some vector of the group sees
  std::vector<__mmask16> any;  // per block, the keys some vector of the group sees
  std::vector<const uint32_t*> kblock;  // AVX-512 BF16 path: each live block's packed keys
  float top2[16];  // pair paths: each vector's scaled max logit in base-2 units (0: none)
};

// The log-sum-exp a vector that sees no key gets (base 2): its probabilities 2^(s - lse)
// are then all zero (a finite bound: 2^(s - inf) would be a NaN in exp2_512).
constexpr float kBlindLse = 1e30f;

// Pass 1, the masks: which of the group's M vectors see each 16-key block of the sources
// (gs.km) and which blocks any of them sees (gs.live, ascending). Each source spans its blocks
// rounded up to a multiple of Align (the pair paths take keys 32 at a time).
template <int M, int Align>
void block_masks(const bool* const* mask_rows, int used,
                 const std::vector<const PackedSource*>& packed, int64_t blocks, GroupScratch& gs) {
  gs.km.assign(M * blocks, 0);  // vectors past `used` see nothing
  gs.any.assign(blocks, 0);
  gs.live.clear();
  int64_t base = 0;
  for (size_t si = 0; si < packed.size(); ++si) {
    const PackedSource& ps = *packed[si];
    const int64_t nb = ((ps.t + kBlock - 1) / kBlock + Align - 1) / Align * Align;
    // each run of vectors sharing a mask row (the G vectors of a query row): its row's masks
    // 64 keys at a time, copied to the run's vectors
    for (int i = 0; i < used;) {
      const bool* row = mask_rows[si * M + i];
      int i1 = i + 1;
      while (i1 < used && mask_rows[si * M + i1] == row) ++i1;
      for (int64_t t0 = 0; t0 < ps.t; t0 += 64) {
        const int64_t n = std::min<int64_t>(64, ps.t - t0);
        const __m512i bytes = _mm512_maskz_loadu_epi8(
            n == 64 ? ~__mmask64{0} : (__mmask64{1} << n) - 1, row + t0);
        const __mmask64 m = _mm512_test_epi8_mask(bytes, bytes);
        const int64_t b0 = base + t0 / kBlock;
        for (int q = 0; q < 4 && t0 + q * kBlock < ps.t; ++q) {
          const __mmask16 km = static_cast<__mmask16>(m >> (16 * q));
          gs.any[b0 + q] |= km;
          for (int v = i; v < i1; ++v) gs.km[v * blocks + b0 + q] = km;
        }
      }
      i = i1;
    }
    for (int64_t bi = 0; bi < nb; ++bi)
      if (gs.any[base + bi]) gs.live.push_back(static_cast<int32_t>(base + bi));
    base += nb;
  }
}

// Pass 1 under the segment rule (one source, key row b): the masks of the M vectors whose
// query rows are row_of[0..used), as block_masks leaves them. A query row's visible keys all
// lie below max(sees, slot + 1), so the blocks past that are not even looked at.
template <int M>
void rule_masks(const SegmentRule& rule, int64_t b, int64_t s, const int64_t* row_of, int used,
                const PackedSource& ps, int64_t blocks, GroupScratch& gs) {
  gs.km.assign(M * blocks, 0);
  gs.any.assign(blocks, 0);
  gs.live.clear();
  const int64_t t = ps.t;
  const int32_t* kseg = rule.kseg + b * t;
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i zero = _mm512_setzero_si512();
  for (int i = 0; i < used;) {
    const int64_t row = row_of[i];
    int i1 = i + 1;
    while (i1 < used && row_of[i1] == row) ++i1;
    const int64_t at = b * s + row;
    const int32_t slot = rule.slot[at], seg = rule.seg[at], sees = rule.sees[at];
    const int64_t end = std::min<int64_t>(t, std::max<int64_t>(sees, seg > 0 ? int64_t{slot} + 1 : 0));
    const __m512i vsees = _mm512_set1_epi32(sees), vslot = _mm512_set1_epi32(slot),
                  vseg = _mm512_set1_epi32(seg);
    // whole blocks of the leading context below sees: every key visible, nothing to test
    const int64_t full = std::min<int64_t>(std::max<int64_t>(sees, 0), rule.context[b]) / kBlock;
    for (int64_t bi = 0; bi < full; ++bi) {
      gs.any[bi] = 0xFFFF;
      for (int v = i; v < i1; ++v) gs.km[v * blocks + bi] = 0xFFFF;
    }
    for (int64_t t0 = full * kBlock; t0 < end; t0 += kBlock) {
      const int64_t n = std::min<int64_t>(kBlock, t - t0);
      const __mmask16 valid = n == kBlock ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << n) - 1u);
      const __m512i ks = _mm512_maskz_loadu_epi32(valid, kseg + t0);
      const __m512i j = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(t0)), lanes);
      __mmask16 km = _mm512_mask_cmpeq_epi32_mask(valid, ks, zero) & _mm512_cmplt_epi32_mask(j, vsees);
      if (seg > 0)
        km |= _mm512_mask_cmpeq_epi32_mask(valid, ks, vseg) & _mm512_cmple_epi32_mask(j, vslot);
      if (!km) continue;
      const int64_t bi = t0 / kBlock;
      gs.any[bi] |= km;
      for (int v = i; v < i1; ++v) gs.km[v * blocks + bi] = km;
    }
    i = i1;
  }
  for (int64_t bi = 0; bi < blocks; ++bi)
    if (gs.any[bi]) gs.live.push_back(static_cast<int32_t>(bi));
}
#if defined(__AMX_BF16__) || defined(__AVX512BF16__)
#define JAXDM_PAIRS 1
constexpr int kChunk = 32;  // keys per step of P.V (one tile row of bf16 pairs)

inline int64_t pair_blocks(int64_t t) { return (t + kChunk - 1) / kChunk * (kChunk / kBlock); }

// Head dim 64 (the pair paths' only one): K's 16-key blocks transposed to [32 pairs][16 keys],
// V's rows interleaved in pairs; keys past t stay zeros.
void pack_source_pairs(const Problem& pb, const Source& src, int64_t krow, int64_t head,
                       PackedSource& out) {
  constexpr int64_t h = 64;
  const int64_t t = src.t, stride = pb.kh * h, blocks = pair_blocks(t);
  out.t = t;
  out.kp.assign(blocks * (h / 2) * kBlock, 0u);
  out.vp.assign(blocks * (kBlock / 2) * h, 0u);
  const uint16_t* k = static_cast<const uint16_t*>(src.k) + (krow * t * pb.kh + head) * h;
  const uint16_t* v = static_cast<const uint16_t*>(src.v) + (krow * t * pb.kh + head) * h;
  for (int64_t bi = 0; bi * kBlock < t; ++bi) {
    const int64_t j0 = bi * kBlock, n = std::min<int64_t>(kBlock, t - j0);
    uint32_t* kp = out.kp.data() + bi * (h / 2) * kBlock;
    for (int half = 0; half < 2; ++half) {  // pairs [16 * half, 16 * half + 16)
      __m512i r[16];
      for (int jj = 0; jj < 16; ++jj)
        r[jj] = jj < n ? _mm512_loadu_si512(k + (j0 + jj) * stride + 32 * half)
                       : _mm512_setzero_si512();
      transpose16x16(r);
      for (int e = 0; e < 16; ++e) _mm512_storeu_si512(kp + (16 * half + e) * kBlock, r[e]);
    }
  }
  // lanes (V[j][d], V[j + 1][d]) for d in [0, 32) and [32, 64) of each 32-dim half
  alignas(64) uint16_t lo[32], hi[32];
  for (int c = 0; c < 32; ++c) lo[c] = (c / 2) + 32 * (c % 2), hi[c] = 16 + (c / 2) + 32 * (c % 2);
  const __m512i il = _mm512_load_si512(lo), ih = _mm512_load_si512(hi);
  for (int64_t j = 0; j < t; j += 2) {
    uint32_t* vp = out.vp.data() + (j / 2) * h;
    for (int half = 0; half < 2; ++half) {
      const __m512i a = _mm512_loadu_si512(v + j * stride + 32 * half);
      const __m512i b = j + 1 < t ? _mm512_loadu_si512(v + (j + 1) * stride + 32 * half)
                                  : _mm512_setzero_si512();
      _mm512_storeu_si512(vp + 32 * half, _mm512_permutex2var_epi16(a, il, b));
      _mm512_storeu_si512(vp + 32 * half + 16, _mm512_permutex2var_epi16(a, ih, b));
    }
  }
}

// Pass 2 of the pair paths: the M vectors' unscaled logits in gs.p (blocks gs.live) ->
// probabilities rounded to bf16 in gs.p16 (whole 32-key chunks: a dead half is zeros) and
// their fp32 sums in l.
template <int M>
void probabilities_bf16(float scale, int64_t blocks, GroupScratch& gs, float* l) {
  const int64_t width = blocks * kBlock;
  const __m512 sv = _mm512_set1_ps(scale * kLog2e);  // logits to base-2 exponents
  const int32_t* live = gs.live.data();
  const int64_t n_live = static_cast<int64_t>(gs.live.size());
  for (int i = 0; i < M; ++i) {
    const float* row = gs.p.data() + i * width;
    const __mmask16* km = gs.km.data() + i * blocks;
    __m512 top = _mm512_set1_ps(-INFINITY), top2 = top;  // two chains: max's latency
    int64_t n = 0;
    for (; n + 1 < n_live; n += 2) {
      top = _mm512_mask_max_ps(top, km[live[n]], top, _mm512_loadu_ps(row + live[n] * kBlock));
      top2 = _mm512_mask_max_ps(top2, km[live[n + 1]], top2,
                                _mm512_loadu_ps(row + live[n + 1] * kBlock));
    }
    if (n < n_live)
      top = _mm512_mask_max_ps(top, km[live[n]], top, _mm512_loadu_ps(row + live[n] * kBlock));
    // max of the scaled logits = scale * max of the logits (scale > 0)
    const float m = _mm512_reduce_max_ps(_mm512_max_ps(top, top2)) * scale;
    gs.top2[i] = m == -INFINITY ? 0.0f : m * kLog2e;
    const __m512 mv = _mm512_set1_ps(gs.top2[i]);
    __m512 sum = _mm512_setzero_ps(), sum2 = sum;
    uint16_t* p16 = gs.p16.data() + i * width;
    for (n = 0; n < n_live; ++n) {
      const int64_t gb = live[n];
      const __m512 e = _mm512_maskz_mov_ps(
          km[gb], exp2_512(_mm512_fmsub_ps(_mm512_loadu_ps(row + gb * kBlock), sv, mv)));
      if (n % 2) sum2 = _mm512_add_ps(sum2, e);
      else sum = _mm512_add_ps(sum, e);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p16 + gb * kBlock),
                          (__m256i)_mm512_cvtneps_pbh(e));
      // P.V reads whole 32-key chunks: the other half of a chunk with one live block is zeros
      if (!chunk_partner_live(gs.live, n))
        std::memset(p16 + (gb ^ 1) * kBlock, 0, kBlock * sizeof(uint16_t));
    }
    l[i] = _mm512_reduce_add_ps(_mm512_add_ps(sum, sum2));
  }
}

#endif

#ifdef __AMX_BF16__
using jaxdm::amx_allowed;
using jaxdm::TileConfig;

// Tile C = the 16 vectors in tiles A0 (dims 0-31) and A1 (dims 32-63) dotted with one 16-key
// block's keys as a tile operand (kp: [32 dim pairs][16 keys]), stored to out (row stride
// `stride` bytes): a block of logits (or, with dout and v, of dP). A macro: the tile
// intrinsics take their tile numbers as literal text.
#define JAXDM_BLOCK_DOTS(C, A0, A1, kp, out, stride) \
  do {                                               \
    const uint32_t* kp_ = (kp);                      \
    _tile_zero(C);                                   \
    _tile_loadd(2, kp_, 64);                         \
    _tile_dpbf16ps(C, A0, 2);                        \
    _tile_loadd(2, kp_ + 16 * kBlock, 64);           \
    _tile_dpbf16ps(C, A1, 2);                        \
    _tile_stored(C, (out), (stride));                \
  } while (0)

// Tiles 4-7 (16 vectors x 64 dims, fp32) += 16 bf16 rows of 32 keys at `rows` (tile 0, rows
// `stride` bytes apart) times those 32 keys' rows by pairs of keys [16 pairs][64 dims] at
// `pairs` (tile 2): one 32-key chunk of P.V in the forward, of dS.k in the backward.
inline void add_chunk_product(const uint16_t* rows, int64_t stride, const uint32_t* pairs) {
  constexpr int H = 64;
  _tile_loadd(0, rows, stride);
  _tile_loadd(2, pairs, H * 4);
  _tile_dpbf16ps(4, 0, 2);
  _tile_loadd(2, pairs + 16, H * 4);
  _tile_dpbf16ps(5, 0, 2);
  _tile_loadd(2, pairs + 32, H * 4);
  _tile_dpbf16ps(6, 0, 2);
  _tile_loadd(2, pairs + 48, H * 4);
  _tile_dpbf16ps(7, 0, 2);
}

inline void zero_product_tiles() {
  _tile_zero(4);
  _tile_zero(5);
  _tile_zero(6);
  _tile_zero(7);
}

// Tiles 4-7 to out [16][64] fp32.
inline void store_product_tiles(float* out) {
  constexpr int H = 64;
  _tile_stored(4, out, H * 4);
  _tile_stored(5, out + 16, H * 4);
  _tile_stored(6, out + 32, H * 4);
  _tile_stored(7, out + 48, H * 4);
}

// 16 query vectors (bf16, unscaled [16][64]) of head dim 64 against all sources on AMX tiles.
// Tiles 0-1: Q (dims 0-31, 32-63), then P; 2: K or V; 3: logits; 4-7: the output, 16 dims
// each. Same passes as group_attend; probabilities are rounded to bf16 for P.V (as the XLA
// path does), their sums are not.
void group_attend_amx(const uint16_t* q, float scale, const std::vector<const PackedSource*>& packed,
                      int64_t blocks, GroupScratch& gs, float* l, float* acc) {
  constexpr int M = 16, H = 64;
  const int64_t width = blocks * kBlock;
  gs.p.resize(M * width);
  gs.p16.resize(M * width);
  TileConfig cfg;
  for (int i = 0; i < 8; ++i) cfg.colsb[i] = 64, cfg.rows[i] = 16;
  _tile_loadconfig(&cfg);
  _tile_loadd(0, q, H * 2);
  _tile_loadd(1, q + 32, H * 2);
  int64_t base = 0;
  size_t li = 0;
  for (size_t si = 0; si < packed.size(); ++si) {
    const PackedSource& ps = *packed[si];
    const int64_t nb = pair_blocks(ps.t);
    for (; li < gs.live.size() && gs.live[li] < base + nb; ++li) {
      const int64_t gb = gs.live[li], bi = gb - base;
      JAXDM_BLOCK_DOTS(3, 0, 1, ps.kp.data() + bi * (H / 2) * kBlock,
                       gs.p.data() + gb * kBlock, width * 4);
    }
    base += nb;
  }
  probabilities_bf16<M>(scale, blocks, gs, l);
  zero_product_tiles();
  base = 0;
  li = 0;
  for (size_t si = 0; si < packed.size(); ++si) {
    const PackedSource& ps = *packed[si];
    const int64_t nb = pair_blocks(ps.t);
    for (int64_t bi = 0; bi < nb; bi += 2) {
      const int64_t gb = base + bi;
      bool live = false;
      while (li < gs.live.size() && gs.live[li] < gb + 2) live = true, ++li;
      if (!live) continue;
      add_chunk_product(gs.p16.data() + gb * kBlock, width * 2,
                        ps.vp.data() + (bi * kBlock / 2) * H);
    }
    base += nb;
  }
  store_product_tiles(acc);
  _tile_release();
}
#endif

#ifdef __AVX512BF16__
// The AMX path's passes on AVX-512 BF16 pair dot products (CPUs without AMX, e.g. AMD Zen 4),
// for 16 query vectors (bf16, unscaled [16][64]) of head dim 64. Blocks of R vectors x B
// operands keep R * B accumulators in registers, so that each broadcast pair of a vector
// feeds B dot products (a broadcast per dot product left Q.K at half speed).
inline __m512bh pair_broadcast(const uint16_t* at) {
  int32_t pair;
  std::memcpy(&pair, at, sizeof pair);
  return (__m512bh)_mm512_set1_epi32(pair);
}

// Logits of R vectors (q [R][64]) against B blocks of 16 packed keys -> out[r] + 16 * col[b].
template <int R, int B>
inline void qk_block(const uint16_t* q, const uint32_t* const* kp, const int32_t* col, float* out,
                     int64_t width) {
  constexpr int H = 64;
  __m512 sc[R][B];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) sc[r][b] = _mm512_setzero_ps();
  for (int e = 0; e < H / 2; ++e) {
    __m512bh kr[B];
    for (int b = 0; b < B; ++b) kr[b] = (__m512bh)_mm512_loadu_si512(kp[b] + e * kBlock);
    for (int r = 0; r < R; ++r) {
      const __m512bh qr = pair_broadcast(q + r * H + 2 * e);
      for (int b = 0; b < B; ++b) sc[r][b] = _mm512_dpbf16_ps(sc[r][b], qr, kr[b]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) _mm512_storeu_ps(out + r * width + col[b] * kBlock, sc[r][b]);
}

// acc[R][64] = bf16 probabilities p (rows at stride width) . values, over the 32-key chunks
// with a live block.
template <int R>
inline void pv_rows(const uint16_t* p, int64_t width, const std::vector<const PackedSource*>& packed,
                    const std::vector<int32_t>& live, float* acc) {
  constexpr int H = 64, C = H / 16;
  __m512 o[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) o[r][c] = _mm512_setzero_ps();
  int64_t base = 0;
  size_t li = 0;
  for (const PackedSource* ps : packed) {
    const int64_t nb = pair_blocks(ps->t);
    while (li < live.size() && live[li] < base + nb) {
      const int64_t gb = live[li] & ~1, bi = gb - base;  // the live block's 32-key chunk
      while (li < live.size() && live[li] < gb + 2) ++li;
      const uint32_t* vp = ps->vp.data() + (bi * kBlock / 2) * H;
      const uint16_t* pp = p + gb * kBlock;
      for (int j = 0; j < kChunk / 2; ++j) {  // key pairs (2j, 2j + 1) of the chunk
        __m512bh v[C];
        for (int c = 0; c < C; ++c) v[c] = (__m512bh)_mm512_loadu_si512(vp + j * H + 16 * c);
        for (int r = 0; r < R; ++r) {
          const __m512bh pr = pair_broadcast(pp + r * width + 2 * j);
          for (int c = 0; c < C; ++c) o[r][c] = _mm512_dpbf16_ps(o[r][c], pr, v[c]);
        }
      }
    }
    base += nb;
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc + r * H + 16 * c, o[r][c]);
}

void group_attend_dp(const uint16_t* q, float scale, int used,
                     const std::vector<const PackedSource*>& packed, int64_t blocks,
                     GroupScratch& gs, float* l, float* acc) {
  constexpr int M = 16, H = 64;
  const int64_t width = blocks * kBlock;
  gs.p.resize(M * width);
  gs.p16.resize(M * width);
  // each live block's packed keys
  gs.kblock.clear();
  int64_t base = 0;
  size_t li = 0;
  for (const PackedSource* ps : packed) {
    const int64_t nb = pair_blocks(ps->t);
    for (; li < gs.live.size() && gs.live[li] < base + nb; ++li)
      gs.kblock.push_back(ps->kp.data() + (gs.live[li] - base) * (H / 2) * kBlock);
    base += nb;
  }
  // Q.K: 8 vectors x 3 blocks at a time (vectors past `used` are never read)
  const int64_t n_live = static_cast<int64_t>(gs.live.size());
  const uint32_t* const* kb = gs.kblock.data();
  const int32_t* live = gs.live.data();
  for (int i0 = 0; i0 < used; i0 += 8) {
    float* out = gs.p.data() + i0 * width;
    const uint16_t* qi = q + i0 * H;
    int64_t n = 0;
    for (; n + 3 <= n_live; n += 3) qk_block<8, 3>(qi, kb + n, live + n, out, width);
    if (n_live - n == 2) qk_block<8, 2>(qi, kb + n, live + n, out, width);
    else if (n_live - n == 1) qk_block<8, 1>(qi, kb + n, live + n, out, width);
  }
  probabilities_bf16<M>(scale, blocks, gs, l);
  // P.V: 6 + 6 + 4 vectors
  const uint16_t* p16 = gs.p16.data();
  pv_rows<6>(p16, width, packed, gs.live, acc);
  if (used > 6) pv_rows<6>(p16 + 6 * width, width, packed, gs.live, acc + 6 * H);
  if (used > 12) pv_rows<4>(p16 + 12 * width, width, packed, gs.live, acc + 12 * H);
}
#endif

// M query vectors (fp32, scaled) against all sources, in three passes over the blocks the
// group sees: logits and each vector's exact max (pass 1), probabilities and their sums
// (pass 2), the probability-weighted values with accumulators held in registers (pass 3).
// No running rescale; logits and probabilities stay in L1/L2.
// q: the group's scaled fp32 vectors [M][H].
template <int NV, int M>
void group_attend(const float* q, const std::vector<const PackedSource*>& packed, int64_t blocks,
                  GroupScratch& gs, float* l, float* acc) {
  constexpr int H = NV * 16;
  const int64_t width = blocks * kBlock;
  gs.p.resize(M * width);
  __m512 top[M];
  for (int i = 0; i < M; ++i) top[i] = _mm512_set1_ps(-INFINITY);
  int64_t base = 0;  // first global block of this source
  size_t li = 0;
  for (size_t si = 0; si < packed.size(); ++si) {
    const PackedSource& ps = *packed[si];
    const int64_t nb = (ps.t + kBlock - 1) / kBlock;
    for (; li < gs.live.size() && gs.live[li] < base + nb; ++li) {
      const int64_t gb = gs.live[li], bi = gb - base;
      __mmask16 km[M];
      for (int i = 0; i < M; ++i) km[i] = gs.km[i * blocks + gb];
      // two accumulators per vector: 2M independent FMA chains hide the FMA latency
      __m512 sc[M], sc2[M];
      for (int i = 0; i < M; ++i) sc[i] = sc2[i] = _mm512_setzero_ps();
      const float* kt = ps.kt.data() + bi * H * kBlock;
      for (int d = 0; d < H; d += 2) {
        const __m512 k0 = _mm512_loadu_ps(kt + d * kBlock);
        const __m512 k1 = _mm512_loadu_ps(kt + (d + 1) * kBlock);
        for (int i = 0; i < M; ++i) {
          sc[i] = _mm512_fmadd_ps(_mm512_set1_ps(q[i * H + d]), k0, sc[i]);
          sc2[i] = _mm512_fmadd_ps(_mm512_set1_ps(q[i * H + d + 1]), k1, sc2[i]);
        }
      }
      for (int i = 0; i < M; ++i) sc[i] = _mm512_add_ps(sc[i], sc2[i]);
      for (int i = 0; i < M; ++i) {
        top[i] = _mm512_mask_max_ps(top[i], km[i], top[i], sc[i]);
        _mm512_storeu_ps(gs.p.data() + i * width + gb * kBlock, sc[i]);
      }
    }
    base += nb;
  }
  for (int i = 0; i < M; ++i) {
    const float m = _mm512_reduce_max_ps(top[i]);
    const __m512 mv = _mm512_set1_ps(m == -INFINITY ? 0.0f : m * kLog2e);
    const __m512 log2e = _mm512_set1_ps(kLog2e);
    __m512 sum = _mm512_setzero_ps();
    float* row = gs.p.data() + i * width;
    for (int32_t gb : gs.live) {
      const __m512 e = _mm512_maskz_mov_ps(
          gs.km[i * blocks + gb],
          exp2_512(_mm512_fmsub_ps(_mm512_loadu_ps(row + gb * kBlock), log2e, mv)));
      sum = _mm512_add_ps(sum, e);
      _mm512_storeu_ps(row + gb * kBlock, e);
    }
    l[i] = _mm512_reduce_add_ps(sum);
  }
  // Pass 3 in register blocks of R vectors (R x NV accumulators); with more than one block
  // the keys go in chunks of kPvChunk blocks, each chunk's values (L1) read by every block
  // of vectors in turn, the accumulators kept in acc between chunks: the values are read
  // from L2/L3 once per M vectors, not once per R.
  constexpr int R = M * NV <= 24 ? M : 24 / NV;
  static_assert(M % R == 0, "the group splits into whole register blocks");
  constexpr int kPvChunk = 4;  // 64 keys: 16 KB of fp32 values at H = 64
  struct Live { const float* v; const float* p; int nk; };
  thread_local std::vector<Live> lives;
  lives.clear();
  base = 0;
  li = 0;
  for (size_t si = 0; si < packed.size(); ++si) {
    const PackedSource& ps = *packed[si];
    const int64_t nb = (ps.t + kBlock - 1) / kBlock;
    for (; li < gs.live.size() && gs.live[li] < base + nb; ++li) {
      const int64_t gb = gs.live[li], t0 = (gb - base) * kBlock;
      lives.push_back({ps.v.data() + t0 * H, gs.p.data() + gb * kBlock,
                       static_cast<int>(std::min<int64_t>(kBlock, ps.t - t0))});
    }
    base += nb;
  }
  const size_t chunk = R == M ? std::max<size_t>(lives.size(), 1) : kPvChunk;
  for (size_t c0 = 0; c0 < std::max<size_t>(lives.size(), 1); c0 += chunk) {
    const size_t c1 = std::min(lives.size(), c0 + chunk);
    for (int r0 = 0; r0 < M; r0 += R) {
      __m512 o[R][NV];
      for (int i = 0; i < R; ++i)
        for (int c = 0; c < NV; ++c)
          o[i][c] = c0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + (r0 + i) * H + 16 * c);
      for (size_t n = c0; n < c1; ++n) {
        const float* v = lives[n].v;
        const float* pb = lives[n].p + r0 * width;
        for (int j = 0; j < lives[n].nk; ++j) {
          for (int c = 0; c < NV; ++c) {
            const __m512 vj = _mm512_loadu_ps(v + j * H + 16 * c);
            for (int i = 0; i < R; ++i)
              o[i][c] = _mm512_fmadd_ps(_mm512_set1_ps(pb[i * width + j]), vj, o[i][c]);
          }
        }
      }
      for (int i = 0; i < R; ++i)
        for (int c = 0; c < NV; ++c) _mm512_storeu_ps(acc + (r0 + i) * H + 16 * c, o[i][c]);
    }
  }
}

// The mean of all values a (key row, head) offers (a query vector that sees no key gets it).
template <typename T>
void value_mean(const Problem& pb, int64_t b, int64_t head, std::vector<float>& mean) {
  const int64_t h = pb.h;
  mean.assign(h, 0.0f);
  int64_t total = 0;
  for (const Source& src : pb.sources) {
    const T* v = static_cast<const T*>(src.v) + ((b / (pb.bq / src.bk)) * src.t * pb.kh + head) * h;
    for (int64_t j = 0; j < src.t; ++j)
      for (int64_t d = 0; d < h; ++d) {
        if constexpr (sizeof(T) == 2) mean[d] += bf16_to_f32(v[j * pb.kh * h + d]);
        else mean[d] += v[j * pb.kh * h + d];
      }
    total += src.t;
  }
  for (int64_t d = 0; d < h; ++d) mean[d] /= static_cast<float>(std::max<int64_t>(1, total));
}

// Path: how a group of vectors is computed (bf16 pairs need head dim 64).
enum class Path { kFma, kAmx, kBf16Dot };

// One work item: query rows [r0, r1) of one (batch row, kv head), in groups of M vectors,
// by fp32 FMAs (group_attend), AMX tiles (group_attend_amx) or AVX-512 BF16 pair dot products
// (group_attend_dp).
template <typename T, int NV, Path P>
void run_item(const Problem& pb, int64_t item, std::vector<float>& scratch, GroupScratch& gs) {
  constexpr int H = NV * 16;
  constexpr bool pairs = P != Path::kFma;
  constexpr int M = pairs ? 16 : kFmaGroup<NV>;
  // chunk-major order: the first bq * kh items each start a different (b, head); the last
  // rows first (causal rows see the most keys there): the cheap items come last, so the
  // threads run out of work at nearly the same time
  const int64_t pair = item % (pb.bq * pb.kh), b = pair / pb.kh, head = pair % pb.kh;
  const int64_t row_chunks = (pb.s + pb.rows_per_item - 1) / pb.rows_per_item;
  const int64_t r0 = (row_chunks - 1 - item / (pb.bq * pb.kh)) * pb.rows_per_item;
  const int64_t r1 = std::min(pb.s, r0 + pb.rows_per_item);
  thread_local std::vector<const PackedSource*> packed;
  packed.clear();
  int64_t blocks = 0;
  for (size_t i = 0; i < pb.sources.size(); ++i) {
    const Source& src = pb.sources[i];
    const int64_t krow = b / (pb.bq / src.bk);
    Packed& pk = pb.packs[pb.pack_offset[i] + krow * pb.kh + head];
    packed_once(pk, [&](PackedSource& out) {
#ifdef JAXDM_PAIRS
      if constexpr (pairs) pack_source_pairs(pb, src, krow, head, out);
      else
#endif
        pack_source<T>(pb, src, krow, head, out);
    });
    packed.push_back(&pk.source);
#ifdef JAXDM_PAIRS
    if constexpr (pairs) {
      blocks += pair_blocks(src.t);
      continue;
    }
#endif
    blocks += (src.t + kBlock - 1) / kBlock;
  }
  scratch.resize(M * H * 2);
  float* qf = scratch.data();
  float* acc = qf + M * H;
  uint16_t* q16 = reinterpret_cast<uint16_t*>(qf);  // pair paths: the group's bf16 vectors [M][H]
  const int64_t n_vec = (r1 - r0) * pb.g;
  std::vector<float> mean;  // filled on the first fully masked vector
  std::vector<const bool*> rows(pb.sources.size() * M);
  int64_t row_of[M];
  const T* q = static_cast<const T*>(pb.q);
  T* out = static_cast<T*>(pb.out);
  for (int64_t v0 = 0; v0 < n_vec; v0 += M) {
    const int used = static_cast<int>(std::min<int64_t>(M, n_vec - v0));
    int64_t offset[M];
    for (int i = 0; i < M; ++i) {
      const int64_t vec = v0 + std::min(i, used - 1);
      const int64_t row = r0 + vec / pb.g, gi = vec % pb.g;
      offset[i] = (((b * pb.s + row) * pb.kh + head) * pb.g + gi) * H;
      row_of[i] = row;
      if constexpr (pairs) {
        std::memcpy(q16 + i * H, q + offset[i], H * sizeof(T));
      } else {
        for (int d = 0; d < H; ++d) {
          float x;
          if constexpr (sizeof(T) == 2) x = bf16_to_f32(q[offset[i] + d]);
          else x = q[offset[i] + d];
          qf[i * H + d] = x * pb.scale;
        }
      }
      if (!pb.rule)
        for (size_t si = 0; si < pb.sources.size(); ++si)
          rows[si * M + i] = pb.sources[si].mask + (b * pb.s + row) * pb.sources[si].t;
    }
    // pass 1, the masks (pair paths: whole 32-key chunks)
    constexpr int align = pairs ? 2 : 1;
    if (pb.rule) rule_masks<M>(*pb.rule, b, pb.s, row_of, used, *packed[0], blocks, gs);
    else block_masks<M, align>(rows.data(), used, packed, blocks, gs);
    float l[M];
#ifdef __AMX_BF16__
    if constexpr (P == Path::kAmx)
      group_attend_amx(q16, pb.scale, packed, blocks, gs, l, acc);
    else
#endif
#ifdef __AVX512BF16__
    if constexpr (P == Path::kBf16Dot)
      group_attend_dp(q16, pb.scale, used, packed, blocks, gs, l, acc);
    else
#endif
      group_attend<NV, M>(qf, packed, blocks, gs, l, acc);
    if constexpr (pairs)
      if (pb.lse)
        for (int i = 0; i < used; ++i)
          pb.lse[offset[i] / H] = l[i] > 0.0f ? gs.top2[i] + std::log2(l[i]) : kBlindLse;
    for (int i = 0; i < used; ++i) {
      const float* src = acc + i * H;
      float inv = 1.0f / l[i];
      if (!(l[i] > 0.0f)) {  // no key visible: the uniform average of all values, as XLA's
        if (mean.empty()) value_mean<T>(pb, b, head, mean);
        src = mean.data();
        inv = 1.0f;
      }
      for (int d = 0; d < H; ++d) {
        const float x = src[d] * inv;
        if constexpr (sizeof(T) == 2) out[offset[i] + d] = f32_to_bf16(x);
        else out[offset[i] + d] = x;
      }
    }
  }
}

template <typename T, int NV, Path P = Path::kFma>
void run_items(const Problem& pb, int64_t begin, int64_t end) {
  thread_local std::vector<float> scratch;
  thread_local GroupScratch gs;
  for (int64_t item = begin; item < end; ++item) run_item<T, NV, P>(pb, item, scratch, gs);
}

using ItemRunner = void (*)(const Problem&, int64_t, int64_t);

// The pair paths take 16 query vectors per (row, head) at a time (an AMX tile's rows): with
// fewer (a decoding step's S * G = 3) the FMA path wastes less.
template <typename T>
ItemRunner pick(int64_t h, int64_t vectors) {
#ifdef __AMX_BF16__
  if (sizeof(T) == 2 && h == 64 && vectors >= 16 && amx_allowed())
    return run_items<T, 4, Path::kAmx>;
#endif
#ifdef __AVX512BF16__
  if (sizeof(T) == 2 && h == 64 && vectors >= 16) return run_items<T, 4, Path::kBf16Dot>;
#endif
  switch (h) {
    case 32: return run_items<T, 2>;
    case 64: return run_items<T, 4>;
    case 128: return run_items<T, 8>;
    case 256: return run_items<T, 16>;
    default: return nullptr;
  }
}

// A slot's accumulators of dk^T and dv^T for every (row, head) [B * K][2][64][tpad] (a
// (row, head)'s slab is zeroed when the slot first touches it in a call), and the dout sum
// of vectors that see no key (their output is the mean of all values).
struct GradSlot {
  std::vector<float> acc, uniform;
  std::vector<uint8_t> touched;

  // (row, head) `pair`'s dk^T / dv^T slab (2 * 64 * tpad floats), zeroed on first use.
  float* slab(int64_t pair, int64_t tpad) {
    constexpr int H = 64;
    if (!touched[pair]) {
      std::memset(acc.data() + pair * 2 * H * tpad, 0, 2 * H * tpad * sizeof(float));
      std::memset(uniform.data() + pair * H, 0, H * sizeof(float));
      touched[pair] = 1;
    }
    return acc.data() + pair * 2 * H * tpad;
  }
};

// Packed keys of earlier calls (and the backward's slots), reused: their buffers keep their
// capacity, no page faults on every call. A call takes one workspace and gives it back when
// all its items are done.
struct Workspace {
  std::unique_ptr<Packed[]> packs;
  int64_t size = 0;
  std::vector<GradSlot> slots;  // the backward kernel's (AttendSegmentsGrad)
};

std::mutex workspace_mutex;
std::vector<std::unique_ptr<Workspace>> workspace_pool;

std::unique_ptr<Workspace> take_workspace(int64_t pairs) {
  std::unique_ptr<Workspace> ws;
  {
    std::lock_guard<std::mutex> lock(workspace_mutex);
    if (!workspace_pool.empty()) {
      ws = std::move(workspace_pool.back());
      workspace_pool.pop_back();
    }
  }
  if (!ws) ws = std::make_unique<Workspace>();
  if (ws->size < pairs) {
    ws->packs = std::make_unique<Packed[]>(pairs);
    ws->size = pairs;
  }
  for (int64_t i = 0; i < pairs; ++i) ws->packs[i].state.store(0, std::memory_order_relaxed);
  return ws;
}

void give_workspace(std::unique_ptr<Workspace> ws) {
  std::lock_guard<std::mutex> lock(workspace_mutex);
  workspace_pool.push_back(std::move(ws));
}

// q's shape and dtype into pb (and the result's check).
ffi::Error set_queries(const ffi::AnyBuffer& q, const ffi::AnyBuffer& out, float scale, Problem& pb) {
  const auto qd = q.dimensions();
  if (qd.size() < 5) return ffi::Error::InvalidArgument("q must have rank >= 5 [..., S, K, G, H]");
  const int r = static_cast<int>(qd.size());
  pb.h = qd[r - 1];
  pb.g = qd[r - 2];
  pb.kh = qd[r - 3];
  pb.s = qd[r - 4];
  pb.bq = 1;
  for (int i = 0; i < r - 4; ++i) pb.bq *= qd[i];
  const auto dtype = q.element_type();
  if (dtype != ffi::DataType::F32 && dtype != ffi::DataType::BF16)
    return ffi::Error::InvalidArgument("q must be float32 or bfloat16");
  pb.bf16 = dtype == ffi::DataType::BF16;
  if (out.element_type() != dtype || out.element_count() != q.element_count())
    return ffi::Error::InvalidArgument("result must match q's shape and dtype");
  pb.q = q.untyped_data();
  pb.out = const_cast<void*>(out.untyped_data());
  pb.scale = scale;
  return ffi::Error::Success();
}

// A source's keys and values (its mask set by the caller).
ffi::Error add_source(const ffi::AnyBuffer& k, const ffi::AnyBuffer& v, const bool* mask, Problem& pb) {
  const auto kd = k.dimensions();
  const int kr = static_cast<int>(kd.size());
  if (kr < 4 || kd[kr - 1] != pb.h || kd[kr - 2] != pb.kh)
    return ffi::Error::InvalidArgument("k must be [..., T, K, H] with q's K and H");
  const auto dtype = pb.bf16 ? ffi::DataType::BF16 : ffi::DataType::F32;
  if (k.element_type() != dtype || v.element_type() != dtype ||
      v.element_count() != k.element_count())
    return ffi::Error::InvalidArgument("k and v must have q's dtype and one shape");
  Source src;
  src.t = kd[kr - 3];
  src.bk = 1;
  for (int j = 0; j < kr - 3; ++j) src.bk *= kd[j];
  if (src.bk <= 0 || pb.bq % src.bk != 0)
    return ffi::Error::InvalidArgument("the keys' batch must divide the queries' batch");
  src.k = k.untyped_data();
  src.v = v.untyped_data();
  src.mask = mask;
  pb.sources.push_back(src);
  return ffi::Error::Success();
}

// Runs the problem's work items on XLA's pool.
ffi::Error run_problem(ffi::ThreadPool& pool, Problem& pb) {
  const ItemRunner runner = pb.bf16 ? pick<uint16_t>(pb.h, pb.s * pb.g) : pick<float>(pb.h, pb.s * pb.g);
  if (!runner) return ffi::Error::InvalidArgument("head dim must be 32, 64, 128 or 256");
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  // Rows per item: enough items for every thread many times over (the keys of a (b, head)
  // are packed once, whatever the number of its items), at least 16 rows each.
  const int64_t heads = pb.bq * pb.kh;
  int64_t chunks = std::max<int64_t>(1, (16 * threads + heads - 1) / heads);
  pb.rows_per_item = std::max<int64_t>(16, (pb.s + chunks - 1) / chunks);
  const int64_t row_chunks = (pb.s + pb.rows_per_item - 1) / pb.rows_per_item;
  const int64_t n_items = heads * row_chunks;
  if (n_items == 0 || pb.s == 0) return ffi::Error::Success();
  int64_t n_packs = 0;
  for (const Source& src : pb.sources) pb.pack_offset.push_back(n_packs), n_packs += src.bk * pb.kh;
  std::unique_ptr<Workspace> ws = take_workspace(n_packs);
  pb.packs = ws->packs.get();
  jaxdm::run_items(pool, n_items, [&pb, runner](int64_t i) { runner(pb, i, i + 1); });
  give_workspace(std::move(ws));  // every item is done: no task touches it any more
  return ffi::Error::Success();
}

ffi::Error Attend(ffi::ThreadPool pool, float scale, ffi::AnyBuffer q, ffi::RemainingArgs rest,
                  ffi::Result<ffi::AnyBuffer> out) {
  Problem pb;
  if (auto e = set_queries(q, *out, scale, pb); e.failure()) return e;
  if (rest.size() == 0 || rest.size() % 3 != 0)
    return ffi::Error::InvalidArgument("sources must come as (k, v, mask) triples");
  for (size_t i = 0; i < rest.size(); i += 3) {
    auto k = rest.get<ffi::AnyBuffer>(i), v = rest.get<ffi::AnyBuffer>(i + 1),
         mask = rest.get<ffi::AnyBuffer>(i + 2);
    if (!k.has_value() || !v.has_value() || !mask.has_value())
      return ffi::Error::InvalidArgument("could not decode a source operand");
    if (auto e = add_source(*k, *v, static_cast<const bool*>(mask->untyped_data()), pb); e.failure())
      return e;
    if (mask->element_type() != ffi::DataType::PRED ||
        mask->element_count() != static_cast<size_t>(pb.bq * pb.s * pb.sources.back().t))
      return ffi::Error::InvalidArgument("mask must be pred [Bq, S, T]");
  }
  return run_problem(pool, pb);
}

// The segment rule of int32 operands [Bq, S] and kseg [Bq, T] (each row's leading context).
SegmentRule make_rule(ffi::Buffer<ffi::S32>& slot, ffi::Buffer<ffi::S32>& seg,
                      ffi::Buffer<ffi::S32>& sees, ffi::Buffer<ffi::S32>& kseg, int64_t bq,
                      int64_t t) {
  SegmentRule rule{slot.typed_data(), seg.typed_data(), sees.typed_data(), kseg.typed_data(), {}};
  rule.context.resize(bq);
  for (int64_t b = 0; b < bq; ++b) {
    const int32_t* ks = rule.kseg + b * t;
    int64_t j = 0;
    while (j < t && ks[j] == 0) ++j;
    rule.context[b] = j;
  }
  return rule;
}

// The segment rule's operands into pb (rule: filled, pb.rule points to it).
ffi::Error segments_problem(float scale, ffi::AnyBuffer& q, ffi::AnyBuffer& k, ffi::AnyBuffer& v,
                            ffi::Buffer<ffi::S32>& slot, ffi::Buffer<ffi::S32>& seg,
                            ffi::Buffer<ffi::S32>& sees, ffi::Buffer<ffi::S32>& kseg,
                            const ffi::AnyBuffer& out, Problem& pb, SegmentRule& rule) {
  if (auto e = set_queries(q, out, scale, pb); e.failure()) return e;
  if (auto e = add_source(k, v, nullptr, pb); e.failure()) return e;
  const Source& src = pb.sources.back();
  if (src.bk != pb.bq) return ffi::Error::InvalidArgument("k must have q's batch");
  const size_t rows = static_cast<size_t>(pb.bq * pb.s);
  if (slot.element_count() != rows || seg.element_count() != rows || sees.element_count() != rows)
    return ffi::Error::InvalidArgument("slot, seg and sees must be int32 [Bq, S]");
  if (kseg.element_count() != static_cast<size_t>(pb.bq * src.t))
    return ffi::Error::InvalidArgument("kseg must be int32 [Bq, T]");
  rule = make_rule(slot, seg, sees, kseg, pb.bq, src.t);
  pb.rule = &rule;
  return ffi::Error::Success();
}

ffi::Error AttendSegments(ffi::ThreadPool pool, float scale, ffi::AnyBuffer q, ffi::AnyBuffer k,
                          ffi::AnyBuffer v, ffi::Buffer<ffi::S32> slot, ffi::Buffer<ffi::S32> seg,
                          ffi::Buffer<ffi::S32> sees, ffi::Buffer<ffi::S32> kseg,
                          ffi::Result<ffi::AnyBuffer> out) {
  Problem pb;
  SegmentRule rule;
  if (auto e = segments_problem(scale, q, k, v, slot, seg, sees, kseg, *out, pb, rule); e.failure())
    return e;
  return run_problem(pool, pb);
}

// The same with each query vector's log2-sum-exp2 of its scaled logits [Bq, S, K, G] (f32)
// for the backward kernel (training's forward): bf16 at head dim 64 on AMX tiles only.
ffi::Error AttendSegmentsLse(ffi::ThreadPool pool, float scale, ffi::AnyBuffer q, ffi::AnyBuffer k,
                             ffi::AnyBuffer v, ffi::Buffer<ffi::S32> slot, ffi::Buffer<ffi::S32> seg,
                             ffi::Buffer<ffi::S32> sees, ffi::Buffer<ffi::S32> kseg,
                             ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::Buffer<ffi::F32>> lse) {
  Problem pb;
  SegmentRule rule;
  if (auto e = segments_problem(scale, q, k, v, slot, seg, sees, kseg, *out, pb, rule); e.failure())
    return e;
  if (!pb.bf16 || pb.h != 64 || pb.s * pb.g < 16 || !jaxdm::amx_allowed())
    return ffi::Error::InvalidArgument(
        "the log-sum-exp output needs bf16, head dim 64, >= 16 vectors per head and AMX");
  if (lse->element_count() != static_cast<size_t>(pb.bq * pb.s * pb.kh * pb.g))
    return ffi::Error::InvalidArgument("lse must be f32 [Bq, S, K, G]");
  pb.lse = lse->typed_data();
  return run_problem(pool, pb);
}

// ---- The segment rule's backward pass: bf16, head dim 64, on AMX tiles ----
//
// Why: XLA's program for this backward ran ~125 ms per layer at 2,176 causal tokens on the Xeon
// with AMX, ~90 ms of it in passes over fp32 [queries x keys] arrays (mask, softmax, dS, casts)
// that cross memory several times; here a group of 16 query vectors keeps one 16-key block's
// logits, probabilities and dS in L1 and every product runs on tiles (23 ms per layer).
//
// Per group of 16 vectors of one (row, kv head), over the 16-key blocks the rule lets some
// vector see: S = q.k (recomputed) and dP = dout.v on tiles; P = 2^(s - lse) from the
// forward's log-sum-exp (AttendSegmentsLse, so no max or sum pass over the row);
// dS = P (dP - delta), delta = sum_h dout.out (fp32); dS and P rounded to bf16 as the XLA
// backward rounds its product operands (decoder.segment_attention_vjp); dq = scale dS.k on
// tiles. dk and dv sum over query rows: a work item (query rows of one (row, head)) keeps its
// groups' dS and P in bf16 pairs of vectors, then per key block adds scale q^T.dS and
// dout^T.P over all its groups in tile accumulators to its slot's fp32 [64][T] slabs
// (transposed: the tile's rows are head dims); the slots (fixed lists of items) are summed in
// order at the end, so the result does not depend on which thread ran what.
#ifdef __AMX_BF16__
constexpr int kGradRows = 64;  // query rows per work item (at most)

struct GradProblem {
  const uint16_t *q, *k, *v, *out, *dout;
  const float* lse;  // the forward's, per query vector (AttendSegmentsLse)
  uint16_t *dq, *dk, *dv;
  const SegmentRule* rule;
  int64_t bq, s, t, kh, g, tpad, blocks, rows_per_item;
  float scale;
  Packed* packs;  // per (row, head): [2 * i] K's tile operands, [2 * i + 1] V's (and K's by key)
  GradSlot* slots;
};

// A work item's buffers: per pair of groups (32 vectors: a tile's whole depth) their bf16 dS
// and P as pairs of vectors per 16-key block ([blocks][16 pairs][16 keys][2]: the B operand of
// the dk / dv products) and q^T, dout^T ([64][32]: their A operands); per group which blocks
// it sees; and the current group's row-major bf16 dS [16][width] (dq's A operand).
struct GradScratch {
  std::vector<uint16_t> ds_pairs, p_pairs, qt, dot, ds16;
  std::vector<uint8_t> live;
  std::vector<int32_t> any_live;
};

// The 16 bf16 of a (rounded) and the 16 of b interleaved: (a0, b0, a1, b1, ...).
inline __m512i interleave_bf16(__m512 a, __m512 b) {
  alignas(64) static const uint16_t idx[32] = {16, 0, 17, 1, 18, 2, 19, 3, 20, 4, 21, 5, 22, 6,
                                               23, 7, 24, 8, 25, 9, 26, 10, 27, 11, 28, 12,
                                               29, 13, 30, 14, 31, 15};
  // cvtne2ps(hi, lo): lanes 0-15 from lo (b here), 16-31 from hi (a)
  const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(a, b);
  return _mm512_permutexvar_epi16(_mm512_load_si512(idx), both);
}

inline void tile_config() {  // every tile [16 rows][64 bytes]
  TileConfig cfg;
  for (int i = 0; i < 8; ++i) cfg.colsb[i] = 64, cfg.rows[i] = 16;
  _tile_loadconfig(&cfg);
}

// One group: per live 16-key block S = q.k and dP = dout.v on tiles, left in a 1 KB buffer
// each (L1), then P = 2^(scale log2(e) s - lse) (the forward's log-sum-exp: no max or sum
// pass over the row) and dS = P (dP - delta), kept as bf16 rows (dq's A operand) and as
// pairs of vectors at group index gi (the dk / dv products' B operands); then dq = dS.k.
void grad_group(const GradProblem& pb, const PackedSource& kpk, const PackedSource& kpv,
                const uint16_t* q16, const uint16_t* do16, const float* delta, const float* lse2,
                int gi, GroupScratch& gs, GradScratch& gr, float* dq) {
  constexpr int M = 16, H = 64;
  const int64_t blocks = pb.blocks, width = blocks * kBlock;
  gr.ds16.resize(M * width);
  alignas(64) float sb[M * kBlock], dpb[M * kBlock];
  const __m512 sv = _mm512_set1_ps(pb.scale * kLog2e);
  // two groups share the dk / dv products' operands (32 vectors: a tile's whole depth)
  uint16_t* dsp = gr.ds_pairs.data() + (gi / 2) * blocks * 512 + (gi % 2) * 256;
  uint16_t* pp = gr.p_pairs.data() + (gi / 2) * blocks * 512 + (gi % 2) * 256;
  uint8_t* live = gr.live.data() + gi * blocks;
  std::memset(live, 0, blocks);
  _tile_loadd(0, q16, H * 2);
  _tile_loadd(1, q16 + 32, H * 2);
  _tile_loadd(4, do16, H * 2);
  _tile_loadd(5, do16 + 32, H * 2);
  for (size_t n = 0; n < gs.live.size(); ++n) {
    const int32_t gb = gs.live[n];
    JAXDM_BLOCK_DOTS(3, 0, 1, kpk.kp.data() + gb * (H / 2) * kBlock, sb, 64);   // S
    JAXDM_BLOCK_DOTS(6, 4, 5, kpv.kp.data() + gb * (H / 2) * kBlock, dpb, 64);  // dP
    live[gb] = 1;
    for (int pr = 0; pr < M / 2; ++pr) {
      __m512 p2[2], ds2[2];
      for (int j = 0; j < 2; ++j) {
        const int i = 2 * pr + j;
        p2[j] = _mm512_maskz_mov_ps(gs.km[i * blocks + gb], exp2_512(_mm512_fmsub_ps(
            _mm512_load_ps(sb + i * kBlock), sv, _mm512_set1_ps(lse2[i]))));
        ds2[j] = _mm512_mul_ps(p2[j], _mm512_sub_ps(_mm512_load_ps(dpb + i * kBlock),
                                                    _mm512_set1_ps(delta[i])));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(gr.ds16.data() + i * width + gb * kBlock),
                            (__m256i)_mm512_cvtneps_pbh(ds2[j]));
      }
      _mm512_storeu_si512(dsp + gb * 512 + pr * 32, interleave_bf16(ds2[0], ds2[1]));
      _mm512_storeu_si512(pp + gb * 512 + pr * 32, interleave_bf16(p2[0], p2[1]));
    }
    // dq's A operand spans whole 32-key chunks: the other half of a chunk with one live
    // block is zeros
    if (!chunk_partner_live(gs.live, n))
      for (int i = 0; i < M; ++i)
        std::memset(gr.ds16.data() + i * width + (gb ^ 1) * kBlock, 0, kBlock * sizeof(uint16_t));
  }
  // dq = dS.k (k by pairs of keys: kpv's vp)
  zero_product_tiles();
  for (size_t n = 0; n < gs.live.size(); ++n) {
    const int32_t gb = gs.live[n] & ~1;
    if (n > 0 && (gs.live[n - 1] & ~1) == gb) continue;  // the chunk was done
    add_chunk_product(gr.ds16.data() + gb * kBlock, width * 2,
                      kpv.vp.data() + (gb * kBlock / 2) * H);
  }
  store_product_tiles(dq);
}

void grad_item(const GradProblem& pb, int64_t item, int slot_index) {
  constexpr int M = 16, H = 64;
  thread_local GroupScratch gs;
  thread_local GradScratch gr;
  GradSlot& slot = pb.slots[slot_index];
  const int64_t heads = pb.bq * pb.kh, pair = item % heads, b = pair / pb.kh,
                head = pair % pb.kh;
  const int64_t row_chunks = (pb.s + pb.rows_per_item - 1) / pb.rows_per_item;
  const int64_t r0 = (row_chunks - 1 - item / heads) * pb.rows_per_item;  // last rows first
  const int64_t r1 = std::min(pb.s, r0 + pb.rows_per_item);
  Problem shape;
  shape.kh = pb.kh;
  shape.h = H;
  const Source kv{pb.k, pb.v, nullptr, pb.bq, pb.t}, vk{pb.v, pb.k, nullptr, pb.bq, pb.t};
  Packed& pk = pb.packs[2 * pair];
  Packed& pv = pb.packs[2 * pair + 1];
  packed_once(pk, [&](PackedSource& out) { pack_source_pairs(shape, kv, b, head, out); });
  packed_once(pv, [&](PackedSource& out) { pack_source_pairs(shape, vk, b, head, out); });
  const int64_t blocks = pb.blocks, n_vec = (r1 - r0) * pb.g;
  const int64_t groups = (n_vec + M - 1) / M;
  const int64_t duos = (groups + 1) / 2;  // pairs of groups: 32 vectors
  gr.ds_pairs.resize(duos * blocks * 512);
  gr.p_pairs.resize(duos * blocks * 512);
  gr.live.assign(2 * duos * blocks, 0);  // a missing last group sees nothing
  gr.qt.resize(duos * H * 2 * M);
  gr.dot.resize(duos * H * 2 * M);
  if (groups % 2) {  // the missing group's vectors: zero operands
    for (int64_t h = 0; h < H; ++h) {
      std::memset(gr.qt.data() + ((duos - 1) * H + h) * 2 * M + M, 0, M * 2);
      std::memset(gr.dot.data() + ((duos - 1) * H + h) * 2 * M + M, 0, M * 2);
    }
  }
  alignas(64) uint16_t q16[M * H], do16[M * H];
  alignas(64) float dq[M * H];
  float delta[M], lse2[M];
  int64_t row_of[M], offset[M];
  float* uniform = nullptr;
  tile_config();
  for (int64_t gi = 0; gi < groups; ++gi) {
    const int64_t v0 = gi * M;
    const int used = static_cast<int>(std::min<int64_t>(M, n_vec - v0));
    // q^T and dout^T of the group's pair [64][32], this group's 16 columns
    uint16_t* qt = gr.qt.data() + (gi / 2) * H * 2 * M + (gi % 2) * M;
    uint16_t* dt = gr.dot.data() + (gi / 2) * H * 2 * M + (gi % 2) * M;
    for (int i = 0; i < M; ++i) {
      const int64_t vec = v0 + std::min(i, used - 1);
      const int64_t row = r0 + vec / pb.g, gq = vec % pb.g;
      offset[i] = (((b * pb.s + row) * pb.kh + head) * pb.g + gq) * H;
      row_of[i] = row;
      std::memcpy(q16 + i * H, pb.q + offset[i], H * 2);
      std::memcpy(do16 + i * H, pb.dout + offset[i], H * 2);
      float d = 0.0f;
      for (int h = 0; h < H; ++h)
        d += bf16_to_f32(pb.dout[offset[i] + h]) * bf16_to_f32(pb.out[offset[i] + h]);
      delta[i] = d;
      lse2[i] = i < used ? pb.lse[offset[i] / H] : kBlindLse;
      // vectors past `used` repeat the last one: zero operands, so they add nothing
      for (int h = 0; h < H; ++h) {
        qt[h * 2 * M + i] = i < used ? q16[i * H + h] : 0;
        dt[h * 2 * M + i] = i < used ? do16[i * H + h] : 0;
      }
    }
    rule_masks<M>(*pb.rule, b, pb.s, row_of, used, pk.source, blocks, gs);
    grad_group(pb, pk.source, pv.source, q16, do16, delta, lse2, static_cast<int>(gi), gs, gr,
               dq);
    for (int i = 0; i < used; ++i) {
      uint16_t* dst = pb.dq + offset[i];
      if (lse2[i] >= kBlindLse) {  // sees no key: the output is the mean of all values
        std::memset(dst, 0, H * 2);
        if (!uniform) {
          slot.slab(pair, pb.tpad);
          uniform = slot.uniform.data() + pair * H;
        }
        for (int h = 0; h < H; ++h) uniform[h] += bf16_to_f32(do16[i * H + h]);
        continue;
      }
      for (int h = 0; h < H; ++h) dst[h] = f32_to_bf16(dq[i * H + h] * pb.scale);
    }
  }
  // dk^T += q^T.dS, dv^T += dout^T.P per key block some group sees, over the item's groups
  gr.any_live.clear();
  for (int64_t gb = 0; gb < blocks; ++gb)
    for (int64_t gi = 0; gi < groups; ++gi)
      if (gr.live[gi * blocks + gb]) {
        gr.any_live.push_back(static_cast<int32_t>(gb));
        break;
      }
  if (gr.any_live.empty()) {
    _tile_release();
    return;
  }
  float* slab = slot.slab(pair, pb.tpad);
  // a block one group of a pair sees and the other does not: the other's half of the
  // operands is zeros (its A columns may not be: a real group)
  for (int64_t du = 0; du < duos; ++du)
    for (int32_t gb : gr.any_live) {
      const uint8_t l0 = gr.live[2 * du * blocks + gb], l1 = gr.live[(2 * du + 1) * blocks + gb];
      if (l0 == l1) continue;
      const int64_t half = ((du * blocks + gb) * 2 + (l0 ? 1 : 0)) * 256;
      std::memset(gr.ds_pairs.data() + half, 0, 512);
      std::memset(gr.p_pairs.data() + half, 0, 512);
    }
  // all tiles [16][64 bytes]: A = q^T or dout^T [16 dims][32 vectors], B = dS or P pairs
  // [16 vector pairs][16 keys][2], C = dk^T or dv^T [16 dims][16 keys]
  for (int which = 0; which < 2; ++which) {
    const uint16_t* a_all = which ? gr.dot.data() : gr.qt.data();
    const uint16_t* b_all = which ? gr.p_pairs.data() : gr.ds_pairs.data();
    float* acc = slab + which * H * pb.tpad;
    for (int32_t gb : gr.any_live) {
      float* c = acc + gb * kBlock;
      _tile_loadd(5, c, pb.tpad * 4);
      _tile_loadd(6, c + 16 * pb.tpad, pb.tpad * 4);
      _tile_loadd(7, c + 32 * pb.tpad, pb.tpad * 4);
      _tile_loadd(3, c + 48 * pb.tpad, pb.tpad * 4);  // dims 48-63 (A tiles 0-2 only)
      for (int64_t du = 0; du < duos; ++du) {
        if (!gr.live[2 * du * blocks + gb] && !gr.live[(2 * du + 1) * blocks + gb]) continue;
        const uint16_t* a = a_all + du * H * 2 * M;
        _tile_loadd(4, b_all + (du * blocks + gb) * 512, 64);
        _tile_loadd(0, a, 64);
        _tile_dpbf16ps(5, 0, 4);
        _tile_loadd(1, a + 16 * 2 * M, 64);
        _tile_dpbf16ps(6, 1, 4);
        _tile_loadd(2, a + 32 * 2 * M, 64);
        _tile_dpbf16ps(7, 2, 4);
        _tile_loadd(0, a + 48 * 2 * M, 64);
        _tile_dpbf16ps(3, 0, 4);
      }
      _tile_stored(5, c, pb.tpad * 4);
      _tile_stored(6, c + 16 * pb.tpad, pb.tpad * 4);
      _tile_stored(7, c + 32 * pb.tpad, pb.tpad * 4);
      _tile_stored(3, c + 48 * pb.tpad, pb.tpad * 4);
    }
  }
  _tile_release();
}

// dk, dv of every (row, head): the slots' slabs summed in order and transposed to [T][64].
void grad_reduce(const GradProblem& pb, int n_slots, int64_t pair) {
  constexpr int H = 64;
  const int64_t b = pair / pb.kh, head = pair % pb.kh, slab = 2 * H * pb.tpad;
  float* sum = nullptr;
  float uniform[H] = {};
  for (int i = 0; i < n_slots; ++i) {
    GradSlot& sl = pb.slots[i];
    if (sl.touched.empty() || !sl.touched[pair]) continue;
    float* acc = sl.acc.data() + pair * slab;
    for (int h = 0; h < H; ++h) uniform[h] += sl.uniform[pair * H + h];
    if (!sum) {
      sum = acc;
      continue;
    }
    for (int64_t x = 0; x < slab; x += 16)
      _mm512_storeu_ps(sum + x, _mm512_add_ps(_mm512_loadu_ps(sum + x), _mm512_loadu_ps(acc + x)));
  }
  const float mean = 1.0f / static_cast<float>(std::max<int64_t>(1, pb.t));
  for (int64_t j = 0; j < pb.t; ++j) {
    uint16_t* dk = pb.dk + ((b * pb.t + j) * pb.kh + head) * H;
    uint16_t* dv = pb.dv + ((b * pb.t + j) * pb.kh + head) * H;
    for (int h = 0; h < H; ++h) {
      const float gk = sum ? sum[h * pb.tpad + j] : 0.0f;
      const float gv = sum ? sum[(H + h) * pb.tpad + j] : 0.0f;
      dk[h] = f32_to_bf16(gk * pb.scale);
      dv[h] = f32_to_bf16(gv + uniform[h] * mean);
    }
  }
}
#endif

ffi::Error AttendSegmentsGrad(ffi::ThreadPool pool, float scale, ffi::AnyBuffer q,
                              ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer out,
                              ffi::AnyBuffer dout, ffi::Buffer<ffi::F32> lse,
                              ffi::Buffer<ffi::S32> slot,
                              ffi::Buffer<ffi::S32> seg, ffi::Buffer<ffi::S32> sees,
                              ffi::Buffer<ffi::S32> kseg, ffi::Result<ffi::AnyBuffer> dq,
                              ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv) {
#ifndef __AMX_BF16__
  return ffi::Error::InvalidArgument("the attention backward kernel was built without AMX");
#else
  if (!amx_allowed()) return ffi::Error::InvalidArgument("the attention backward kernel needs AMX");
  Problem pb;
  if (auto e = set_queries(q, *dq, scale, pb); e.failure()) return e;
  if (!pb.bf16 || pb.h != 64)
    return ffi::Error::InvalidArgument("the attention backward kernel takes bf16, head dim 64");
  if (auto e = add_source(k, v, nullptr, pb); e.failure()) return e;
  const Source& src = pb.sources.back();
  if (src.bk != pb.bq) return ffi::Error::InvalidArgument("k must have q's batch");
  for (const ffi::AnyBuffer* a : {&out, &dout})
    if (a->element_type() != ffi::DataType::BF16 || a->element_count() != q.element_count())
      return ffi::Error::InvalidArgument("out and dout must be bf16 with q's shape");
  if (lse.element_count() != static_cast<size_t>(pb.bq * pb.s * pb.kh * pb.g))
    return ffi::Error::InvalidArgument("lse must be f32 [Bq, S, K, G]");
  for (auto* r : {&dk, &dv})
    if ((*r)->element_type() != ffi::DataType::BF16 || (*r)->element_count() != k.element_count())
      return ffi::Error::InvalidArgument("dk and dv must be bf16 with k's shape");
  const size_t rows = static_cast<size_t>(pb.bq * pb.s);
  if (slot.element_count() != rows || seg.element_count() != rows || sees.element_count() != rows)
    return ffi::Error::InvalidArgument("slot, seg and sees must be int32 [Bq, S]");
  if (kseg.element_count() != static_cast<size_t>(pb.bq * src.t))
    return ffi::Error::InvalidArgument("kseg must be int32 [Bq, T]");
  SegmentRule rule = make_rule(slot, seg, sees, kseg, pb.bq, src.t);
  GradProblem gp;
  gp.q = static_cast<const uint16_t*>(q.untyped_data());
  gp.k = static_cast<const uint16_t*>(k.untyped_data());
  gp.v = static_cast<const uint16_t*>(v.untyped_data());
  gp.out = static_cast<const uint16_t*>(out.untyped_data());
  gp.dout = static_cast<const uint16_t*>(dout.untyped_data());
  gp.lse = lse.typed_data();
  gp.dq = static_cast<uint16_t*>(dq->untyped_data());
  gp.dk = static_cast<uint16_t*>(dk->untyped_data());
  gp.dv = static_cast<uint16_t*>(dv->untyped_data());
  gp.rule = &rule;
  gp.bq = pb.bq, gp.s = pb.s, gp.t = src.t, gp.kh = pb.kh, gp.g = pb.g;
  gp.blocks = pair_blocks(src.t);
  gp.tpad = gp.blocks * kBlock;
  gp.scale = scale;
  const int64_t heads = pb.bq * pb.kh;
  if (heads == 0) return ffi::Error::Success();
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  // Rows per item: at most kGradRows (an item's dS and P pairs stay a few MB), fewer where
  // the threads would otherwise lack items.
  const int64_t chunks = std::max<int64_t>(1, (8 * threads + heads - 1) / heads);
  gp.rows_per_item = std::clamp<int64_t>((pb.s + chunks - 1) / chunks, 8, kGradRows);
  const int64_t n_items = pb.s == 0 ? 0 : heads * ((pb.s + gp.rows_per_item - 1) / gp.rows_per_item);
  std::unique_ptr<Workspace> ws = take_workspace(2 * heads);
  // Deterministic sums: slot i takes items i, i + n_slots, ... in order (interleaved, so the
  // slots' work is alike), whichever thread claims it, and the slots are summed in order.
  const int n_slots = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(2 * threads, n_items)));
  if (static_cast<int>(ws->slots.size()) < n_slots) ws->slots.resize(n_slots);
  for (int i = 0; i < n_slots; ++i) {
    GradSlot& sl = ws->slots[i];
    sl.acc.resize(heads * 2 * 64 * gp.tpad);
    sl.uniform.resize(heads * 64);
    sl.touched.assign(heads, 0);
  }
  gp.packs = ws->packs.get();
  gp.slots = ws->slots.data();
  jaxdm::run_items(pool, n_slots, [&gp, n_slots, n_items](int64_t slot) {
    for (int64_t i = slot; i < n_items; i += n_slots) grad_item(gp, i, static_cast<int>(slot));
  });
  jaxdm::run_items(pool, heads, [&gp, n_slots](int64_t p) { grad_reduce(gp, n_slots, p); });
  give_workspace(std::move(ws));  // every item is done: no task touches it any more
  return ffi::Error::Success();
#endif
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxdmCpuAttention, Attend,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Attr<float>("scale")
                                  .Arg<ffi::AnyBuffer>()
                                  .RemainingArgs()
                                  .Ret<ffi::AnyBuffer>());

// The segment rule's four int32 operands (slot, seg, sees, kseg), appended to a binding.
template <typename Binding>
auto with_segment_rule(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::Buffer<ffi::S32>>()
      .template Arg<ffi::Buffer<ffi::S32>>()
      .template Arg<ffi::Buffer<ffi::S32>>()
      .template Arg<ffi::Buffer<ffi::S32>>();
}

// The segment kernels' leading operands: the thread pool, the scale, q, k and v.
inline auto qkv_binding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .Attr<float>("scale")
      .Arg<ffi::AnyBuffer>()
      .Arg<ffi::AnyBuffer>()
      .Arg<ffi::AnyBuffer>();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxdmCpuAttentionSegments, AttendSegments,
                              with_segment_rule(qkv_binding()).Ret<ffi::AnyBuffer>());

// q, k, v, then the forward's output, its cotangent and its log-sum-exp, then the rule.
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxdmCpuAttentionSegmentsGrad, AttendSegmentsGrad,
                              with_segment_rule(qkv_binding()
                                                    .Arg<ffi::AnyBuffer>()
                                                    .Arg<ffi::AnyBuffer>()
                                                    .Arg<ffi::Buffer<ffi::F32>>())
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxdmCpuAttentionSegmentsLse, AttendSegmentsLse,
                              with_segment_rule(qkv_binding())
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
