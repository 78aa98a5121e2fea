// Host entry points of the CUDA kernels in csrc/cuda: plain C++ with raw pointers,
// sizes and a cudaStream_t. No torch here: binding.cpp (the only file that includes
// torch) checks tensors and calls these; the .cu files implement them.
//
// KV cache layout (docs/architecture.md): one tensor [L, 2, N, B, H_kv, D]; a layer's keys are
// the contiguous view kv[l, 0] of shape [N, B, H_kv, D], its values kv[l, 1]. Token
// `offset` of physical block `block` sits at slot = block * B + offset. The kernels
// read and write this layout directly (no x-split key layout): for one KV head a
// token's D elements are contiguous, which is what the coalesced loads use.
#pragma once

#include <cstdint>

#ifdef PAGED_CUDA_EMULATION
#include "emulation/runtime_api.h"
#else
#include <cuda_runtime_api.h>
#endif

namespace paged_cuda {

enum class DType { kFloat32, kFloat16, kBFloat16 };

// The shapes the attention kernels are instantiated for (templates, see
// paged_attention.cuh). binding.cpp checks a request against these lists.
constexpr int kBlockSizes[] = {8, 16, 32};
constexpr int kHeadDims[] = {32, 64, 80, 96, 128};

// The arguments both attention versions share. All pointers are device pointers
// to contiguous tensors whose data is 16-byte aligned.
struct AttentionArgs {
  void* out;                     // [S, H, D]
  const void* query;             // [S, H, D]  one query token per sequence (decode)
  const void* key_cache;         // [N, B, H_kv, D]
  const void* value_cache;       // [N, B, H_kv, D]
  const int32_t* block_tables;   // [S, M]  physical block of each logical block
  const int32_t* context_lens;   // [S]     tokens in the cache, the current one included
  int num_seqs;                  // S
  int num_heads;                 // H  (a multiple of H_kv)
  int num_kv_heads;              // H_kv
  int head_dim;                  // D, one of kHeadDims
  int block_size;                // B, one of kBlockSizes
  int max_blocks_per_seq;        // M, the row length of block_tables
  float scale;                   // usually 1 / sqrt(D)
  DType dtype;                   // of query, caches and out
};

// v1: one thread block per (sequence, query head) walks every block of the sequence.
cudaError_t paged_attention_v1(const AttentionArgs& args, cudaStream_t stream);

// v2: the context split into partitions of `partition_size` tokens (a multiple of
// B), one thread block per (sequence, query head, partition), then a reduce kernel.
// Workspace (float32, contiguous), P = max_partitions = ceil(M * B / partition_size):
//   max_logits [S, H, P], exp_sums [S, H, P], partial_out [S, H, P, D].
cudaError_t paged_attention_v2(const AttentionArgs& args, float* max_logits, float* exp_sums,
                               float* partial_out, int partition_size, int max_partitions,
                               cudaStream_t stream);

// The paper's fused reshape-and-write: token t's keys and values [H_kv, D] go to
// slot slot_mapping[t] of the layer's caches; negative slots are skipped (padding).
// A bitwise copy, so it only needs the element size. Token rows of k and v are
// `k_token_stride` / `v_token_stride` elements apart (views of a fused QKV output).
cudaError_t write_kv(void* key_cache, void* value_cache, const void* k, const void* v,
                     const int64_t* slot_mapping, int64_t num_tokens, int64_t row_elems,
                     int64_t k_token_stride, int64_t v_token_stride, int element_size,
                     cudaStream_t stream);

// The paper's fused block copy: for every (src, dst) row of pairs [P, 2], copy block
// src to block dst in every layer, keys and values, in one launch. kv is the whole
// cache [L, 2, N, B, H_kv, D]; block_elems = B * H_kv * D. Destinations must be
// distinct and not sources of other pairs (the block manager guarantees it).
cudaError_t copy_blocks(void* kv, const int64_t* pairs, int64_t num_pairs, int64_t num_planes,
                        int64_t num_blocks, int64_t block_elems, int element_size,
                        cudaStream_t stream);

}  // namespace paged_cuda
