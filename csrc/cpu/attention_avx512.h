// The per-query-row steps of the AVX-512 attention kernels, shared by decode
// (paged_attention_avx512.cpp) and prefill (paged_prefill_avx512.cpp) so that
// the two round every sum the same way: a key row's dot products with the G
// query heads of its KV head (KeyRow; prefill computes the same sums for 16
// query rows at a time, lane by row), one block's online-softmax update of a
// row (fold_scores; prefill's fold16 is the same arithmetic 16 rows at a
// time), the V accumulation in register tiles of rows (accumulate_rows), and
// the output row (store_row). decode_item strings them together for one
// decode work item. Templates on the element type T (float or c10::BFloat16)
// and NC, the head dim in 16-float chunks, so every inner loop has a
// compile-time trip count and its accumulators stay in registers.
#pragma once

#if defined(__AVX512F__)
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "avx512_math.h"
#include "paged_attention.h"

namespace paged {
namespace avx512 {

// State of the query rows of one work item: the G query heads of one token
// (decode), or of each token of a tile (prefill). Row r's scores are at
// scores[r * stride], its accumulator at acc[r * D].
struct Scratch {
  int64_t stride;  // scores per row: B rounded up to 16
  std::vector<float> q, acc, scores, m, l, alpha;
  explicit Scratch(const DecodeArgs& a) : Scratch(a, a.num_heads / a.num_kv_heads) {}
  Scratch(const DecodeArgs& a, int64_t rows) {
    stride = (a.block_size + 15) / 16 * 16;
    q.resize(rows * a.head_dim);
    acc.resize(rows * a.head_dim);
    scores.resize(rows * stride);
    m.resize(rows);
    l.resize(rows);
    alpha.resize(rows);
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
// dot: lane l sums its products chunk after chunk in one chain (VDPBF16PS
// pairs, or float products), then sum16 adds the 16 lanes. (One chain per lane,
// not two: the prefill kernel computes the same sums 16 rows at a time, where a
// second chain would cost an add per lane and score.)
template <typename T, int NC>
struct KeyRow {
  __m512 k[NC];
  void load(const T* row) {
    for (int c = 0; c < NC; ++c) k[c] = load16(row + 16 * c);
  }
  // q: the G query heads (float, pre-scaled), D apart
  float dot(const float* q, int64_t) const {
    __m512 s = _mm512_mul_ps(_mm512_loadu_ps(q), k[0]);
    for (int c = 1; c < NC; ++c) s = _mm512_fmadd_ps(_mm512_loadu_ps(q + 16 * c), k[c], s);
    return sum16(s);
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
    __m512 s = _mm512_setzero_ps();
    for (int c = 0; c < NP; ++c) s = _mm512_dpbf16_ps(s, (__m512bh)_mm512_loadu_si512(q + 32 * c), (__m512bh)k[c]);
    if constexpr (NC % 2) s = _mm512_fmadd_ps(load16(q + 32 * NP), tail, s);
    return sum16(s) * scale;
  }
};
#endif

// acc[g, :] = acc[g, :] * alpha[g] + sum_t p[g, t] * V[t, :] for GT rows,
// the GT x NC accumulator tile kept in registers across the block's tokens;
// p[g, t] is at p[g * p_row + t * p_tok]. A tile whose alphas are all 1 (the
// running max did not move, the common case past a sequence's first blocks)
// skips the multiplication: x * 1 is x, the same bits.
template <typename T, int NC, int GT>
inline void accumulate_tile(const T* v_block, int64_t row, int64_t n, const float* p, int64_t p_row,
                            int64_t p_tok, const float* alpha, float* acc, int64_t D) {
  __m512 a[GT][NC];
  bool rescale = false;
  for (int g = 0; g < GT; ++g) rescale |= alpha[g] != 1.0f;
  for (int g = 0; g < GT; ++g) {
    const __m512 al = _mm512_set1_ps(alpha[g]);
    for (int c = 0; c < NC; ++c) {
      a[g][c] = _mm512_loadu_ps(acc + g * D + 16 * c);
      if (rescale) a[g][c] = _mm512_mul_ps(a[g][c], al);
    }
  }
  for (int64_t t = 0; t < n; ++t) {
    const T* v = v_block + t * row;
    __m512 pt[GT];
    for (int g = 0; g < GT; ++g) pt[g] = _mm512_set1_ps(p[g * p_row + t * p_tok]);
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

// Tile of rows for the accumulator: GT x NC registers, at most 16.
template <int NC>
constexpr int kHeadTile = NC >= 16 ? 1 : 16 / NC;

// accumulate_tile over `rows` rows (row r: p at p + r * p_row, alpha[r],
// acc + r * D), all of which see the block's first n tokens.
template <typename T, int NC>
inline void accumulate_rows(const T* v_block, int64_t row, int64_t n, const float* p, int64_t p_row, int64_t p_tok,
                            const float* alpha, float* acc, int64_t rows) {
  constexpr int D = 16 * NC, GT = kHeadTile<NC>;
  int64_t r = 0;
  for (; r + GT <= rows; r += GT)
    accumulate_tile<T, NC, GT>(v_block, row, n, p + r * p_row, p_row, p_tok, alpha + r, acc + r * D, D);
  for (; r < rows; ++r)  // leftover rows one at a time
    accumulate_tile<T, NC, 1>(v_block, row, n, p + r * p_row, p_row, p_tok, alpha + r, acc + r * D, D);
}

// One block's online-softmax update of one row, 16 tokens per instruction:
// block max, new running max m, p = exp(score - m) in place of the scores
// sc[t0, n) (the tokens the row sees: t0 > 0 where its window starts inside
// the block), running sum l rescaled by alpha = exp(m_old - m), which the
// accumulator is multiplied by next. Lane t % 16 sums token t's p whatever t0 is.
inline void fold_scores(float* sc, int64_t t0, int64_t n, float& m, float& l, float& alpha) {
  const int64_t start = t0 / 16 * 16;
  __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t t = start; t < n; t += 16)
    mx = _mm512_mask_max_ps(mx, range_mask(t0 - t, n - t), mx, _mm512_loadu_ps(sc + t));
  const float m_old = m;
  const float m_new = std::max(m_old, _mm512_reduce_max_ps(mx));  // max: exact in any order
  const __m512 mv = _mm512_set1_ps(m_new);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t t = start; t < n; t += 16) {
    const __mmask16 k = range_mask(t0 - t, n - t);
    const __m512 p = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, sc + t), mv));
    _mm512_mask_storeu_ps(sc + t, k, p);
    sum = _mm512_mask_add_ps(sum, k, sum, p);
  }
  alpha = m_new == m_old ? 1.0f : std::exp(m_old - m_new);  // 0 on block 0
  l = l * alpha + sum16(sum);
  m = m_new;
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

// o = acc / l for one row.
template <typename T, int NC>
inline void store_row(T* o, const float* acc, float l) {
  const float inv = 1.0f / l;
  for (int64_t d = 0; d < 16 * NC; ++d) o[d] = static_cast<T>(acc[acc_index<T, NC>(d)] * inv);
}

// Rows [r0, r0 + G) of w start a query token: its G heads (query, q_stride_h
// apart) scaled into w.q where the dot products take floats, m = -inf, l = 0, acc = 0.
template <typename T, int NC>
inline void start_rows(const T* query, int64_t q_stride_h, float scale, int64_t r0, int64_t G, Scratch& w) {
  constexpr int D = 16 * NC;
  for (int64_t g = r0; g < r0 + G; ++g) {
    const T* q = query + (g - r0) * q_stride_h;
    for (int c = 0; c < NC; ++c) {
      _mm512_storeu_ps(&w.q[g * D + 16 * c], _mm512_mul_ps(load16(q + 16 * c), _mm512_set1_ps(scale)));
      _mm512_storeu_ps(&w.acc[g * D + 16 * c], _mm512_setzero_ps());
    }
    w.m[g] = -std::numeric_limits<float>::infinity();
    w.l[g] = 0.0f;
  }
}

// Soft-capped scores sc[t0, n) in place (softcap16, 16 tokens per instruction).
inline void softcap_scores(float* sc, int64_t t0, int64_t n, float cap) {
  for (int64_t t = t0 / 16 * 16; t < n; t += 16) {
    const __mmask16 k = range_mask(t0 - t, n - t);
    _mm512_mask_storeu_ps(sc + t, k, softcap16(_mm512_maskz_loadu_ps(k, sc + t), cap));
  }
}

// Attends the G query heads of one token (query: its head kvh * G, rows
// q_stride_h apart) over logical blocks [j0, j1) of its sequence (block table
// `table`, ctx tokens visible; with a window, the last a.window of them, which
// start in block first_key(a, ctx - 1) / B: j0 is never below it); leaves the
// running max, sum and accumulator in rows 0 .. G-1 of w.
template <typename T, int NC>
void decode_item(const DecodeArgs& a, const T* query, const int32_t* table, int64_t ctx, int64_t kvh,
                 int64_t j0, int64_t j1, Scratch& w) {
  constexpr int D = 16 * NC;
  const int64_t G = a.num_heads / a.num_kv_heads, B = a.block_size, stride = w.stride;
  const int64_t row = a.num_kv_heads * D;  // elements between tokens of one head
  const T* key_cache = static_cast<const T*>(a.key_cache) + kvh * D;
  const T* value_cache = static_cast<const T*>(a.value_cache) + kvh * D;
  const float scale = static_cast<float>(a.scale), cap = static_cast<float>(a.softcap);
  const int64_t lo = first_key(a, ctx - 1);  // the window's first key (0 without one)
  start_rows<T, NC>(query, a.q_stride_h, scale, 0, G, w);

  for (int64_t j = j0; j < j1; ++j) {
    const int64_t n = std::min(B, ctx - j * B);
    const int64_t t0 = std::max<int64_t>(0, lo - j * B);  // the block's first token the window holds
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
    for (int64_t t = t0; t < n; ++t) {
      KeyRow<T, NC> k;
      k.load(k_block + t * row);
      for (int64_t g = 0; g < G; ++g) {
        if constexpr (kPairs<T>) w.scores[g * stride + t] = k.dot(query + g * a.q_stride_h, scale);
        else w.scores[g * stride + t] = k.dot(&w.q[g * D], 0);
      }
    }
    if (a.softcap > 0)
      for (int64_t g = 0; g < G; ++g) softcap_scores(&w.scores[g * stride], t0, n, cap);
    // 2. online softmax of each head's scores; 3. acc = acc * alpha + p V over the tokens seen
    for (int64_t g = 0; g < G; ++g) fold_scores(&w.scores[g * stride], t0, n, w.m[g], w.l[g], w.alpha[g]);
    accumulate_rows<T, NC>(v_block + t0 * row, row, n - t0, w.scores.data() + t0, stride, 1, w.alpha.data(),
                           w.acc.data(), G);
  }
}

// out = acc / l for the G query heads of one token (out: its head kvh * G).
template <typename T, int NC>
void write_out(const DecodeArgs& a, T* out, const Scratch& w) {
  const int64_t G = a.num_heads / a.num_kv_heads;
  for (int64_t g = 0; g < G; ++g) store_row<T, NC>(out + g * a.out_stride_h, &w.acc[g * 16 * NC], w.l[g]);
}

// Calls f(T{}, std::integral_constant<int, NC>) for the element type of dtype
// (float32 or bfloat16) and head dim D = 16 * NC if the kernels are
// instantiated for them (the head dims of real models); false if not.
template <typename F>
bool with_type_and_head_dim(DType dtype, int64_t D, F&& f) {
  auto head_dim = [&](auto t) {
    switch (D) {
      case 16: f(t, std::integral_constant<int, 1>{}); return true;
      case 32: f(t, std::integral_constant<int, 2>{}); return true;
      case 48: f(t, std::integral_constant<int, 3>{}); return true;
      case 64: f(t, std::integral_constant<int, 4>{}); return true;
      case 80: f(t, std::integral_constant<int, 5>{}); return true;
      case 96: f(t, std::integral_constant<int, 6>{}); return true;
      case 112: f(t, std::integral_constant<int, 7>{}); return true;
      case 128: f(t, std::integral_constant<int, 8>{}); return true;
      case 160: f(t, std::integral_constant<int, 10>{}); return true;
      case 192: f(t, std::integral_constant<int, 12>{}); return true;
      case 256: f(t, std::integral_constant<int, 16>{}); return true;
      default: return false;
    }
  };
  switch (dtype) {
    case DType::kFloat32: return head_dim(float{});
    case DType::kBFloat16: return head_dim(c10::BFloat16{});
    default: return false;
  }
}

}  // namespace avx512
}  // namespace paged
#endif  // __AVX512F__
