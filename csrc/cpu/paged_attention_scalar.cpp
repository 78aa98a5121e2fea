// PagedAttention on the CPU, scalar and readable (any dtype, any head dim):
// decode, and prefill as decode of every query token over the keys up to its
// own position. The header of paged_attention_avx512.cpp describes the
// algorithm, the cache layout and the decode implementations, that of
// paged_prefill_avx512.cpp the prefill ones; this file is the specification
// the AVX-512 kernels are held to. The softmax's exp is softmax_exp.h's
// (float64: libm's), which the AVX2 kernel computes eight at a time.

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "paged_attention.h"
#include "softmax_exp.h"

namespace paged {
namespace {

using detail::for_each_item;

template <typename T>
struct AccType {
  using type = float;  // float32 and bfloat16 accumulate in float32
};
template <>
struct AccType<double> {
  using type = double;
};

template <typename T>
struct ScratchScalar {
  using Acc = typename AccType<T>::type;
  std::vector<Acc> q, acc, scores, m, l;
  explicit ScratchScalar(const DecodeArgs& a) {
    const int64_t G = a.num_heads / a.num_kv_heads;
    q.resize(G * a.head_dim);
    acc.resize(G * a.head_dim);
    scores.resize(a.block_size);
    m.resize(G);
    l.resize(G);
  }
};

// q . k in kLanes running sums (lane l takes dimensions l, l + kLanes, ...), then
// the lanes added pairwise in a fixed tree. The order depends on the head dim
// only, never on the token's position or batch, and the lane loop has no
// dependence between lanes, so the compiler makes it vector code on any CPU
// (one serial chain of D adds instead measured 17x slower than SDPA on an
// AVX2-only CPU). float64 keeps the same order.
constexpr int64_t kLanes = 16;

template <typename Acc, typename T>
Acc dot_in_lanes(const Acc* q, const T* k, int64_t D) {
  Acc lane[kLanes] = {};
  int64_t d = 0;
  for (; d + kLanes <= D; d += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lane[l] += q[d + l] * static_cast<Acc>(k[d + l]);
  for (int64_t l = 0; d + l < D; ++l) lane[l] += q[d + l] * static_cast<Acc>(k[d + l]);
  for (int64_t half = kLanes / 2; half > 0; half /= 2)
    for (int64_t l = 0; l < half; ++l) lane[l] += lane[l + half];
  return lane[0];
}

// Attends the G query heads of one token (query: its head kvh * G, rows
// q_stride_h apart) over the first ctx tokens of its sequence (block table
// `table`), the last a.window of them with a window; writes the G output rows
// (out: head kvh * G, out_stride_h apart).
template <typename T>
void decode_item_scalar(const DecodeArgs& a, const T* query, const int32_t* table, int64_t ctx, int64_t kvh,
                        T* out, ScratchScalar<T>& w) {
  using Acc = typename AccType<T>::type;
  const int64_t G = a.num_heads / a.num_kv_heads, D = a.head_dim, B = a.block_size;
  const int64_t row = a.num_kv_heads * D;  // elements between tokens of one head
  const T* key_cache = static_cast<const T*>(a.key_cache);
  const T* value_cache = static_cast<const T*>(a.value_cache);

  for (int64_t g = 0; g < G; ++g) {
    const T* q = query + g * a.q_stride_h;
    for (int64_t d = 0; d < D; ++d) {
      w.q[g * D + d] = static_cast<Acc>(q[d]) * static_cast<Acc>(a.scale);
      w.acc[g * D + d] = 0;
    }
    w.m[g] = -std::numeric_limits<Acc>::infinity();
    w.l[g] = 0;
  }

  const int64_t lo = first_key(a, ctx - 1);  // the window's first key (0 without one)
  const Acc cap = static_cast<Acc>(a.softcap);
  for (int64_t j = lo / B; j * B < ctx; ++j) {
    const int64_t n = std::min(B, ctx - j * B);         // filled slots of this block
    const int64_t t0 = std::max<int64_t>(0, lo - j * B);  // its first slot the window holds
    const int64_t base = (static_cast<int64_t>(table[j]) * B * a.num_kv_heads + kvh) * D;
    const T* k_block = key_cache + base;    // row t at k_block + t * row
    const T* v_block = value_cache + base;
    for (int64_t g = 0; g < G; ++g) {
      const Acc* q = &w.q[g * D];
      Acc* acc = &w.acc[g * D];
      // scores of this block (soft-capped) and their maximum
      Acc block_max = -std::numeric_limits<Acc>::infinity();
      for (int64_t t = t0; t < n; ++t) {
        const T* k = k_block + t * row;
        Acc dot = dot_in_lanes(q, k, D);
        if (a.softcap > 0) dot = cap * std::tanh(dot / cap);
        w.scores[t] = dot;
        block_max = std::max(block_max, dot);
      }
      // online softmax: rescale what was accumulated under the old maximum
      const Acc m_new = std::max(w.m[g], block_max);
      const Acc alpha = softmax_exp_of(w.m[g] - m_new);  // exp(-inf) = 0 on the first block
      w.l[g] *= alpha;
      for (int64_t d = 0; d < D; ++d) acc[d] *= alpha;
      for (int64_t t = t0; t < n; ++t) {
        const Acc p = softmax_exp_of(w.scores[t] - m_new);
        w.l[g] += p;
        const T* v = v_block + t * row;
        for (int64_t d = 0; d < D; ++d) acc[d] += p * static_cast<Acc>(v[d]);
      }
      w.m[g] = m_new;
    }
  }

  for (int64_t g = 0; g < G; ++g) {
    T* o = out + g * a.out_stride_h;
    const Acc inv = Acc(1) / w.l[g];
    for (int64_t d = 0; d < D; ++d) o[d] = static_cast<T>(w.acc[g * D + d] * inv);
  }
}

template <typename T>
void run_scalar(const DecodeArgs& a) {
  // one item per (sequence, KV head) and its G query heads
  const int64_t H_kv = a.num_kv_heads, G = a.num_heads / H_kv;
  for_each_item<ScratchScalar<T>>(a, a.num_seqs * H_kv, [&](int64_t i, ScratchScalar<T>& w) {
    const int64_t s = i / H_kv, kvh = i % H_kv;
    decode_item_scalar<T>(a, static_cast<const T*>(a.query) + s * a.q_stride_s + kvh * G * a.q_stride_h,
                          a.block_tables + s * a.max_blocks, a.context_lens[s], kvh,
                          static_cast<T*>(a.out) + s * a.out_stride_s + kvh * G * a.out_stride_h, w);
  });
}

// Prefill is decode of each query token over the keys it may see: token i of
// sequence s, at position p = context_lens[s] - query_lens[s] + i, as a decode
// query with context p + 1 (and the same window). Rows are independent, so the
// work splits anywhere without changing a bit: one item per (sequence, tile of
// query tokens, KV head), the last tiles (the longest contexts) first, so one
// long prompt keeps every thread busy to the end; a tile shares nothing between
// its tokens here, so a call with few tokens gets smaller ones
// (detail::query_tile_for_threads).
template <typename T>
void run_prefill_scalar(const PrefillArgs& a) {
  const int64_t H_kv = a.num_kv_heads, G = a.num_heads / H_kv;
  const int64_t tile = detail::query_tile_for_threads(a);
  const std::vector<detail::PrefillItem> items = detail::prefill_items(a, tile);
  for_each_item<ScratchScalar<T>>(a, static_cast<int64_t>(items.size()), [&](int64_t k, ScratchScalar<T>& w) {
    const auto [s, i0, kvh] = items[k];
    const int64_t first = a.context_lens[s] - a.query_lens[s];  // position of query 0
    for (int64_t i = i0; i < std::min<int64_t>(a.query_lens[s], i0 + tile); ++i) {
      const int64_t t = a.query_starts[s] + i;  // its row in the packed query
      decode_item_scalar<T>(a, static_cast<const T*>(a.query) + t * a.q_stride_s + kvh * G * a.q_stride_h,
                            a.block_tables + s * a.max_blocks, first + i + 1, kvh,
                            static_cast<T*>(a.out) + t * a.out_stride_s + kvh * G * a.out_stride_h, w);
    }
  });
}

}  // namespace

void paged_attention_decode_scalar(const DecodeArgs& a) {
  switch (a.dtype) {
    case DType::kFloat32: run_scalar<float>(a); break;
    case DType::kBFloat16: run_scalar<c10::BFloat16>(a); break;
    case DType::kFloat64: run_scalar<double>(a); break;
  }
}

void paged_attention_prefill_scalar(const PrefillArgs& a) {
  switch (a.dtype) {
    case DType::kFloat32: run_prefill_scalar<float>(a); break;
    case DType::kBFloat16: run_prefill_scalar<c10::BFloat16>(a); break;
    case DType::kFloat64: run_prefill_scalar<double>(a); break;
  }
}


}  // namespace paged
