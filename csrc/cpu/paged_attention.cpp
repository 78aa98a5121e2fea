// PagedAttention decode on the CPU (paper §4.1, Figure 5; DESIGN §3, §4).
//
// One query token per sequence attends to the sequence's K/V, which lives in
// fixed-size physical blocks scattered over the cache; the block table says
// where. Each (sequence, KV head) pair is one work item: the G = H / H_kv query
// heads that share a KV head are processed together, so every K and V row is
// read from memory once. Each physical block is visited once, with the online
// softmax of the paper's equation: per block, the scores, the block's maximum,
// a running maximum m and sum l, and the accumulator rescaled by exp(m_old - m).
//
// Cache layout (DESIGN §3): key_cache[b, o, h, :] is the key of slot b*B + o for
// KV head h; rows of one head inside a block are H_kv * D elements apart.
//
// Versions (both tested against the contiguous oracle, tests/step03_attention/
// test_cpu_kernel.py; bindings.cpp picks v2 when it applies). v2 is this file,
// v1 is paged_attention_v1.cpp:
//   v1  scalar and readable: the equation line by line, any dtype (float64 for
//       tight tests, float32, bfloat16 with float32 accumulation), any head dim.
//       It is the specification of v2 and the path for float64 and odd head dims.
//   v2  AVX-512 for float32 and bfloat16, head dim a multiple of 16 (64, 80, 96,
//       128, ... and the small 16, 32): the K row is held in registers while the
//       G dot products run; the scores, max, exp (a vectorized polynomial) and
//       sum run 16 tokens per instruction; V is accumulated in register tiles of
//       query heads x head dim; the next block's rows are prefetched into L2.
//       bfloat16 (with AVX512-BF16) takes K . q as exact bfloat16 products
//       (VDPBF16PS) and widens V by interleaving with zeros. When sequences x
//       KV heads are too few for the threads (one long request, MQA), each
//       sequence is split into partitions whose (max, sum, accumulator) are
//       merged at the end (vLLM's v2 idea). Exists because decode is the
//       engine's hot path on a CPU: it runs at the cache's or memory's
//       bandwidth (python -m paged.bench kernel), v1 at a fraction (3-8x).
// Work items are spread over torch's thread count with a dynamic OpenMP
// schedule, so sequences of different lengths balance across threads. Work
// items of several KV heads (one pass over a block's contiguous rows) measured
// no faster than one head per item with the per-head prefetch of v2.

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "paged_attention.h"

namespace paged {
namespace {

using detail::for_each_item;


#if defined(__AVX512F__)

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {
  // bfloat16 is the top half of a float32: widen and shift, exactly.
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// exp(x) for x <= 0 (scores minus their running maximum), ~1 ulp: Cephes expf.
// x = n ln2 + r with |r| <= ln2 / 2, exp(r) by a degree-6 polynomial, times 2^n.
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));  // exp(-104) is 0 in float32
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

inline __mmask16 tail_mask(int64_t remaining) {
  return remaining >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << remaining) - 1u);
}

// State of the G query heads of one work item.
struct ScratchV2 {
  int64_t stride;  // scores per query head: B rounded up to 16
  std::vector<float> q, acc, scores, m, l, alpha;
  explicit ScratchV2(const DecodeArgs& a) {
    const int64_t heads = a.num_heads / a.num_kv_heads;
    stride = (a.block_size + 15) / 16 * 16;
    q.resize(heads * a.head_dim);
    acc.resize(heads * a.head_dim);
    scores.resize(heads * stride);
    m.resize(heads);
    l.resize(heads);
    alpha.resize(heads);
  }
};

// bfloat16 paths: VDPBF16PS multiplies bfloat16 pairs exactly and accumulates in
// float32 (32 products per instruction, no widening of K); V is widened two
// halves at a time by interleaving with zeros (one shuffle per 16 values
// instead of a widen and a shift), which leaves each 32-value chunk of the
// accumulator in the order of the two unpacks; acc_index undoes it once, at
// the output.
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
constexpr bool kFastBF16 = true;
#else
constexpr bool kFastBF16 = false;
#endif
template <typename T>
constexpr bool kPairs = kFastBF16 && std::is_same_v<T, c10::BFloat16>;

// A key row held in registers: NC float vectors, or for bfloat16 NC / 2
// vectors of 32 raw bfloat16 values plus a widened 16-value tail if NC is odd.
template <typename T, int NC>
struct KeyRow {
  __m512 k[NC];
  void load(const T* row) {
    for (int c = 0; c < NC; ++c) k[c] = load16(row + 16 * c);
  }
  // q: the G query heads (float, pre-scaled), D apart
  float dot(const float* q, int64_t) const {
    __m512 s0 = _mm512_mul_ps(_mm512_loadu_ps(q), k[0]);  // two chains: half the latency
    __m512 s1 = _mm512_setzero_ps();
    if constexpr (NC > 1) s1 = _mm512_mul_ps(_mm512_loadu_ps(q + 16), k[1]);
    for (int c = 2; c < NC; c += 2) {
      s0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + 16 * c), k[c], s0);
      if (c + 1 < NC) s1 = _mm512_fmadd_ps(_mm512_loadu_ps(q + 16 * (c + 1)), k[c + 1], s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
  }
};

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
template <int NC>
struct KeyRow<c10::BFloat16, NC> {
  static constexpr int NP = NC / 2;
  __m512i k[NP > 0 ? NP : 1];
  __m512 tail;
  void load(const c10::BFloat16* row) {
    for (int c = 0; c < NP; ++c) k[c] = _mm512_loadu_si512(row + 32 * c);
    if constexpr (NC % 2) tail = load16(row + 32 * NP);
  }
  // q: raw bfloat16 query row (the scale is applied to the score)
  float dot(const c10::BFloat16* q, float scale) const {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    for (int c = 0; c < NP; ++c) {
      const __m512bh qc = (__m512bh)_mm512_loadu_si512(q + 32 * c);
      if (c % 2 == 0) s0 = _mm512_dpbf16_ps(s0, qc, (__m512bh)k[c]);
      else s1 = _mm512_dpbf16_ps(s1, qc, (__m512bh)k[c]);
    }
    if constexpr (NC % 2) s1 = _mm512_fmadd_ps(load16(q + 32 * NP), tail, s1);
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1)) * scale;
  }
};
#endif

// acc[g, :] = acc[g, :] * alpha[g] + sum_t p[g, t] * V[t, :] for GT query heads,
// the GT x NC accumulator tile kept in registers across the block's tokens.
template <typename T, int NC, int GT>
inline void accumulate_tile(const T* v_block, int64_t row, int64_t n, const float* p,
                            int64_t stride, const float* alpha, float* acc, int64_t D) {
  __m512 a[GT][NC];
  for (int g = 0; g < GT; ++g) {
    const __m512 al = _mm512_set1_ps(alpha[g]);
    for (int c = 0; c < NC; ++c) a[g][c] = _mm512_mul_ps(_mm512_loadu_ps(acc + g * D + 16 * c), al);
  }
  for (int64_t t = 0; t < n; ++t) {
    const T* v = v_block + t * row;
    __m512 pt[GT];
    for (int g = 0; g < GT; ++g) pt[g] = _mm512_set1_ps(p[g * stride + t]);
    if constexpr (kPairs<T>) {
      constexpr int NP = NC / 2;
      for (int c = 0; c < NP; ++c) {
        const __m512i x = _mm512_loadu_si512(v + 32 * c);
        const __m512 lo = _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), x));
        const __m512 hi = _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), x));
        for (int g = 0; g < GT; ++g) {
          a[g][2 * c] = _mm512_fmadd_ps(pt[g], lo, a[g][2 * c]);
          a[g][2 * c + 1] = _mm512_fmadd_ps(pt[g], hi, a[g][2 * c + 1]);
        }
      }
      if constexpr (NC % 2) {
        const __m512 vc = load16(v + 32 * NP);
        for (int g = 0; g < GT; ++g) a[g][NC - 1] = _mm512_fmadd_ps(pt[g], vc, a[g][NC - 1]);
      }
    } else {
      for (int c = 0; c < NC; ++c) {
        const __m512 vc = load16(v + 16 * c);
        for (int g = 0; g < GT; ++g) a[g][c] = _mm512_fmadd_ps(pt[g], vc, a[g][c]);
      }
    }
  }
  for (int g = 0; g < GT; ++g)
    for (int c = 0; c < NC; ++c) _mm512_storeu_ps(acc + g * D + 16 * c, a[g][c]);
}

// Tile of query heads for the accumulator: GT x NC registers, at most 16.
template <int NC>
constexpr int kHeadTile = NC >= 16 ? 1 : 16 / NC;

template <typename T, int NC, int GT>
inline void accumulate_heads(const T* v_block, int64_t row, int64_t n, ScratchV2& w, int64_t G,
                             int64_t D) {
  int64_t g = 0;
  for (; g + GT <= G; g += GT)
    accumulate_tile<T, NC, GT>(v_block, row, n, &w.scores[g * w.stride], w.stride, &w.alpha[g],
                               &w.acc[g * D], D);
  for (; g < G; ++g)  // leftover heads one at a time
    accumulate_tile<T, NC, 1>(v_block, row, n, &w.scores[g * w.stride], w.stride, &w.alpha[g],
                              &w.acc[g * D], D);
}

// Position in the accumulator of output element d (see kPairs).
template <typename T, int NC>
inline int64_t acc_index(int64_t d) {
  if constexpr (kPairs<T>) {
    const int64_t c = d / 32, i = d % 32;
    if (c < NC / 2) return 32 * c + (i % 8 < 4 ? 0 : 16) + (i / 8) * 4 + i % 4;
  }
  return d;
}

template <typename T>
inline void prefetch_rows(const T* block, int64_t row, int64_t n, int64_t bytes) {
  for (int64_t t = 0; t < n; ++t) {
    const char* p = reinterpret_cast<const char*>(block + t * row);
    for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T1);
  }
}

// Attends the G query heads of (sequence s, KV head kvh) over the sequence's
// logical blocks [j0, j1); leaves the running max, sum and accumulator in w.
template <typename T, int NC>
void decode_item_v2(const DecodeArgs& a, int64_t s, int64_t kvh, int64_t j0, int64_t j1, ScratchV2& w) {
  constexpr int D = 16 * NC;
  const int64_t G = a.num_heads / a.num_kv_heads, B = a.block_size, stride = w.stride;
  const int64_t row = a.num_kv_heads * D;  // elements between tokens of one head
  const T* query = static_cast<const T*>(a.query) + s * a.q_stride_s + kvh * G * a.q_stride_h;
  const T* key_cache = static_cast<const T*>(a.key_cache) + kvh * D;
  const T* value_cache = static_cast<const T*>(a.value_cache) + kvh * D;
  const int32_t* table = a.block_tables + s * a.max_blocks;
  const int64_t ctx = a.context_lens[s];
  const float scale = static_cast<float>(a.scale);

  for (int64_t g = 0; g < G; ++g) {
    const T* q = query + g * a.q_stride_h;
    for (int c = 0; c < NC; ++c) {
      _mm512_storeu_ps(&w.q[g * D + 16 * c], _mm512_mul_ps(load16(q + 16 * c), _mm512_set1_ps(scale)));
      _mm512_storeu_ps(&w.acc[g * D + 16 * c], _mm512_setzero_ps());
    }
    w.m[g] = -std::numeric_limits<float>::infinity();
    w.l[g] = 0.0f;
  }

  for (int64_t j = j0; j < j1; ++j) {
    const int64_t n = std::min(B, ctx - j * B);
    const T* k_block = key_cache + static_cast<int64_t>(table[j]) * B * row;  // token t at + t * row
    const T* v_block = value_cache + static_cast<int64_t>(table[j]) * B * row;
    // The next block is elsewhere and this head's rows in it are H_kv * D
    // apart, a new page each: hardware prefetchers do not follow. Ask for them
    // now, into L2 (into L1 they would evict the rows in use). Measured: 2x on
    // caches beyond L3.
    if (j + 1 < j1) {
      const int64_t next = static_cast<int64_t>(table[j + 1]) * B * row;
      const int64_t n_next = std::min(B, ctx - (j + 1) * B);
      prefetch_rows(key_cache + next, row, n_next, D * int64_t(sizeof(T)));
      prefetch_rows(value_cache + next, row, n_next, D * int64_t(sizeof(T)));
    }

    // 1. scores[g, t] = q_g . k_t for the whole group, each key row loaded once
    for (int64_t t = 0; t < n; ++t) {
      KeyRow<T, NC> k;
      k.load(k_block + t * row);
      for (int64_t g = 0; g < G; ++g) {
        if constexpr (kPairs<T>) w.scores[g * stride + t] = k.dot(query + g * a.q_stride_h, scale);
        else w.scores[g * stride + t] = k.dot(&w.q[g * D], 0);
      }
    }

    // 2. online softmax, 16 tokens per instruction: block max, new running max,
    //    p = exp(score - m) in place of the score, running sum rescaled by alpha
    for (int64_t g = 0; g < G; ++g) {
      float* sc = &w.scores[g * stride];
      __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
      for (int64_t t = 0; t < n; t += 16)
        mx = _mm512_mask_max_ps(mx, tail_mask(n - t), mx, _mm512_loadu_ps(sc + t));
      const float m_old = w.m[g];
      const float m_new = std::max(m_old, _mm512_reduce_max_ps(mx));
      const __m512 mv = _mm512_set1_ps(m_new);
      __m512 sum = _mm512_setzero_ps();
      for (int64_t t = 0; t < n; t += 16) {
        const __mmask16 k = tail_mask(n - t);
        const __m512 p = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, sc + t), mv));
        _mm512_mask_storeu_ps(sc + t, k, p);
        sum = _mm512_mask_add_ps(sum, k, sum, p);
      }
      const float alpha = m_new == m_old ? 1.0f : std::exp(m_old - m_new);  // 0 on block 0
      w.alpha[g] = alpha;
      w.l[g] = w.l[g] * alpha + _mm512_reduce_add_ps(sum);
      w.m[g] = m_new;
    }

    // 3. acc = acc * alpha + p V, each value row loaded once per head tile
    accumulate_heads<T, NC, kHeadTile<NC>>(v_block, row, n, w, G, D);
  }

}

// out = acc / l for the G query heads of (s, kvh).
template <typename T, int NC>
void write_out(const DecodeArgs& a, int64_t s, int64_t kvh, const ScratchV2& w) {
  const int64_t G = a.num_heads / a.num_kv_heads;
  T* out = static_cast<T*>(a.out) + s * a.out_stride_s + kvh * G * a.out_stride_h;
  for (int64_t g = 0; g < G; ++g) {
    T* o = out + g * a.out_stride_h;
    const float inv = 1.0f / w.l[g];
    for (int64_t d = 0; d < 16 * NC; ++d) o[d] = static_cast<T>(w.acc[g * 16 * NC + acc_index<T, NC>(d)] * inv);
  }
}

// Blocks per partition of a sequence: 0 (none) when sequences x KV heads
// already give every thread a couple of items; else enough partitions of at
// least 256 tokens to occupy the threads (few long sequences, many cores).
inline int64_t partition_blocks(const DecodeArgs& a) {
  if (a.partition_blocks >= 0) return a.partition_blocks;
  const int64_t items = a.num_seqs * a.num_kv_heads, want = 2 * int64_t(a.num_threads);
  if (items >= want) return 0;
  int64_t max_blocks = 0;
  for (int64_t s = 0; s < a.num_seqs; ++s)
    max_blocks = std::max<int64_t>(max_blocks, (a.context_lens[s] + a.block_size - 1) / a.block_size);
  const int64_t parts = (want + items - 1) / items;
  const int64_t blocks = std::max((max_blocks + parts - 1) / parts, (256 + a.block_size - 1) / a.block_size);
  return blocks >= max_blocks ? 0 : blocks;
}

template <typename T, int NC>
void run_v2(const DecodeArgs& a) {
  constexpr int D = 16 * NC;
  const int64_t H_kv = a.num_kv_heads, G = a.num_heads / H_kv, B = a.block_size;
  auto blocks_of = [&](int64_t s) { return (a.context_lens[s] + B - 1) / B; };
  const int64_t pb = partition_blocks(a);
  if (pb == 0) {  // one item per (sequence, KV head): the whole sequence
    for_each_item<ScratchV2>(a, a.num_seqs * H_kv, [&](int64_t i, ScratchV2& w) {
      const int64_t s = i / H_kv, kvh = i % H_kv;
      decode_item_v2<T, NC>(a, s, kvh, 0, blocks_of(s), w);
      write_out<T, NC>(a, s, kvh, w);
    });
    return;
  }
  // Split-context (vLLM's v2 idea): partition p of a sequence covers blocks
  // [p * pb, (p + 1) * pb); each keeps its own max m_p, sum l_p and
  // accumulator; then out = sum_p exp(m_p - m) acc_p / sum_p exp(m_p - m) l_p.
  int64_t parts = 1;
  for (int64_t s = 0; s < a.num_seqs; ++s) parts = std::max(parts, (blocks_of(s) + pb - 1) / pb);
  const int64_t heads = a.num_seqs * a.num_heads;  // partial state index: (s * H + h) * parts + p
  std::vector<float> m(heads * parts), l(heads * parts), acc(heads * parts * D);
  for_each_item<ScratchV2>(a, a.num_seqs * H_kv * parts, [&](int64_t i, ScratchV2& w) {
    const int64_t p = i % parts, kvh = (i / parts) % H_kv, s = i / (parts * H_kv);
    const int64_t j0 = p * pb, j1 = std::min(blocks_of(s), j0 + pb);
    for (int64_t g = 0; g < G; ++g) {
      const int64_t at = (s * a.num_heads + kvh * G + g) * parts + p;
      m[at] = -std::numeric_limits<float>::infinity();
      l[at] = 0.0f;  // an empty partition weighs nothing
    }
    if (j0 >= j1) return;
    decode_item_v2<T, NC>(a, s, kvh, j0, j1, w);
    for (int64_t g = 0; g < G; ++g) {
      const int64_t at = (s * a.num_heads + kvh * G + g) * parts + p;
      m[at] = w.m[g];
      l[at] = w.l[g];
      std::copy(&w.acc[g * D], &w.acc[g * D] + D, &acc[at * D]);
    }
  });
  for_each_item<ScratchV2>(a, heads, [&](int64_t i, ScratchV2& w) {
    const int64_t s = i / a.num_heads, h = i % a.num_heads;
    float m_all = -std::numeric_limits<float>::infinity(), l_all = 0.0f;
    for (int64_t p = 0; p < parts; ++p) m_all = std::max(m_all, m[i * parts + p]);
    float* total = &w.acc[0];  // D floats of this thread's scratch
    std::fill(total, total + D, 0.0f);
    for (int64_t p = 0; p < parts; ++p) {
      if (l[i * parts + p] == 0.0f) continue;
      const float weight = std::exp(m[i * parts + p] - m_all);
      l_all += weight * l[i * parts + p];
      for (int64_t d = 0; d < D; ++d) total[d] += weight * acc[(i * parts + p) * D + d];
    }
    T* o = static_cast<T*>(a.out) + s * a.out_stride_s + h * a.out_stride_h;
    for (int64_t d = 0; d < D; ++d) o[d] = static_cast<T>(total[acc_index<T, NC>(d)] / l_all);
  });
}

template <typename T>
bool dispatch_head_dim(const DecodeArgs& a) {
  switch (a.head_dim) {
    case 16: run_v2<T, 1>(a); return true;
    case 32: run_v2<T, 2>(a); return true;
    case 48: run_v2<T, 3>(a); return true;
    case 64: run_v2<T, 4>(a); return true;
    case 80: run_v2<T, 5>(a); return true;
    case 96: run_v2<T, 6>(a); return true;
    case 112: run_v2<T, 7>(a); return true;
    case 128: run_v2<T, 8>(a); return true;
    case 160: run_v2<T, 10>(a); return true;
    case 192: run_v2<T, 12>(a); return true;
    case 256: run_v2<T, 16>(a); return true;
    default: return false;
  }
}

#endif  // __AVX512F__

}  // namespace

bool paged_attention_decode_v2(const DecodeArgs& a) {
#if defined(__AVX512F__)
  switch (a.dtype) {
    case DType::kFloat32: return dispatch_head_dim<float>(a);
    case DType::kBFloat16: return dispatch_head_dim<c10::BFloat16>(a);
    default: return false;
  }
#else
  (void)a;
  return false;
#endif
}

bool v2_compiled() {
#if defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

}  // namespace paged
