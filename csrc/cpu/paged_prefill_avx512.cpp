// PagedAttention prefill on the CPU, AVX-512 (paper §4.1; docs/kernels.md).
//
// Many query tokens of a sequence (a prompt, a chunk of one, a prompt's tail
// after a prefix-cache hit, a recomputation) attend to the sequence's paged
// K/V, causally: the query at position p sees keys 0 .. p. Run as decode
// queries, token by token, a prompt of n tokens reads its K/V about n^2 / 2
// times; here a work item is a tile of query tokens x one KV head, and it walks
// the KV blocks once: each block is loaded once per tile, and the G query heads
// of the KV head share each load.
//
// Batch invariance. A token's output must not depend on what it is computed
// with (a whole prompt, a chunk of 7, a cache hit, a 1-token decode), so every
// query row does exactly what the decode kernel (paged_attention_avx512.cpp,
// without split-context) does for that token with context p + 1:
//   * its online softmax walks logical blocks 0, 1, 2, ... whose boundaries
//     sit at absolute positions j * B, the last one cut at p (n = min(B, p + 1
//     - j B) tokens, as decode's n = min(B, ctx - j B));
//   * a score is the same chain of VDPBF16PS / FMA products per lane and the
//     same sum16 tree over lanes as decode's KeyRow::dot, computed 16 tokens
//     at a time from the block's keys transposed (token t in lane t), so the
//     tree becomes 15 vertical adds (sum16_lanes);
//   * the softmax update (fold_scores), the V accumulation (accumulate_rows)
//     and the output (store_row) are decode's own functions
//     (attention_avx512.h).
// Which rows share a tile, the tile size and the thread change nothing in a
// row's arithmetic. tests/kernels/test_cpu_prefill.py checks every row
// bitwise against the decode kernel run for that token alone.
//
// Two implementations (bindings.cpp picks avx512 when it applies):
//   scalar  paged_attention_scalar.cpp: each query token as a decode query
//           over the keys up to its position; any dtype (float64 for tight
//           tests), any head dim. The specification.
//   avx512  this file: float32 and bfloat16, head dims of attention_avx512.h.
//           Per tile and block: the block's keys transposed into columns
//           (load_key_columns, once per tile), the scores of every row of the
//           tile (scores16), each row's softmax update, then V accumulated in
//           register tiles of rows: the rows that see the whole block together,
//           those of the diagonal block (which see part of it) query by query.
//           A tile of one query (a decode token in a mixed batch) runs
//           decode_item itself: the same bits, without the transpose.
//
// Scheduling: items (sequence, query tile, KV head), the costliest (latest
// tiles of long sequences) first, over torch's threads with a dynamic OpenMP
// schedule.

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

// Columns of a block's transposed keys: lane t of column w is token t's
// 32-bit element w: a bfloat16 pair (16 per 32-value chunk) where the dot
// products take pairs (kPairs), else a float, including the widened 16-value
// tail of a bfloat16 row whose head dim is an odd number of 16s.
template <typename T, int NC>
struct KeyColumns {
  static constexpr int kPairCols = kPairs<T> ? 16 * (NC / 2) : 0;
  static constexpr int kCols = kPairs<T> ? kPairCols + 16 * (NC % 2) : 16 * NC;
};

// Scratch of one thread: the tile's rows (r = query in tile * G + head) and
// one block's key columns, 16 tokens per group.
struct PrefillScratch {
  Scratch rows;
  std::vector<const void*> q;  // raw query row of each row
  std::vector<float> columns;  // [B / 16 groups][columns][16]
  explicit PrefillScratch(const PrefillArgs& a)
      : rows(a, std::max<int64_t>(1, a.query_tile) * (a.num_heads / a.num_kv_heads)),
        q(rows.m.size()),
        columns(rows.stride / 16 * 16 * (a.head_dim / 16 + 1) * 16) {}
};

// The first n tokens of a block (token t at k_block + t * row) as key columns;
// lanes of tokens >= n are zero.
template <typename T, int NC>
void load_key_columns(const T* k_block, int64_t row, int64_t n, float* columns) {
  using KC = KeyColumns<T, NC>;
  __m512 r[16];
  for (int64_t t0 = 0; t0 < n; t0 += 16) {
    const int64_t m = std::min<int64_t>(16, n - t0);
    float* out = columns + t0 / 16 * KC::kCols * 16;
    const T* k = k_block + t0 * row;
    // chunk c of 16 columns, from 16 32-bit values of each token's row at `at`
    auto chunk = [&](int c, auto load) {
      for (int t = 0; t < 16; ++t) r[t] = t < m ? load(k + t * row) : _mm512_setzero_ps();
      avx512::transpose16(r);
      for (int w = 0; w < 16; ++w) _mm512_storeu_ps(out + (16 * c + w) * 16, r[w]);
    };
    if constexpr (kPairs<T>) {
      for (int c = 0; c < NC / 2; ++c)
        chunk(c, [&](const T* x) { return _mm512_castsi512_ps(_mm512_loadu_si512(x + 32 * c)); });
      if constexpr (NC % 2) chunk(NC / 2, [&](const T* x) { return avx512::load16(x + 32 * (NC / 2)); });
    } else {
      for (int c = 0; c < NC; ++c) chunk(c, [&](const T* x) { return avx512::load16(x + 16 * c); });
    }
  }
}

// Scores of one query row with the 16 tokens of one group of key columns:
// lane t is KeyRow<T, NC>::dot of the row with token t, bit for bit. Lane l of
// decode's s0 / s1 becomes the vector S[l] over tokens; sum16 over lanes
// becomes sum16_lanes over S.
template <typename T, int NC>
inline __m512 scores16(const float* columns, const T* q_raw, const float* q_scaled, float scale) {
  __m512 S[16];
  for (int l = 0; l < 16; ++l) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    if constexpr (kPairs<T>) {
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
      constexpr int NP = NC / 2;
      for (int c = 0; c < NP; ++c) {
        const __m512bh qc = (__m512bh)_mm512_castps_si512(avx512::broadcast32(q_raw + 32 * c + 2 * l));
        const __m512bh kc = (__m512bh)_mm512_castps_si512(_mm512_loadu_ps(columns + (16 * c + l) * 16));
        if (c % 2 == 0) s0 = _mm512_dpbf16_ps(s0, qc, kc);
        else s1 = _mm512_dpbf16_ps(s1, qc, kc);
      }
      if constexpr (NC % 2)
        s1 = _mm512_fmadd_ps(_mm512_set1_ps(static_cast<float>(q_raw[32 * NP + l])),
                             _mm512_loadu_ps(columns + (16 * NP + l) * 16), s1);
#endif
    } else {
      s0 = _mm512_mul_ps(_mm512_set1_ps(q_scaled[l]), _mm512_loadu_ps(columns + l * 16));
      if constexpr (NC > 1) s1 = _mm512_mul_ps(_mm512_set1_ps(q_scaled[16 + l]), _mm512_loadu_ps(columns + (16 + l) * 16));
      for (int c = 2; c < NC; ++c) {
        const __m512 p = _mm512_set1_ps(q_scaled[16 * c + l]), k = _mm512_loadu_ps(columns + (16 * c + l) * 16);
        if (c % 2 == 0) s0 = _mm512_fmadd_ps(p, k, s0);
        else s1 = _mm512_fmadd_ps(p, k, s1);
      }
    }
    S[l] = _mm512_add_ps(s0, s1);
  }
  const __m512 sum = avx512::sum16_lanes(S);
  return kPairs<T> ? _mm512_mul_ps(sum, _mm512_set1_ps(scale)) : sum;
}

// Queries [i0, i1) of sequence s (query i at position first + i) for KV head kvh.
template <typename T, int NC>
void prefill_tile(const PrefillArgs& a, int64_t s, int64_t kvh, int64_t i0, int64_t i1, PrefillScratch& ps) {
  constexpr int D = 16 * NC;
  constexpr int64_t kGroup = KeyColumns<T, NC>::kCols * 16;  // floats per 16 tokens of key columns
  Scratch& w = ps.rows;
  const int64_t G = a.num_heads / a.num_kv_heads, B = a.block_size, row = a.num_kv_heads * D;
  const int64_t first = a.context_lens[s] - a.query_lens[s], start = a.query_starts[s];
  const int32_t* table = a.block_tables + s * a.max_blocks;
  const T* query = static_cast<const T*>(a.query) + start * a.q_stride_s + kvh * G * a.q_stride_h;
  T* out = static_cast<T*>(a.out) + start * a.out_stride_s + kvh * G * a.out_stride_h;
  const float scale = static_cast<float>(a.scale);

  if (i1 - i0 == 1) {  // one token: decode's item, the same bits without the transpose
    const int64_t ctx = first + i0 + 1;
    avx512::decode_item<T, NC>(a, query + i0 * a.q_stride_s, table, ctx, kvh, 0, (ctx + B - 1) / B, w);
    avx512::write_out<T, NC>(a, out + i0 * a.out_stride_s, w);
    return;
  }
  for (int64_t i = i0; i < i1; ++i) {
    avx512::start_rows<T, NC>(query + i * a.q_stride_s, a.q_stride_h, scale, (i - i0) * G, G, w);
    for (int64_t g = 0; g < G; ++g) ps.q[(i - i0) * G + g] = query + i * a.q_stride_s + g * a.q_stride_h;
  }
  const T* key_cache = static_cast<const T*>(a.key_cache) + kvh * D;
  const T* value_cache = static_cast<const T*>(a.value_cache) + kvh * D;
  const int64_t last = first + i1 - 1;  // position of the tile's last query
  for (int64_t j = 0; j * B <= last; ++j) {
    const int64_t ia = std::max(i0, j * B - first);                    // first query that sees block j
    const int64_t i_full = std::min(i1, std::max(ia, (j + 1) * B - 1 - first));  // first that sees all of it
    const T* k_block = key_cache + static_cast<int64_t>(table[j]) * B * row;
    const T* v_block = value_cache + static_cast<int64_t>(table[j]) * B * row;
    if ((j + 1) * B <= last) {  // the next block into L2, as in decode_item
      const int64_t next = static_cast<int64_t>(table[j + 1]) * B * row, n_next = std::min(B, last + 1 - (j + 1) * B);
      avx512::prefetch_rows(key_cache + next, row, n_next, D * int64_t(sizeof(T)));
      avx512::prefetch_rows(value_cache + next, row, n_next, D * int64_t(sizeof(T)));
    }
    load_key_columns<T, NC>(k_block, row, std::min(B, last + 1 - j * B), ps.columns.data());

    // scores and softmax update of every row that sees the block, each over its n tokens
    for (int64_t r = (ia - i0) * G; r < (i1 - i0) * G; ++r) {
      const int64_t n = std::min(B, first + i0 + r / G + 1 - j * B);
      float* sc = &w.scores[r * w.stride];
      for (int64_t t = 0; t < n; t += 16)
        _mm512_storeu_ps(sc + t, scores16<T, NC>(&ps.columns[t / 16 * kGroup], static_cast<const T*>(ps.q[r]),
                                                 &w.q[r * D], scale));
      avx512::fold_scores(sc, n, w.m[r], w.l[r], w.alpha[r]);
    }
    // acc = acc * alpha + p V: the diagonal queries one by one, then all that see the whole block
    for (int64_t i = ia; i < i_full; ++i)
      avx512::accumulate_rows<T, NC>(v_block, row, first + i + 1 - j * B, w, (i - i0) * G, (i - i0 + 1) * G);
    if (i_full < i1) avx512::accumulate_rows<T, NC>(v_block, row, B, w, (i_full - i0) * G, (i1 - i0) * G);
  }
  for (int64_t r = 0; r < (i1 - i0) * G; ++r)
    avx512::store_row<T, NC>(out + (i0 + r / G) * a.out_stride_s + (r % G) * a.out_stride_h, &w.acc[r * D], w.l[r]);
}

template <typename T, int NC>
void run_prefill(const PrefillArgs& a) {
  const int64_t QT = std::max<int64_t>(1, a.query_tile), H_kv = a.num_kv_heads;
  std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> tiles;  // (cost, s, i0, i1)
  for (int64_t s = 0; s < a.num_seqs; ++s)
    for (int64_t i0 = 0; i0 < a.query_lens[s]; i0 += QT) {
      const int64_t i1 = std::min<int64_t>(a.query_lens[s], i0 + QT);
      tiles.emplace_back((i1 - i0) * (a.context_lens[s] - a.query_lens[s] + i1), s, i0, i1);
    }
  std::sort(tiles.begin(), tiles.end(), [](const auto& x, const auto& y) { return std::get<0>(x) > std::get<0>(y); });
  for_each_item<PrefillScratch>(a, int64_t(tiles.size()) * H_kv, [&](int64_t item, PrefillScratch& ps) {
    const auto& [cost, s, i0, i1] = tiles[item / H_kv];
    prefill_tile<T, NC>(a, s, item % H_kv, i0, i1, ps);
  });
}

template <typename T>
bool dispatch_head_dim(const PrefillArgs& a) {
  return avx512::with_head_dim(a.head_dim, [&](auto nc) { run_prefill<T, decltype(nc)::value>(a); });
}

#endif  // __AVX512F__

}  // namespace

bool paged_attention_prefill_avx512(const PrefillArgs& a) {
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

}  // namespace paged
