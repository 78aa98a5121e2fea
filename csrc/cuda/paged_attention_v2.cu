// Paged attention for decode, version 2: the context split into partitions
// (flash-decoding), one thread block per (sequence, query head, partition), then a
// reduce kernel per (sequence, query head).
//
// Versions of the decode attention kernel (see also paged_attention_v1.cu):
//   v1 (paged_attention_v1.cu)  one thread block per (sequence, query head).
//   v2 (this file)  with few sequences and long contexts, v1 launches S * H thread
//                   blocks that each walk thousands of tokens while most SMs idle.
//                   v2 adds a grid dimension over partitions of `partition_size`
//                   tokens so the number of thread blocks grows with the context.
//                   Each partition keeps its own softmax max and sum and its own
//                   normalised output, in float32; the reduce kernel rescales the
//                   partitions to the global max and combines them:
//                       M = max_p m_p,   w_p = l_p * exp(m_p - M),
//                       o = sum_p w_p o_p / sum_p w_p.
//                   This is the same merge as the online softmax of attend_blocks,
//                   one level up. Costs one more launch and a float32 round trip
//                   of S * H * P * D partial outputs.
#include "paged_attention.cuh"

namespace paged_cuda {

// --8<-- [start:v2_partition]
template <typename T, int BLOCK_SIZE, int HEAD_DIM>
__global__ void __launch_bounds__(kNumThreads)
    paged_attention_v2_partition_kernel(float* __restrict__ max_logits,   // [S, H, P]
                                        float* __restrict__ exp_sums,     // [S, H, P]
                                        float* __restrict__ partial_out,  // [S, H, P, D]
                                        const T* __restrict__ query,      // [S, H, D]
                                        const T* __restrict__ key_cache,  // [N, B, H_kv, D]
                                        const T* __restrict__ value_cache,
                                        const int32_t* __restrict__ block_tables,  // [S, M]
                                        const int32_t* __restrict__ context_lens,  // [S]
                                        int num_kv_heads, int max_blocks_per_seq, float scale,
                                        int partition_size) {
  __shared__ AttentionShared<BLOCK_SIZE, HEAD_DIM> sh;
  const int head = blockIdx.x, seq = blockIdx.y, part = blockIdx.z;
  const int num_heads = gridDim.x, max_partitions = gridDim.z;
  const int context_len = context_lens[seq];
  const int blocks_per_partition = partition_size / BLOCK_SIZE;
  const int num_blocks = (context_len + BLOCK_SIZE - 1) / BLOCK_SIZE;
  const int first_block = part * blocks_per_partition;
  if (first_block >= num_blocks) return;  // past this sequence's end: the reduce skips it
  const int last_block = min(first_block + blocks_per_partition, num_blocks);

  const int kv_head = head / (num_heads / num_kv_heads);
  const int64_t row = static_cast<int64_t>(seq) * num_heads + head;
  attend_blocks<T, BLOCK_SIZE, HEAD_DIM>(
      query + row * HEAD_DIM, key_cache, value_cache,
      block_tables + static_cast<int64_t>(seq) * max_blocks_per_seq, context_len, first_block,
      last_block, kv_head, num_kv_heads, scale, sh);
  const Merged r = merge_warps(sh);
  const int64_t slot = row * max_partitions + part;
  if (threadIdx.x == 0) {
    max_logits[slot] = r.max;
    exp_sums[slot] = r.sum;
  }
  for (int d = threadIdx.x; d < HEAD_DIM; d += blockDim.x)
    partial_out[slot * HEAD_DIM + d] = merged_acc(sh, r, d) / r.sum;
}
// --8<-- [end:v2_partition]

// --8<-- [start:v2_reduce]
template <typename T>
__global__ void __launch_bounds__(kNumThreads)
    paged_attention_v2_reduce_kernel(T* __restrict__ out,                     // [S, H, D]
                                     const float* __restrict__ max_logits,   // [S, H, P]
                                     const float* __restrict__ exp_sums,     // [S, H, P]
                                     const float* __restrict__ partial_out,  // [S, H, P, D]
                                     const int32_t* __restrict__ context_lens,  // [S]
                                     int head_dim, int partition_size, int max_partitions) {
  const int head = blockIdx.x, seq = blockIdx.y, num_heads = gridDim.x;
  const int64_t row = static_cast<int64_t>(seq) * num_heads + head;
  const int num_partitions = (context_lens[seq] + partition_size - 1) / partition_size;
  const float* m = max_logits + row * max_partitions;
  const float* l = exp_sums + row * max_partitions;
  const float* o = partial_out + row * max_partitions * head_dim;
  float global_max = -FLT_MAX;
  for (int p = 0; p < num_partitions; ++p) global_max = fmaxf(global_max, m[p]);
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float num = 0.f, den = 0.f;
    for (int p = 0; p < num_partitions; ++p) {
      const float w = l[p] * expf(m[p] - global_max);
      num += w * o[static_cast<int64_t>(p) * head_dim + d];
      den += w;
    }
    out[row * head_dim + d] = from_float<T>(num_partitions > 0 ? num / den : 0.f);
  }
}
// --8<-- [end:v2_reduce]

cudaError_t paged_attention_v2(const AttentionArgs& a, float* max_logits, float* exp_sums,
                               float* partial_out, int partition_size, int max_partitions,
                               cudaStream_t stream) {
  if (a.num_seqs == 0 || a.num_heads == 0) return cudaSuccess;
  if (partition_size <= 0 || partition_size % a.block_size != 0 || max_partitions <= 0)
    return cudaErrorInvalidValue;
  return dispatch_attention(a.dtype, a.block_size, a.head_dim,
                            [&](auto type_tag, auto block_size, auto head_dim) -> cudaError_t {
    using T = typename decltype(type_tag)::type;
    constexpr int B = decltype(block_size)::value;
    constexpr int D = decltype(head_dim)::value;
    const dim3 grid(a.num_heads, a.num_seqs, max_partitions);
    PAGED_LAUNCH(grid, kNumThreads, stream, paged_attention_v2_partition_kernel<T, B, D>)(
        max_logits, exp_sums, partial_out, static_cast<const T*>(a.query),
        static_cast<const T*>(a.key_cache), static_cast<const T*>(a.value_cache),
        a.block_tables, a.context_lens, a.num_kv_heads, a.max_blocks_per_seq, a.scale,
        partition_size);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    PAGED_LAUNCH(dim3(a.num_heads, a.num_seqs), kNumThreads, stream, paged_attention_v2_reduce_kernel<T>)(
        static_cast<T*>(a.out), max_logits, exp_sums, partial_out, a.context_lens, D,
        partition_size, max_partitions);
    return cudaGetLastError();
  });
}

}  // namespace paged_cuda
