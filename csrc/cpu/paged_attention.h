// Interface between the PyTorch binding (bindings.cpp) and the attention
// kernels: decode (paged_attention_scalar.cpp; paged_attention_avx512.cpp,
// whose header describes both) and prefill (paged_prefill_avx512.cpp, whose
// header describes it, and its scalar version in paged_attention_scalar.cpp).
// Plain pointers and sizes only, so the kernel files do not include the heavy
// torch headers and compile in parallel with the binding.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace paged {

enum class DType { kFloat32, kBFloat16, kFloat64 };

// One decode step: every sequence s has exactly one query token, which sits
// at position context_lens[s] - 1 and attends to all context_lens[s] tokens
// (with a window W, to the last W of them). The binding checks every field
// before a kernel sees it.
struct DecodeArgs {
  const void* query;           // [S, H, D], rows of D contiguous (strides below)
  const void* key_cache;       // [N, B, H_kv, D] contiguous
  const void* value_cache;     // [N, B, H_kv, D] contiguous
  const int32_t* block_tables; // [S, M] contiguous
  const int32_t* context_lens; // [S]
  void* out;                   // [S, H, D], rows of D contiguous (strides below)
  int64_t num_seqs;            // S
  int64_t num_heads;           // H
  int64_t num_kv_heads;        // H_kv
  int64_t head_dim;            // D
  int64_t block_size;          // B
  int64_t max_blocks;          // M
  int64_t q_stride_s, q_stride_h;      // elements
  int64_t out_stride_s, out_stride_h;  // elements
  double scale;
  DType dtype;
  int num_threads;
  // avx512: blocks per partition of a sequence (split-context, for few
  // sequences on many threads); 0: none, -1: chosen from the sizes and thread count.
  int64_t partition_blocks = -1;
  // Sliding window W (0: none): the query at position p sees keys p - W + 1 .. p
  // only, so its loop over blocks starts at the block holding p - W + 1.
  int64_t window = 0;
  // Soft-capping (0: none): each score s = scale * q.k becomes
  // softcap * tanh(s / softcap) before the softmax (Gemma 2).
  double softcap = 0;
};

// The first key position the query at position pos sees (its window's start).
inline int64_t first_key(const DecodeArgs& a, int64_t pos) {
  return a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
}

// Many query tokens per sequence (prompts, prompt chunks, decode tokens, packed):
// sequence s has query_lens[s] new tokens at query rows query_starts[s] ...;
// its i-th sits at position context_lens[s] - query_lens[s] + i and attends to
// keys 0 .. that position (causal; with a window W, the last W of them). The DecodeArgs fields mean what they mean
// there, except that query and out rows are tokens: q_stride_s and
// out_stride_s are the strides between token rows. The binding checks every
// field before a kernel sees it.
struct PrefillArgs : DecodeArgs {
  const int32_t* query_lens;    // [S], 0 <= query_lens[s] <= context_lens[s]
  const int64_t* query_starts;  // [S], first query row of each sequence
  int64_t query_tile = 32;      // query tokens per work item (scalar and avx512; any value, same bits)
};

// scalar: readable, any dtype and any head dim.
void paged_attention_decode_scalar(const DecodeArgs& args);
void paged_attention_prefill_scalar(const PrefillArgs& args);

// avx512: float32 / bfloat16, head_dim % 16 == 0. Returns false (and does
// nothing) when this build or these arguments cannot take it.
bool paged_attention_decode_avx512(const DecodeArgs& args);
bool paged_attention_prefill_avx512(const PrefillArgs& args);

// Whether avx512 was compiled in (the compiler targeted AVX-512F).
bool avx512_compiled();

// avx2: the scalar kernels' arithmetic, operation for operation, in AVX2
// vectors (bitwise the scalar's); float32 / bfloat16, head_dim % 16 == 0.
// Returns false (and does nothing) when this build or these arguments cannot take it.
bool paged_attention_decode_avx2(const DecodeArgs& args);
bool paged_attention_prefill_avx2(const PrefillArgs& args);

// Whether avx2 was compiled in (the compiler targeted AVX2).
bool avx2_compiled();

namespace detail {
// The query tile of a prefill whose tile shares nothing between its tokens
// (scalar, avx2): a.query_tile, halved while the call would have fewer than
// 4 work items per thread, so a call with few tokens (a short chunk of a long
// prompt) keeps every thread busy (3 items on 2 threads left one idle a
// third of the time). Speed only: a row's bits do not depend on its tile.
inline int64_t query_tile_for_threads(const PrefillArgs& a) {
  constexpr int64_t kItemsPerThread = 4;
  auto items = [&](int64_t tile) {
    int64_t n = 0;
    for (int64_t s = 0; s < a.num_seqs; ++s) n += (a.query_lens[s] + tile - 1) / tile * a.num_kv_heads;
    return n;
  };
  int64_t tile = std::max<int64_t>(1, a.query_tile);
  while (tile > 1 && items(tile) < kItemsPerThread * a.num_threads) tile = (tile + 1) / 2;
  return tile;
}

// The work items of such a prefill: (sequence, first query token of a tile of
// `tile`, KV head), each sequence's last tiles (the longest contexts) first,
// so one long prompt keeps every thread busy to the end.
struct PrefillItem {
  int64_t s, i0, kvh;
};
inline std::vector<PrefillItem> prefill_items(const PrefillArgs& a, int64_t tile) {
  std::vector<PrefillItem> items;
  for (int64_t s = 0; s < a.num_seqs; ++s)
    for (int64_t i0 = (a.query_lens[s] - 1) / tile * tile; i0 >= 0; i0 -= tile)
      for (int64_t kvh = 0; kvh < a.num_kv_heads; ++kvh) items.push_back({s, i0, kvh});
  return items;
}

// The threads for a call of `pairs` (query row, key) pairs of head dim D: one below about a
// million multiply-adds, where waking a second thread (tens of microseconds when idle threads
// sleep) costs more than it saves (an AVX2 CPU, `python -m paged.bench kernel`: the decode of
// one sequence of 128 tokens, 9 query heads of 64, took 0.03 ms on one thread, 0.08-0.13 ms on
// two; the AVX-512 decode on a Zen 4, one sequence of 256 keys: 13 µs on one, 63 µs on two).
// Speed only: a row's bits do not depend on the threads.
inline int threads_for_pairs(int threads, int64_t pairs, int64_t head_dim) {
  constexpr int64_t kMinParallelMacs = int64_t(1) << 20;
  return pairs * head_dim < kMinParallelMacs ? 1 : threads;
}

// Runs fn(i, scratch) for i in [0, items) over torch's threads, dynamically
// scheduled so sequences of different lengths balance. Each thread owns one
// Scratch, built once (from the arguments a), not per item.
template <typename Scratch, typename Args, typename Fn>
void for_each_item(const Args& a, int64_t items, Fn&& fn) {
  const int threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(a.num_threads, items)));
#pragma omp parallel num_threads(threads)
  {
    Scratch scratch(a);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < items; ++i) fn(i, scratch);
  }
}
}  // namespace detail

}  // namespace paged
