// Interface between the PyTorch binding (bindings.cpp) and the decode kernels
// (paged_attention_scalar.cpp; paged_attention_avx512.cpp, whose header
// describes both). Plain pointers and sizes only, so the kernel files do not
// include the heavy torch headers and compile in parallel with the binding.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace paged {

enum class DType { kFloat32, kBFloat16, kFloat64 };

// One decode step: every sequence s has exactly one query token, which sits
// at position context_lens[s] - 1 and attends to all context_lens[s] tokens.
// The binding checks every field before a kernel sees it.
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
};

// scalar: readable, any dtype and any head dim.
void paged_attention_decode_scalar(const DecodeArgs& args);

// avx512: float32 / bfloat16, head_dim % 16 == 0. Returns false (and does
// nothing) when this build or these arguments cannot take it.
bool paged_attention_decode_avx512(const DecodeArgs& args);

// Whether avx512 was compiled in (the compiler targeted AVX-512F).
bool avx512_compiled();

namespace detail {
// Runs fn(i, scratch) for i in [0, items) over torch's threads, dynamically
// scheduled so sequences of different lengths balance. Each thread owns one
// Scratch, built once, not per item.
template <typename Scratch, typename Fn>
void for_each_item(const DecodeArgs& a, int64_t items, Fn&& fn) {
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
