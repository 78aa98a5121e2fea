// PagedAttention on the CPU, AVX2: the scalar kernel's arithmetic, operation
// for operation, in 8-float vectors (docs/kernels.md).
//
// paged_attention_scalar.cpp is the specification; this file does exactly its
// operations on every query row, so its output is bitwise the scalar kernel's
// (tests/kernels/test_cpu_avx2_attention.py): on a CPU without AVX-512 a
// prompt's bits stay those of the decode of each of its tokens, and a
// sequence's bits do not depend on which of the two ran it.
// A work item's rows go through each KV block 8 at a time, one row per lane: the
// scores of one key for 8 rows are one vector, and so are their running maxima and
// sums, so each step of the online softmax is one vector operation for 8 rows, each
// lane the scalar's operation for its row.
//   * q . k: the scalar's 16 running lanes are two vectors (lanes 0-7, 8-15),
//     each step a product rounded, then added (no fused multiply-add: the
//     build has -ffp-contract=off); the scalar's tree (lane l += lane l + 8,
//     + 4, + 2, + 1) is one vector add, then, for the 8 rows of a key at once,
//     7 adds of halves and quarters gathered by shuffles (lane_trees8). Head
//     dims that are a multiple of 16 only (the scalar's tail lanes are not done
//     here); up to 64 the key stays in registers across the 8 rows.
//   * the soft-cap is the scalar's own std::tanh, one value at a time; the
//     running maximum is std::max as _mm256_max_ps (the same choice, a NaN
//     score included), the exponentials softmax_exp.h's (exp_nonpositive8: the
//     scalar's exp_nonpositive, operation for operation), the sum of
//     probabilities one vector add per key; a key a row does not see (past its
//     context, before its window) is -inf to the maximum and +0 to the sum,
//     which leave them as they were, and a row that sees none of a block keeps
//     its maximum and sum;
//   * the rescale (acc *= alpha) and the V accumulation (acc += p * v, the
//     product rounded first) are the scalar's loops as vectors, one row at a
//     time: each element gets the same roundings in the same order. The
//     accumulator stays in registers, 64 dims at a time, across a block's keys.
// What it saves: a work item holds many query rows (the G query heads of a KV
// head, times a tile of query tokens in a prefill), and each KV block is
// widened to float32 once for all of them instead of once per row; the
// softmax's serial chains (a maximum and a sum per key, for each row) run for
// 8 rows at once; and the loops are vector code whatever the compiler makes of
// the scalar's.
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

// One query row: its scaled query, accumulator, running maximum and sum, the
// keys it sees (lo .. ctx - 1), and where its output goes.
struct Row {
  float* q;
  float* acc;
  float m, l;
  int64_t lo, ctx;
  void* out;
};

// Rows are attended 8 at a time, one row per lane: the scores of one key for 8 rows are
// one vector, and so are the 8 running maxima and sums, so the softmax's steps (a maximum,
// an exp, a sum per key) are vector operations on 8 rows at once, each lane the scalar's
// operation for its row.
constexpr int kGroup = 8;

struct Scratch {
  std::vector<float> q, acc, k, v, scores, probs;  // scores and probs: [key][row of the group]
  std::vector<Row> rows;
  Scratch(int64_t max_rows, int64_t B, int64_t D)
      : q(max_rows * D), acc(max_rows * D), k(B * D), v(B * D), scores(B * kGroup), probs(B * kGroup) {
    rows.reserve(max_rows);
  }
};

// The scalar's 16 lanes of q . k for D % 16 == 0 (lanes 0-7 and 8-15 as two vectors, each
// step a product rounded then added), summed up to the vector lane_tree8 takes: lanes 0-7
// plus lanes 8-15, the first step of the scalar's tree.
inline __m256 lanes16(const float* q, const float* k, int64_t D) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  for (int64_t d = 0; d < D; d += 16) {
    lo = _mm256_add_ps(lo, _mm256_mul_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d)));
    hi = _mm256_add_ps(hi, _mm256_mul_ps(_mm256_loadu_ps(q + d + 8), _mm256_loadu_ps(k + d + 8)));
  }
  return _mm256_add_ps(lo, hi);
}

// The same with the key in registers (k[2i], k[2i + 1]: dims 16i .. 16i + 15), S = D / 16 <= 4.
template <int S>
inline __m256 lanes16_held(const float* q, const __m256* k) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  for (int i = 0; i < S; ++i) {
    lo = _mm256_add_ps(lo, _mm256_mul_ps(_mm256_loadu_ps(q + 16 * i), k[2 * i]));
    hi = _mm256_add_ps(hi, _mm256_mul_ps(_mm256_loadu_ps(q + 16 * i + 8), k[2 * i + 1]));
  }
  return _mm256_add_ps(lo, hi);
}

// scores[t][i] = q_i . k_t (dot_in_lanes of the scalar) for keys tlo .. thi - 1 of a block
// (rows D apart in k) and the group's rows g[0 .. count - 1]; lanes past count are 0.
template <int S>
inline void group_scores_held(const Row* g, int count, const float* k, int64_t tlo, int64_t thi, float* scores) {
  for (int64_t t = tlo; t < thi; ++t) {
    __m256 kv[2 * S];
    for (int i = 0; i < 2 * S; ++i) kv[i] = _mm256_loadu_ps(k + t * 16 * S + 8 * i);
    _mm256_storeu_ps(scores + t * kGroup, lane_trees8([&](int i) {
                       return i < count ? lanes16_held<S>(g[i].q, kv) : _mm256_setzero_ps();
                     }));
  }
}

inline void group_scores(const Row* g, int count, const float* k, int64_t D, int64_t tlo, int64_t thi,
                         float* scores) {
  switch (D) {
    case 16: return group_scores_held<1>(g, count, k, tlo, thi, scores);
    case 32: return group_scores_held<2>(g, count, k, tlo, thi, scores);
    case 48: return group_scores_held<3>(g, count, k, tlo, thi, scores);
    case 64: return group_scores_held<4>(g, count, k, tlo, thi, scores);
  }
  for (int64_t t = tlo; t < thi; ++t)
    _mm256_storeu_ps(scores + t * kGroup, lane_trees8([&](int i) {
                       return i < count ? lanes16(g[i].q, k + t * D, D) : _mm256_setzero_ps();
                     }));
}

// acc[0 .. 8V) = acc * alpha + sum over t in [t0, n) of p[t * kGroup] * v[t] (rows of v D apart),
// in the scalar's order for each element: the rescale, then one rounded product and one add per key.
template <int V>
inline void rescale_and_accumulate(float* acc, float alpha, const float* p, const float* v, int64_t t0,
                                   int64_t n, int64_t D) {
  __m256 a[V];
  const __m256 va = _mm256_set1_ps(alpha);
  for (int i = 0; i < V; ++i) a[i] = _mm256_mul_ps(_mm256_loadu_ps(acc + 8 * i), va);
  for (int64_t t = t0; t < n; ++t) {
    const __m256 vp = _mm256_set1_ps(p[t * kGroup]);
    for (int i = 0; i < V; ++i) a[i] = _mm256_add_ps(a[i], _mm256_mul_ps(vp, _mm256_loadu_ps(v + t * D + 8 * i)));
  }
  for (int i = 0; i < V; ++i) _mm256_storeu_ps(acc + 8 * i, a[i]);
}

// One KV block for a group of up to 8 rows (keys t0[i] .. n[i] - 1 of the block for row i;
// none where t0[i] == n[i]): decode_item_scalar's steps for the block, each row in its lane.
inline void attend_block(const DecodeArgs& a, Row* g, int count, const int32_t (&t0)[kGroup],
                         const int32_t (&n)[kGroup], Scratch& w) {
  const int64_t D = a.head_dim;
  int64_t tlo = a.block_size, thi = 0;
  for (int i = 0; i < count; ++i)
    if (t0[i] < n[i]) tlo = std::min<int64_t>(tlo, t0[i]), thi = std::max<int64_t>(thi, n[i]);
  if (tlo >= thi) return;  // no row of the group sees this block
  float* scores = w.scores.data();
  float* probs = w.probs.data();
  group_scores(g, count, w.k.data(), D, tlo, thi, scores);
  if (a.softcap > 0) {  // the scalar's std::tanh, for each row's own keys only (a decode's G rows leave lanes idle)
    const float cap = static_cast<float>(a.softcap);
    for (int i = 0; i < count; ++i)
      for (int64_t t = t0[i]; t < n[i]; ++t) scores[t * kGroup + i] = cap * std::tanh(scores[t * kGroup + i] / cap);
  }
  // The lanes of row i hold its keys t0[i] <= t < n[i]; the others take no part: a score of
  // -inf leaves the maximum as it was (as the scalar's loop, not reaching them), a
  // probability of +0 leaves the sum as it was (it is +0 or more).
  const __m256i vt0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t0));
  const __m256i vn = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(n));
  auto holds = [&](int64_t t) {
    const __m256i vt = _mm256_set1_epi32(static_cast<int32_t>(t));
    return _mm256_castsi256_ps(_mm256_andnot_si256(_mm256_cmpgt_epi32(vt0, vt), _mm256_cmpgt_epi32(vn, vt)));
  };
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  alignas(32) float m[kGroup], l[kGroup], alpha[kGroup];
  for (int i = 0; i < kGroup; ++i) m[i] = i < count ? g[i].m : 0.0f, l[i] = i < count ? g[i].l : 0.0f;
  const __m256 m_old = _mm256_load_ps(m);
  // block_max = std::max(block_max, score) is _mm256_max_ps(score, block_max): the score where
  // block_max < score, else block_max (a NaN score included)
  __m256 block_max = ninf;
  for (int64_t t = tlo; t < thi; ++t)
    block_max = _mm256_max_ps(_mm256_blendv_ps(ninf, _mm256_loadu_ps(scores + t * kGroup), holds(t)), block_max);
  const __m256 m_new = _mm256_max_ps(block_max, m_old);
  const __m256 va = exp_nonpositive8(_mm256_sub_ps(m_old, m_new));
  __m256 vl = _mm256_mul_ps(_mm256_load_ps(l), va);
  for (int64_t t = tlo; t < thi; ++t) {
    const __m256 p = _mm256_and_ps(exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(scores + t * kGroup), m_new)),
                                   holds(t));
    _mm256_storeu_ps(probs + t * kGroup, p);
    vl = _mm256_add_ps(vl, p);
  }
  _mm256_store_ps(m, m_new);
  _mm256_store_ps(l, vl);
  _mm256_store_ps(alpha, va);
  for (int i = 0; i < count; ++i) {
    if (t0[i] >= n[i]) continue;  // the scalar's loop for this row skips the block: m, l, acc as they were
    Row& r = g[i];
    r.m = m[i], r.l = l[i];
    const float* p = probs + i;
    int64_t d = 0;  // D is a multiple of 16: chunks of 64 dims, then one of 16, 32 or 48
    for (; d + 64 <= D; d += 64) rescale_and_accumulate<8>(r.acc + d, alpha[i], p, &w.v[d], t0[i], n[i], D);
    if (D - d == 48) rescale_and_accumulate<6>(r.acc + d, alpha[i], p, &w.v[d], t0[i], n[i], D);
    if (D - d == 32) rescale_and_accumulate<4>(r.acc + d, alpha[i], p, &w.v[d], t0[i], n[i], D);
    if (D - d == 16) rescale_and_accumulate<2>(r.acc + d, alpha[i], p, &w.v[d], t0[i], n[i], D);
  }
}

// Rows of one KV head of one sequence (block table `table`) over their keys:
// decode_item_scalar's loop, each KV block widened once for all the rows.
template <typename T>
void attend_rows(const DecodeArgs& a, const int32_t* table, int64_t kvh, Scratch& w) {
  const int64_t D = a.head_dim, B = a.block_size, row_stride = a.num_kv_heads * D;
  const T* key_cache = static_cast<const T*>(a.key_cache);
  const T* value_cache = static_cast<const T*>(a.value_cache);
  int64_t first = std::numeric_limits<int64_t>::max(), end = 0;
  for (const Row& r : w.rows) first = std::min(first, r.lo / B), end = std::max(end, r.ctx);
  const int64_t R = static_cast<int64_t>(w.rows.size());

  for (int64_t j = first; j * B < end; ++j) {
    const int64_t filled = std::min(B, end - j * B);  // the most slots any row reads here
    const int64_t base = (static_cast<int64_t>(table[j]) * B * a.num_kv_heads + kvh) * D;
    for (int64_t t = 0; t < filled; ++t)
      for (int64_t d = 0; d < D; d += 8) {
        _mm256_storeu_ps(&w.k[t * D + d], load8(key_cache + base + t * row_stride + d));
        _mm256_storeu_ps(&w.v[t * D + d], load8(value_cache + base + t * row_stride + d));
      }
    for (int64_t r0 = 0; r0 < R; r0 += kGroup) {
      const int count = static_cast<int>(std::min<int64_t>(kGroup, R - r0));
      int32_t t0[kGroup] = {}, n[kGroup] = {};
      for (int i = 0; i < count; ++i) {
        const Row& r = w.rows[r0 + i];
        if (j < r.lo / B || j * B >= r.ctx) continue;  // the scalar's loop for this row skips block j
        n[i] = static_cast<int32_t>(std::min(B, r.ctx - j * B));
        t0[i] = static_cast<int32_t>(std::max<int64_t>(0, r.lo - j * B));
      }
      attend_block(a, &w.rows[r0], count, t0, n, w);
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
