// PagedAttention decode on the CPU, AVX-512 (paper §4.1, Figure 5; docs/architecture.md).
//
// One query token per sequence attends to the sequence's K/V, which lives in
// fixed-size physical blocks scattered over the cache; the block table says
// where. Each (sequence, KV head) pair is one work item: the G = H / H_kv query
// heads that share a KV head are processed together, so every K and V row is
// read from memory once. Each physical block is visited once, with the online
// softmax of the paper's equation: per block, the scores, the block's maximum,
// a running maximum m and sum l, and the accumulator rescaled by exp(m_old - m).
//
// Cache layout (docs/architecture.md): key_cache[b, o, h, :] is the key of slot b*B + o for
// KV head h; rows of one head inside a block are H_kv * D elements apart.
//
// Two implementations, named for what they are (bindings.cpp picks avx512 when
// it applies; both are tested against the contiguous oracle,
// tests/kernels/test_cpu_kernel.py):
//   scalar  paged_attention_scalar.cpp: the equation line by line, any dtype
//           (float64 for tight tests, float32, bfloat16 with float32
//           accumulation), any head dim. It is the specification of avx512.
//   avx512  this file, with one work item's loop in attention_avx512.h and the
//           vector math in avx512_math.h: float32 and bfloat16, head dim a
//           multiple of 16 (16 ... 256). The K row is held in registers while
//           the G dot products run; scores, max, exp (a polynomial) and sum run
//           16 tokens per instruction; V is accumulated in register tiles of
//           query heads x head dim; the next block's rows are prefetched into
//           L2. bfloat16 with AVX512-BF16 takes K . q as exact bfloat16
//           products (VDPBF16PS). It runs at the cache's or memory's bandwidth
//           (python -m paged.bench kernel); scalar at a fraction (3-8x).
//
// The prefill kernel (paged_prefill_avx512.cpp) gives every query token the
// bits this kernel gives it without split-context: the two share the per-row
// steps of attention_avx512.h.
//
// Sliding windows and soft-capping (DecodeArgs::window, ::softcap): a query
// at position p with a window W reads blocks from the one holding p - W + 1,
// and in that block only the tokens from it on (fold_scores masks the others
// out of the max and the sum; V is accumulated from there). A soft-capped
// score becomes softcap * tanh(score / softcap) before the softmax (softcap16,
// elementwise, so prefill rounds it alike).
//
// Scheduling (this file): work items are spread over torch's thread count with
// a dynamic OpenMP schedule, so sequences of different lengths balance. When
// sequences x KV heads are too few for the threads (one long request, MQA),
// each sequence is split into partitions whose (max, sum, accumulator) are
// merged at the end: split-context, the idea of vLLM's and csrc/cuda's
// "v2" kernel. Work items of several KV heads (one pass over a block's
// contiguous rows) measured no faster than one head per item with the
// per-head prefetch.

#include "paged_attention.h"

#if defined(__AVX512F__)
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "attention_avx512.h"
#endif

namespace paged {
namespace {

#if defined(__AVX512F__)
using avx512::Scratch;
using avx512::acc_index;
using avx512::decode_item;
using avx512::write_out;
using detail::for_each_item;

// The logical blocks [first, last) sequence s's query reads: from the one
// holding its window's first key (block 0 without a window) to its last.
inline std::pair<int64_t, int64_t> blocks_read(const DecodeArgs& a, int64_t s) {
  const int64_t ctx = a.context_lens[s];
  return {first_key(a, ctx - 1) / a.block_size, (ctx + a.block_size - 1) / a.block_size};
}

// Blocks per partition of a sequence: 0 (none) when sequences x KV heads
// already give every thread a couple of items; else enough partitions of at
// least 256 tokens to occupy the threads (few long sequences, many cores).
inline int64_t partition_blocks(const DecodeArgs& a) {
  if (a.partition_blocks >= 0) return a.partition_blocks;
  const int64_t items = a.num_seqs * a.num_kv_heads, want = 2 * int64_t(a.num_threads);
  if (items >= want) return 0;
  int64_t max_blocks = 0;
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    const auto [first, last] = blocks_read(a, s);
    max_blocks = std::max<int64_t>(max_blocks, last - first);
  }
  const int64_t parts = (want + items - 1) / items;
  const int64_t blocks = std::max((max_blocks + parts - 1) / parts, (256 + a.block_size - 1) / a.block_size);
  return blocks >= max_blocks ? 0 : blocks;
}

// Sequence s's decode item for KV head kvh over its blocks [j0, j1).
template <typename T, int NC>
void decode_blocks(const DecodeArgs& a, int64_t s, int64_t kvh, int64_t j0, int64_t j1, Scratch& w) {
  const T* query = static_cast<const T*>(a.query) + s * a.q_stride_s + kvh * (a.num_heads / a.num_kv_heads) * a.q_stride_h;
  decode_item<T, NC>(a, query, a.block_tables + s * a.max_blocks, a.context_lens[s], kvh, j0, j1, w);
}

// One item per (sequence, KV head), each over the whole sequence.
template <typename T, int NC>
void run_whole_sequences(const DecodeArgs& a) {
  const int64_t H_kv = a.num_kv_heads, G = a.num_heads / H_kv;
  for_each_item<Scratch>(a, a.num_seqs * H_kv, [&](int64_t i, Scratch& w) {
    const int64_t s = i / H_kv, kvh = i % H_kv;
    const auto [first, last] = blocks_read(a, s);
    decode_blocks<T, NC>(a, s, kvh, first, last, w);
    write_out<T, NC>(a, static_cast<T*>(a.out) + s * a.out_stride_s + kvh * G * a.out_stride_h, w);
  });
}

// Split-context: partition p of a sequence covers blocks [first + p * pb,
// first + (p + 1) * pb) of those it reads (blocks_read); each keeps its own
// max m_p, sum l_p and accumulator; then
// out = sum_p exp(m_p - m) acc_p / sum_p exp(m_p - m) l_p.
template <typename T, int NC>
void run_split_context(const DecodeArgs& a, int64_t pb) {
  constexpr int D = 16 * NC;
  const int64_t H_kv = a.num_kv_heads, G = a.num_heads / H_kv;
  int64_t parts = 1;
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    const auto [first, last] = blocks_read(a, s);
    parts = std::max(parts, (last - first + pb - 1) / pb);
  }
  const int64_t heads = a.num_seqs * a.num_heads;  // partial state index: (s * H + h) * parts + p
  std::vector<float> m(heads * parts), l(heads * parts), acc(heads * parts * D);
  for_each_item<Scratch>(a, a.num_seqs * H_kv * parts, [&](int64_t i, Scratch& w) {
    const int64_t p = i % parts, kvh = (i / parts) % H_kv, s = i / (parts * H_kv);
    const auto [first, last] = blocks_read(a, s);
    const int64_t j0 = first + p * pb, j1 = std::min(last, j0 + pb);
    for (int64_t g = 0; g < G; ++g) {
      const int64_t at = (s * a.num_heads + kvh * G + g) * parts + p;
      m[at] = -std::numeric_limits<float>::infinity();
      l[at] = 0.0f;  // an empty partition weighs nothing
    }
    if (j0 >= j1) return;
    decode_blocks<T, NC>(a, s, kvh, j0, j1, w);
    for (int64_t g = 0; g < G; ++g) {
      const int64_t at = (s * a.num_heads + kvh * G + g) * parts + p;
      m[at] = w.m[g];
      l[at] = w.l[g];
      std::copy(&w.acc[g * D], &w.acc[g * D] + D, &acc[at * D]);
    }
  });
  for_each_item<Scratch>(a, heads, [&](int64_t i, Scratch& w) {
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

// One thread below about a million multiply-adds, as the AVX2 kernels (detail::threads_for_pairs):
// with idle threads asleep, one stream's three (sequence, KV head) items woke the second thread in
// every layer of every step, for more than the items took.
template <typename T, int NC>
void run(const DecodeArgs& args) {
  DecodeArgs a = args;
  int64_t keys = 0;
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    const auto [first, last] = blocks_read(a, s);
    keys += (last - first) * a.block_size;
  }
  a.num_threads = detail::threads_for_pairs(a.num_threads, keys * a.num_heads, a.head_dim);
  const int64_t pb = partition_blocks(a);
  if (pb == 0) run_whole_sequences<T, NC>(a);
  else run_split_context<T, NC>(a, pb);
}

#endif  // __AVX512F__

}  // namespace

bool paged_attention_decode_avx512(const DecodeArgs& a) {
#if defined(__AVX512F__)
  return avx512::with_type_and_head_dim(a.dtype, a.head_dim, [&](auto t, auto nc) {
    run<decltype(t), decltype(nc)::value>(a);
  });
#else
  (void)a;
  return false;
#endif
}

bool avx512_compiled() {
#if defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

}  // namespace paged
