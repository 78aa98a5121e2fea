// PagedAttention on the CPU, AVX2: the scalar kernel's arithmetic, operation
// for operation, in 8-float vectors (docs/kernels.md).
//
// paged_attention_scalar.cpp is the specification; this file does exactly its
// operations on every query row, so its output is bitwise the scalar kernel's
// (tests/kernels/test_cpu_avx2_attention.py): on a CPU without AVX-512 a
// prompt's bits stay those of the decode of each of its tokens, and a
// sequence's bits do not depend on which of the two ran it.
//   * q . k: the scalar's 16 running lanes are two vectors (lanes 0-7, 8-15),
//     each step a product rounded, then added (no fused multiply-add: the
//     build has -ffp-contract=off); the scalar's tree (lane l += lane l + 8,
//     + 4, + 2, + 1) is one vector add, then adds of halves. Head dims that
//     are a multiple of 16 only (the scalar's tail lanes are not done here);
//     up to 64 the query stays in registers across a block's keys.
//   * the soft-cap and the running maximum are the scalar's own calls
//     (std::tanh, std::max), one value at a time; the exponentials are
//     softmax_exp.h's, eight scores at a time (exp_nonpositive8: the scalar's
//     exp_nonpositive, operation for operation);
//   * the rescale (acc *= alpha) and the V accumulation (acc += p * v, the
//     product rounded first) are the scalar's loops as vectors: each element
//     gets the same roundings in the same order. The accumulator stays in
//     registers, 64 dims at a time, across a block's keys.
// What it saves: a work item holds many query rows (the G query heads of a KV
// head, times a tile of query tokens in a prefill), and each KV block is
// widened to float32 once for all of them instead of once per row; and the
// loops are vector code whatever the compiler makes of the scalar's.
//
// Work items as the scalar's: decode (sequence, KV head); prefill (sequence,
// tile of query tokens, KV head), the last tiles first, tiles made smaller
// for a call with few tokens (detail::query_tile_for_threads); a call too small to
// pay for waking a second thread runs on one (detail::threads_for_pairs). Which
// rows share an item, and which thread runs it, changes nothing in a row's arithmetic.

#include "paged_attention.h"
#include "softmax_exp.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include "lane_tree.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>
#endif

namespace paged {
namespace {

#if defined(__AVX2__) && defined(__FMA__)
using detail::for_each_item;

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {  // a bfloat16 is the top half of a float32: exact
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// The scalar's tree over its 16 lanes, lanes 0-7 in lo and 8-15 in hi: l += l + 8, then lane_tree8.
inline float lane_tree16(__m256 lo, __m256 hi) { return lane_tree8(_mm256_add_ps(lo, hi)); }

// dot_in_lanes of paged_attention_scalar.cpp for D % 16 == 0.
inline float dot16(const float* q, const float* k, int64_t D) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  for (int64_t d = 0; d < D; d += 16) {
    lo = _mm256_add_ps(lo, _mm256_mul_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d)));
    hi = _mm256_add_ps(hi, _mm256_mul_ps(_mm256_loadu_ps(q + d + 8), _mm256_loadu_ps(k + d + 8)));
  }
  return lane_tree16(lo, hi);
}

// dot16 with the query already in registers (q[2i], q[2i + 1]: dims 16i .. 16i + 15), S = D / 16 <= 4:
// the same products and sums, without reloading the query for every key.
template <int S>
inline float dot16_held(const __m256* q, const float* k) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  for (int i = 0; i < S; ++i) {
    lo = _mm256_add_ps(lo, _mm256_mul_ps(q[2 * i], _mm256_loadu_ps(k + 16 * i)));
    hi = _mm256_add_ps(hi, _mm256_mul_ps(q[2 * i + 1], _mm256_loadu_ps(k + 16 * i + 8)));
  }
  return lane_tree16(lo, hi);
}

// The scores of keys t0 .. n - 1 of a block (rows D apart in k) for query q.
template <int S>
inline void scores_held(const float* q, const float* k, int64_t t0, int64_t n, float* scores) {
  __m256 qv[2 * S];
  for (int i = 0; i < 2 * S; ++i) qv[i] = _mm256_loadu_ps(q + 8 * i);
  for (int64_t t = t0; t < n; ++t) scores[t] = dot16_held<S>(qv, k + t * 16 * S);
}

inline void block_scores(const float* q, const float* k, int64_t D, int64_t t0, int64_t n, float* scores) {
  switch (D) {
    case 16: scores_held<1>(q, k, t0, n, scores); break;
    case 32: scores_held<2>(q, k, t0, n, scores); break;
    case 48: scores_held<3>(q, k, t0, n, scores); break;
    case 64: scores_held<4>(q, k, t0, n, scores); break;
    default: for (int64_t t = t0; t < n; ++t) scores[t] = dot16(q, k + t * D, D);
  }
}

// One query row: its scaled query, accumulator, running maximum and sum, the
// keys it sees (lo .. ctx - 1), and where its output goes.
struct Row {
  float* q;
  float* acc;
  float m, l;
  int64_t lo, ctx;
  void* out;
};

struct Scratch {
  std::vector<float> q, acc, k, v, scores, probs;
  std::vector<Row> rows;
  Scratch(int64_t max_rows, int64_t B, int64_t D)
      : q(max_rows * D), acc(max_rows * D), k(B * D), v(B * D), scores(B), probs(B) {
    rows.reserve(max_rows);
  }
};

// acc[0 .. 8V) = acc * alpha + sum over t in [t0, n) of p[t] * v[t] (rows of v D apart), in the
// scalar's order for each element: the rescale, then one rounded product and one add per key.
template <int V>
inline void rescale_and_accumulate(float* acc, float alpha, const float* p, const float* v, int64_t t0,
                                   int64_t n, int64_t D) {
  __m256 a[V];
  const __m256 va = _mm256_set1_ps(alpha);
  for (int i = 0; i < V; ++i) a[i] = _mm256_mul_ps(_mm256_loadu_ps(acc + 8 * i), va);
  for (int64_t t = t0; t < n; ++t) {
    const __m256 vp = _mm256_set1_ps(p[t]);
    for (int i = 0; i < V; ++i) a[i] = _mm256_add_ps(a[i], _mm256_mul_ps(vp, _mm256_loadu_ps(v + t * D + 8 * i)));
  }
  for (int i = 0; i < V; ++i) _mm256_storeu_ps(acc + 8 * i, a[i]);
}

// Rows of one KV head of one sequence (block table `table`) over their keys:
// decode_item_scalar's loop, each KV block widened once for all the rows.
template <typename T>
void attend_rows(const DecodeArgs& a, const int32_t* table, int64_t kvh, Scratch& w) {
  const int64_t D = a.head_dim, B = a.block_size, row_stride = a.num_kv_heads * D;
  const T* key_cache = static_cast<const T*>(a.key_cache);
  const T* value_cache = static_cast<const T*>(a.value_cache);
  const float cap = static_cast<float>(a.softcap);
  int64_t first = std::numeric_limits<int64_t>::max(), end = 0;
  for (const Row& r : w.rows) first = std::min(first, r.lo / B), end = std::max(end, r.ctx);

  for (int64_t j = first; j * B < end; ++j) {
    const int64_t filled = std::min(B, end - j * B);  // the most slots any row reads here
    const int64_t base = (static_cast<int64_t>(table[j]) * B * a.num_kv_heads + kvh) * D;
    for (int64_t t = 0; t < filled; ++t)
      for (int64_t d = 0; d < D; d += 8) {
        _mm256_storeu_ps(&w.k[t * D + d], load8(key_cache + base + t * row_stride + d));
        _mm256_storeu_ps(&w.v[t * D + d], load8(value_cache + base + t * row_stride + d));
      }
    for (Row& r : w.rows) {
      if (j < r.lo / B || j * B >= r.ctx) continue;  // the scalar's loop for this row skips block j
      const int64_t n = std::min(B, r.ctx - j * B);
      const int64_t t0 = std::max<int64_t>(0, r.lo - j * B);
      block_scores(r.q, w.k.data(), D, t0, n, w.scores.data());
      float block_max = -std::numeric_limits<float>::infinity();
      for (int64_t t = t0; t < n; ++t) {
        if (a.softcap > 0) w.scores[t] = cap * std::tanh(w.scores[t] / cap);
        block_max = std::max(block_max, w.scores[t]);
      }
      const float m_new = std::max(r.m, block_max);
      const float alpha = exp_nonpositive(r.m - m_new);
      r.l *= alpha;
      float* p = w.probs.data();
      const __m256 vm = _mm256_set1_ps(m_new);
      int64_t t = t0;
      for (; t + 8 <= n; t += 8) _mm256_storeu_ps(p + t, exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(&w.scores[t]), vm)));
      for (; t < n; ++t) p[t] = exp_nonpositive(w.scores[t] - m_new);
      for (t = t0; t < n; ++t) r.l += p[t];
      int64_t d = 0;  // D is a multiple of 16: chunks of 64 dims, then one of 16, 32 or 48
      for (; d + 64 <= D; d += 64) rescale_and_accumulate<8>(r.acc + d, alpha, p, &w.v[d], t0, n, D);
      if (D - d == 48) rescale_and_accumulate<6>(r.acc + d, alpha, p, &w.v[d], t0, n, D);
      if (D - d == 32) rescale_and_accumulate<4>(r.acc + d, alpha, p, &w.v[d], t0, n, D);
      if (D - d == 16) rescale_and_accumulate<2>(r.acc + d, alpha, p, &w.v[d], t0, n, D);
      r.m = m_new;
    }
  }
  for (const Row& r : w.rows) {
    T* o = static_cast<T*>(r.out);
    const float inv = 1.0f / r.l;
    for (int64_t d = 0; d < D; ++d) o[d] = static_cast<T>(r.acc[d] * inv);
  }
}

// Adds the G rows of query head group kvh of one token (query at `query`, its
// output at `out`) that sees keys lo .. ctx - 1.
template <typename T>
void add_rows(const DecodeArgs& a, const T* query, T* out, int64_t ctx, Scratch& w) {
  const int64_t G = a.num_heads / a.num_kv_heads, D = a.head_dim;
  const float scale = static_cast<float>(a.scale);
  for (int64_t g = 0; g < G; ++g) {
    const int64_t i = static_cast<int64_t>(w.rows.size());
    float* q = &w.q[i * D];
    float* acc = &w.acc[i * D];
    const T* src = query + g * a.q_stride_h;
    for (int64_t d = 0; d < D; ++d) {
      q[d] = static_cast<float>(src[d]) * scale;
      acc[d] = 0;
    }
    w.rows.push_back({q, acc, -std::numeric_limits<float>::infinity(), 0.0f, first_key(a, ctx - 1), ctx,
                      out + g * a.out_stride_h});
  }
}

template <typename T>
void run_decode(const DecodeArgs& args) {
  DecodeArgs a = args;
  int64_t keys = 0;
  for (int64_t s = 0; s < a.num_seqs; ++s) keys += a.context_lens[s];
  a.num_threads = detail::threads_for_pairs(a.num_threads, keys * a.num_heads, a.head_dim);
  const int64_t H_kv = a.num_kv_heads, G = a.num_heads / H_kv;
  struct Make {
    Scratch s;
    explicit Make(const DecodeArgs& a) : s(a.num_heads / a.num_kv_heads, a.block_size, a.head_dim) {}
  };
  for_each_item<Make>(a, a.num_seqs * H_kv, [&](int64_t i, Make& m) {
    Scratch& w = m.s;
    const int64_t s = i / H_kv, kvh = i % H_kv;
    w.rows.clear();
    add_rows<T>(a, static_cast<const T*>(a.query) + s * a.q_stride_s + kvh * G * a.q_stride_h,
                static_cast<T*>(a.out) + s * a.out_stride_s + kvh * G * a.out_stride_h, a.context_lens[s], w);
    attend_rows<T>(a, a.block_tables + s * a.max_blocks, kvh, w);
  });
}

template <typename T>
void run_prefill(const PrefillArgs& args) {
  PrefillArgs a = args;
  int64_t pairs = 0;  // query i of a sequence sees context - query_len + i + 1 keys
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    const int64_t n = a.query_lens[s];
    pairs += n * (a.context_lens[s] - n) + n * (n + 1) / 2;
  }
  a.num_threads = detail::threads_for_pairs(a.num_threads, pairs * a.num_heads, a.head_dim);
  const int64_t G = a.num_heads / a.num_kv_heads;
  const int64_t tile = detail::query_tile_for_threads(a);
  const std::vector<detail::PrefillItem> items = detail::prefill_items(a, tile);
  struct Make {  // rows for a tile of tokens
    Scratch s;
    explicit Make(const PrefillArgs& a)
        : s(detail::query_tile_for_threads(a) * (a.num_heads / a.num_kv_heads), a.block_size, a.head_dim) {}
  };
  for_each_item<Make>(a, static_cast<int64_t>(items.size()), [&](int64_t k, Make& m) {
    Scratch& w = m.s;
    const auto [s, i0, kvh] = items[k];
    const int64_t first = a.context_lens[s] - a.query_lens[s];  // position of query 0
    w.rows.clear();
    for (int64_t i = i0; i < std::min<int64_t>(a.query_lens[s], i0 + tile); ++i) {
      const int64_t t = a.query_starts[s] + i;  // its row in the packed query
      add_rows<T>(a, static_cast<const T*>(a.query) + t * a.q_stride_s + kvh * G * a.q_stride_h,
                  static_cast<T*>(a.out) + t * a.out_stride_s + kvh * G * a.out_stride_h, first + i + 1, w);
    }
    attend_rows<T>(a, a.block_tables + s * a.max_blocks, kvh, w);
  });
}

bool takes(const DecodeArgs& a) {
  return (a.dtype == DType::kFloat32 || a.dtype == DType::kBFloat16) && a.head_dim % 16 == 0;
}
#endif

}  // namespace

bool paged_attention_decode_avx2(const DecodeArgs& a) {
#if defined(__AVX2__) && defined(__FMA__)
  if (!takes(a)) return false;
  if (a.dtype == DType::kFloat32) run_decode<float>(a);
  else run_decode<c10::BFloat16>(a);
  return true;
#else
  (void)a;
  return false;
#endif
}

bool paged_attention_prefill_avx2(const PrefillArgs& a) {
#if defined(__AVX2__) && defined(__FMA__)
  if (!takes(a)) return false;
  if (a.dtype == DType::kFloat32) run_prefill<float>(a);
  else run_prefill<c10::BFloat16>(a);
  return true;
#else
  (void)a;
  return false;
#endif
}

bool avx2_compiled() {
#if defined(__AVX2__) && defined(__FMA__)
  return true;
#else
  return false;
#endif
}

}  // namespace paged
