// PagedAttention prefill on the CPU, AVX-512 (paper §4.1; docs/kernels.md).
//
// Many query tokens of a sequence (a prompt, a chunk of one, a prompt's tail
// after a prefix-cache hit, a recomputation) attend to the sequence's paged
// K/V, causally: the query at position p sees keys 0 .. p. Run as decode
// queries, token by token, a prompt of n tokens reads its K/V about n^2 / 2
// times; here a work item is a tile of query tokens x one KV head, and it walks
// the KV blocks once: each block is read once per tile, and the G query heads
// of the KV head share each read.
//
// Batch invariance. A token's output must not depend on what it is computed
// with (a whole prompt, a chunk of 7, a cache hit, a 1-token decode), so every
// query row does exactly what the decode kernel (paged_attention_avx512.cpp,
// without split-context) does for that token with context p + 1:
//   * its online softmax walks logical blocks 0, 1, 2, ... whose boundaries
//     sit at absolute positions j * B, the last one cut at p (n = min(B, p + 1
//     - j * B) tokens, as decode's n = min(B, ctx - j * B));
//   * a score is decode's KeyRow::dot: per lane of 16, one chain of VDPBF16PS
//     (or float) products over the head dim's chunks, then sum16's tree over
//     the lanes. Here 16 query rows share a vector, lane r being row r: the
//     query is transposed into columns once per tile, a key's 32-bit values
//     are broadcast, and sum16's tree becomes 15 vertical adds (sum16_lanes);
//   * the softmax update is decode's fold_scores 16 rows at a time (fold16:
//     the max is exact in any order, the sum keeps fold_scores's tree, alpha
//     is the same std::exp); the V accumulation (accumulate_rows) and the
//     output (store_row) are decode's own functions (attention_avx512.h).
// Which rows share a tile or a vector, the tile size and the thread change
// nothing in a row's arithmetic. tests/kernels/test_cpu_prefill.py checks
// every row bitwise against the decode kernel run for that token alone.
//
// Two implementations (bindings.cpp picks avx512 when it applies):
//   scalar  paged_attention_scalar.cpp: each query token as a decode query
//           over the keys up to its position; any dtype (float64 for tight
//           tests), any head dim. The specification.
//   avx512  this file: float32 and bfloat16, the head dims of
//           attention_avx512.h. Per tile: the query columns (once); per block:
//           the scores and the softmax update of every row that sees the block
//           (16 rows per vector, token by token), then V accumulated in
//           register tiles of rows: all rows that see the whole block
//           together, those of the diagonal block (which see part of it) query
//           by query. A tile of one query (a decode token in a mixed batch)
//           runs decode_item itself: the same bits, without the transposes.
//
// Scheduling: items (sequence, query tile, KV head), the costliest (latest
// tiles of long sequences) first, over torch's threads with a dynamic OpenMP
// schedule. Cost, measured: python -m paged.bench prefill_kernel.

#include "paged_attention.h"

#if defined(__AVX512F__)
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "attention_avx512.h"
#endif

namespace paged {
namespace {

#if defined(__AVX512F__)
using avx512::kPairs;
using avx512::Scratch;
using detail::for_each_item;

// Query columns of up to 16 rows: lane r of column w is row r's 32-bit
// element w: a bfloat16 pair of the raw query (16 per 32-value chunk) where
// the dot products take pairs (kPairs), else a float of the scaled query,
// including the widened 16-value tail of a bfloat16 row whose head dim is an
// odd number of 16s.
template <typename T, int NC>
constexpr int kQueryCols = kPairs<T> ? 16 * (NC / 2) + 16 * (NC % 2) : 16 * NC;

// Scratch of one thread. Row r of a tile is head g of query i (r = (i - i0) G + g);
// rows are handled 16 at a time, lane r % 16 of group r / 16.
struct PrefillScratch {
  int64_t padded;              // rows of a tile rounded up to 16
  Scratch rows;                // q, acc, m, l, alpha of each row (its scores are unused)
  std::vector<float> columns;  // [groups][query columns][16]
  std::vector<float> p;        // [B rounded up to 16][padded]: scores, then exp(score - m), token-major
  explicit PrefillScratch(const PrefillArgs& a)
      : padded((std::max<int64_t>(1, a.query_tile) * (a.num_heads / a.num_kv_heads) + 15) / 16 * 16),
        rows(a, padded),
        columns(padded * (a.head_dim / 16 + 1) * 16),
        p(rows.stride * padded) {}
};

// Columns of rows [r0, r0 + 16) of the tile; query(r) is row r's raw query,
// w.q its scaled one. Lanes of rows >= rows are zero.
template <typename T, int NC, typename Query>
void load_query_columns(Query query, const Scratch& w, int64_t r0, int64_t rows, float* columns) {
  __m512 r[16];
  auto chunk = [&](int c, auto load) {  // columns 16c .. 16c + 15 from 16 32-bit values of each row
    for (int64_t i = 0; i < 16; ++i) r[i] = r0 + i < rows ? load(r0 + i) : _mm512_setzero_ps();
    avx512::transpose16(r);
    for (int i = 0; i < 16; ++i) _mm512_storeu_ps(columns + (16 * c + i) * 16, r[i]);
  };
  if constexpr (kPairs<T>) {
    for (int c = 0; c < NC / 2; ++c)
      chunk(c, [&](int64_t x) { return _mm512_castsi512_ps(_mm512_loadu_si512(query(x) + 32 * c)); });
    if constexpr (NC % 2) chunk(NC / 2, [&](int64_t x) { return avx512::load16(query(x) + 32 * (NC / 2)); });
  } else {
    for (int c = 0; c < NC; ++c) chunk(c, [&](int64_t x) { return _mm512_loadu_ps(&w.q[x * 16 * NC + 16 * c]); });
  }
}

// Scores of NG groups of 16 query rows (their columns, group g at columns + g
// * group_stride) with TT key rows (key t at k + t * row): lane r of
// out[t * p_tok + 16 g] is KeyRow<T, NC>::dot of row r of group g with key t,
// bit for bit. Lane l of decode's chain becomes the vector x(l) over rows, and
// sum16's tree over lanes the same tree over the x(l): a_i = x(i+8) + x(i),
// b_i = a_{i+4} + a_i, then (b_0 + b_2) + (b_1 + b_3). Each column load
// serves TT keys and each key broadcast NG groups: loads, not arithmetic,
// bound this loop.
template <typename T, int NC, int NG, int TT>
inline void scores16(const float* columns, int64_t group_stride, const T* k, int64_t row, float scale, float* out,
                     int64_t p_tok) {
  auto col = [&](int g, int w) { return _mm512_loadu_ps(columns + g * group_stride + w * 16); };  // column w
  auto x = [&](int l, __m512 (*xs)[NG]) {  // xs[t][g]: lane l of decode's chain, for key t and group g
    if constexpr (kPairs<T>) {
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
      constexpr int NP = NC / 2;
      for (int t = 0; t < TT; ++t)
        for (int g = 0; g < NG; ++g) xs[t][g] = _mm512_setzero_ps();
      for (int c = 0; c < NP; ++c) {
        __m512bh q[NG];
        for (int g = 0; g < NG; ++g) q[g] = (__m512bh)_mm512_castps_si512(col(g, 16 * c + l));
        for (int t = 0; t < TT; ++t) {
          const __m512bh kc = (__m512bh)avx512::broadcast32(k + t * row + 32 * c + 2 * l);
          for (int g = 0; g < NG; ++g) xs[t][g] = _mm512_dpbf16_ps(xs[t][g], q[g], kc);
        }
      }
      if constexpr (NC % 2) {
        for (int t = 0; t < TT; ++t) {
          const __m512 kt = _mm512_set1_ps(static_cast<float>(k[t * row + 32 * NP + l]));
          for (int g = 0; g < NG; ++g) xs[t][g] = _mm512_fmadd_ps(col(g, 16 * NP + l), kt, xs[t][g]);
        }
      }
#endif
    } else {
      for (int c = 0; c < NC; ++c) {
        __m512 q[NG];
        for (int g = 0; g < NG; ++g) q[g] = col(g, 16 * c + l);
        for (int t = 0; t < TT; ++t) {
          const __m512 kc = _mm512_set1_ps(static_cast<float>(k[t * row + 16 * c + l]));
          for (int g = 0; g < NG; ++g)
            xs[t][g] = c == 0 ? _mm512_mul_ps(q[g], kc) : _mm512_fmadd_ps(q[g], kc, xs[t][g]);
        }
      }
    }
  };
  __m512 half[2][TT][NG];
  for (int h = 0; h < 2; ++h) {
    __m512 b[2][TT][NG];
    for (int e = 0; e < 2; ++e) {
      const int i = h + 2 * e;
      __m512 lo[TT][NG], hi[TT][NG], a[TT][NG];
      x(i, lo);
      x(i + 8, hi);
      for (int t = 0; t < TT; ++t)
        for (int g = 0; g < NG; ++g) a[t][g] = _mm512_add_ps(hi[t][g], lo[t][g]);
      x(i + 4, lo);
      x(i + 12, hi);
      for (int t = 0; t < TT; ++t)
        for (int g = 0; g < NG; ++g) b[e][t][g] = _mm512_add_ps(_mm512_add_ps(hi[t][g], lo[t][g]), a[t][g]);
    }
    for (int t = 0; t < TT; ++t)
      for (int g = 0; g < NG; ++g) half[h][t][g] = _mm512_add_ps(b[0][t][g], b[1][t][g]);
  }
  for (int t = 0; t < TT; ++t)
    for (int g = 0; g < NG; ++g) {
      const __m512 sum = _mm512_add_ps(half[0][t][g], half[1][t][g]);
      _mm512_storeu_ps(out + t * p_tok + 16 * g, kPairs<T> ? _mm512_mul_ps(sum, _mm512_set1_ps(scale)) : sum);
    }
}

// fold_scores for 16 rows at once, lane r being row r: p[t * p_tok] (16 rows'
// scores of token t) become exp(score - m) where from[r] <= t < n[r] (from:
// where a row's window starts in the block; kFrom false: 0 for every lane);
// the max is exact in any order, and the sum of p over t keeps fold_scores's
// tree (lane t % 16 of its chunk sums, then sum16), so every lane gets
// fold_scores's bits. alpha = exp(m_old - m) by std::exp, as there, for the
// lanes whose max moved. t runs over [t_min, n_max), the tokens some lane sees.
// (Unmasked loads then a blend, not masked loads: those would wait for the
// scores' stores to reach the cache.)
template <bool kFrom>
inline void fold16(float* p, int64_t p_tok, __m512i from, __m512i n, int64_t t_min, int64_t n_max, float* m, float* l,
                   float* alpha) {
  auto seen = [&](int64_t t) {
    const __m512i tv = _mm512_set1_epi32(int32_t(t));
    if constexpr (kFrom) return _mm512_mask_cmpgt_epi32_mask(_mm512_cmple_epi32_mask(from, tv), n, tv);
    else return _mm512_cmpgt_epi32_mask(n, tv);
  };
  __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t t = t_min; t < n_max; ++t) mx = _mm512_mask_max_ps(mx, seen(t), mx, _mm512_loadu_ps(p + t * p_tok));
  const __m512 m_old = _mm512_loadu_ps(m), m_new = _mm512_max_ps(m_old, mx);
  __m512 sums[16];
  for (int i = 0; i < 16; ++i) sums[i] = _mm512_setzero_ps();
  for (int64_t t = t_min; t < n_max; ++t) {
    const __mmask16 k = seen(t);
    const __m512 e = avx512::exp16(_mm512_sub_ps(_mm512_maskz_mov_ps(k, _mm512_loadu_ps(p + t * p_tok)), m_new));
    _mm512_storeu_ps(p + t * p_tok, e);  // lanes not seen: never read
    sums[t % 16] = _mm512_mask_add_ps(sums[t % 16], k, sums[t % 16], e);
  }
  alignas(64) float mo[16], mn[16], al[16];
  _mm512_store_ps(mo, m_old);
  _mm512_store_ps(mn, m_new);
  for (int r = 0; r < 16; ++r) al[r] = mn[r] == mo[r] ? 1.0f : std::exp(mo[r] - mn[r]);
  const __m512 a = _mm512_load_ps(al);
  _mm512_storeu_ps(alpha, a);
  _mm512_storeu_ps(l, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(l), a), avx512::sum16_lanes(sums)));
  _mm512_storeu_ps(m, m_new);
}

// Queries [i0, i1) of sequence s (query i at position first + i) for KV head kvh.
template <typename T, int NC>
void prefill_tile(const PrefillArgs& a, int64_t s, int64_t kvh, int64_t i0, int64_t i1, PrefillScratch& ps) {
  constexpr int D = 16 * NC, kCols = kQueryCols<T, NC>, kGroups = 2, kKeys = 2;  // row groups x keys per scores16
  Scratch& w = ps.rows;
  const int64_t G = a.num_heads / a.num_kv_heads, B = a.block_size, row = a.num_kv_heads * D, W = a.window;
  const int64_t first = a.context_lens[s] - a.query_lens[s], start = a.query_starts[s];
  const int32_t* table = a.block_tables + s * a.max_blocks;
  const T* query = static_cast<const T*>(a.query) + start * a.q_stride_s + kvh * G * a.q_stride_h;
  T* out = static_cast<T*>(a.out) + start * a.out_stride_s + kvh * G * a.out_stride_h;
  const float scale = static_cast<float>(a.scale), cap = static_cast<float>(a.softcap);

  if (i1 - i0 == 1) {  // one token: decode's item, the same bits without the transposes
    const int64_t ctx = first + i0 + 1;
    avx512::decode_item<T, NC>(a, query + i0 * a.q_stride_s, table, ctx, kvh, first_key(a, ctx - 1) / B,
                               (ctx + B - 1) / B, w);
    avx512::write_out<T, NC>(a, out + i0 * a.out_stride_s, w);
    return;
  }
  const int64_t rows = (i1 - i0) * G, P = ps.padded;
  for (int64_t i = i0; i < i1; ++i)
    avx512::start_rows<T, NC>(query + i * a.q_stride_s, a.q_stride_h, scale, (i - i0) * G, G, w);
  for (int64_t r = rows; r < (rows + 15) / 16 * 16; ++r) {  // padding lanes: fold16 leaves them as they are
    w.m[r] = -std::numeric_limits<float>::infinity();
    w.l[r] = 0.0f;
  }
  auto query_row = [&](int64_t r) { return query + (i0 + r / G) * a.q_stride_s + (r % G) * a.q_stride_h; };
  for (int64_t r0 = 0; r0 < rows; r0 += 16) load_query_columns<T, NC>(query_row, w, r0, rows, &ps.columns[r0 * kCols]);

  const T* key_cache = static_cast<const T*>(a.key_cache) + kvh * D;
  const T* value_cache = static_cast<const T*>(a.value_cache) + kvh * D;
  // query i sees tokens [seen_from, seen_to) of block j: from its window's first key, up to itself
  auto seen_from = [&](int64_t i, int64_t j) { return std::clamp<int64_t>(first_key(a, first + i) - j * B, 0, B); };
  auto seen_to = [&](int64_t i, int64_t j) { return std::clamp<int64_t>(first + i + 1 - j * B, 0, B); };
  const int64_t last = first + i1 - 1;  // position of the tile's last query
  for (int64_t j = first_key(a, first + i0) / B; j * B <= last; ++j) {
    const int64_t ia = std::max(i0, j * B - first);  // first query that sees block j
    // one past the last that sees it (later ones' windows start past it)
    const int64_t ib = W > 0 ? std::clamp<int64_t>((j + 1) * B + W - 1 - first, ia, i1) : i1;
    // [i_full, i_end): the queries that see all of it (past its last token, window from its first or before)
    const int64_t i_full = std::min(ib, std::max(ia, (j + 1) * B - 1 - first));
    const int64_t i_end = W > 0 ? std::clamp<int64_t>(j * B + W - first, i_full, ib) : ib;
    const int64_t rows_seen = (ib - i0) * G;
    const T* k_block = key_cache + static_cast<int64_t>(table[j]) * B * row;
    const T* v_block = value_cache + static_cast<int64_t>(table[j]) * B * row;
    if ((j + 1) * B <= last) {  // the next block into L2, as in decode_item
      const int64_t next = static_cast<int64_t>(table[j + 1]) * B * row, n_next = std::min(B, last + 1 - (j + 1) * B);
      avx512::prefetch_rows(key_cache + next, row, n_next, D * int64_t(sizeof(T)));
      avx512::prefetch_rows(value_cache + next, row, n_next, D * int64_t(sizeof(T)));
    }
    // scores and softmax update, 16 rows at a time, of every row that sees the block
    for (int64_t r0 = (ia - i0) * G / 16 * 16; r0 < rows_seen; r0 += 16 * kGroups) {
      const int64_t groups = std::min<int64_t>(kGroups, (rows_seen - r0 + 15) / 16);
      // tokens [from, n) of the block row r0 + 16 g + lane sees (n = 0: none)
      alignas(64) int32_t from[kGroups][16], n[kGroups][16];
      int64_t t_min = 0, n_max = B;
      bool windowed = false;  // some row's window starts inside the block
      if (r0 >= (i_full - i0) * G && r0 + 16 * groups <= (i_end - i0) * G) {  // all see the whole block: the common case
        for (int64_t g = 0; g < groups; ++g) _mm512_store_si512(n[g], _mm512_set1_epi32(int32_t(B)));
      } else {
        t_min = B, n_max = 0;
        for (int64_t r = 0; r < 16 * groups; ++r) {
          const int64_t i = i0 + (r0 + r) / G;
          const bool sees = r0 + r < rows_seen && i >= ia;
          from[r / 16][r % 16] = sees ? int32_t(seen_from(i, j)) : 0;
          n[r / 16][r % 16] = sees ? int32_t(seen_to(i, j)) : 0;
          if (sees) t_min = std::min<int64_t>(t_min, from[r / 16][r % 16]), n_max = std::max<int64_t>(n_max, n[r / 16][r % 16]);
          windowed |= from[r / 16][r % 16] > 0;
        }
      }
      const float* columns = &ps.columns[r0 * kCols];
      int64_t t = t_min;
      if (groups == kGroups)
        for (; t + kKeys <= n_max; t += kKeys)
          scores16<T, NC, kGroups, kKeys>(columns, 16 * kCols, k_block + t * row, row, scale, &ps.p[t * P + r0], P);
      for (; t < n_max; ++t)
        for (int64_t g = 0; g < groups; ++g)
          scores16<T, NC, 1, 1>(columns + g * 16 * kCols, 0, k_block + t * row, row, scale,
                                &ps.p[t * P + r0 + 16 * g], P);
      if (a.softcap > 0)  // decode's softcap_scores, elementwise: the same bits 16 rows at a time
        for (t = t_min; t < n_max; ++t)
          for (int64_t g = 0; g < groups; ++g) {
            float* x = &ps.p[t * P + r0 + 16 * g];
            _mm512_storeu_ps(x, avx512::softcap16(_mm512_loadu_ps(x), cap));
          }
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t r = r0 + 16 * g;
        if (windowed)
          fold16<true>(&ps.p[r], P, _mm512_load_si512(from[g]), _mm512_load_si512(n[g]), t_min, n_max, &w.m[r],
                       &w.l[r], &w.alpha[r]);
        else
          fold16<false>(&ps.p[r], P, _mm512_setzero_si512(), _mm512_load_si512(n[g]), t_min, n_max, &w.m[r], &w.l[r],
                        &w.alpha[r]);
      }
    }
    // acc = acc * alpha + p V: the queries that see part of the block (the diagonal, a window's
    // edge) one by one, over their tokens, then all that see the whole block together
    auto accumulate_part = [&](int64_t i) {
      const int64_t r = (i - i0) * G, t0 = seen_from(i, j);
      avx512::accumulate_rows<T, NC>(v_block + t0 * row, row, seen_to(i, j) - t0, &ps.p[t0 * P + r], 1, P,
                                     &w.alpha[r], &w.acc[r * D], G);
    };
    for (int64_t i = ia; i < i_full; ++i) accumulate_part(i);
    for (int64_t i = i_end; i < ib; ++i) accumulate_part(i);
    if (i_full < i_end) {
      const int64_t r = (i_full - i0) * G;
      avx512::accumulate_rows<T, NC>(v_block, row, B, &ps.p[r], 1, P, &w.alpha[r], &w.acc[r * D], (i_end - i_full) * G);
    }
  }
  for (int64_t r = 0; r < rows; ++r)
    avx512::store_row<T, NC>(out + (i0 + r / G) * a.out_stride_s + (r % G) * a.out_stride_h, &w.acc[r * D], w.l[r]);
}

template <typename T, int NC>
void run_prefill(const PrefillArgs& args) {
  PrefillArgs a = args;  // a tile needs no more rows than the longest sequence has queries
  const int64_t longest = *std::max_element(a.query_lens, a.query_lens + a.num_seqs);
  a.query_tile = std::max<int64_t>(1, std::min<int64_t>(a.query_tile, longest));
  const int64_t QT = a.query_tile, H_kv = a.num_kv_heads;
  std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> tiles;  // (cost, s, i0, i1)
  for (int64_t s = 0; s < a.num_seqs; ++s)
    for (int64_t i0 = 0; i0 < a.query_lens[s]; i0 += QT) {
      const int64_t i1 = std::min<int64_t>(a.query_lens[s], i0 + QT);
      const int64_t keys = a.context_lens[s] - a.query_lens[s] + i1;  // the last query's context
      tiles.emplace_back((i1 - i0) * (a.window > 0 ? std::min(keys, a.window + i1 - i0) : keys), s, i0, i1);
    }
  std::sort(tiles.begin(), tiles.end(), [](const auto& x, const auto& y) { return std::get<0>(x) > std::get<0>(y); });
  for_each_item<PrefillScratch>(a, int64_t(tiles.size()) * H_kv, [&](int64_t item, PrefillScratch& ps) {
    const auto& tile = tiles[item / H_kv];
    prefill_tile<T, NC>(a, std::get<1>(tile), item % H_kv, std::get<2>(tile), std::get<3>(tile), ps);
  });
}

#endif  // __AVX512F__

}  // namespace

bool paged_attention_prefill_avx512(const PrefillArgs& a) {
#if defined(__AVX512F__)
  return avx512::with_type_and_head_dim(a.dtype, a.head_dim, [&](auto t, auto nc) {
    run_prefill<decltype(t), decltype(nc)::value>(a);
  });
#else
  (void)a;
  return false;
#endif
}

}  // namespace paged
