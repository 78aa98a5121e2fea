// Paged attention for decode, version 1: one thread block per (sequence, query head).
//
// Versions of the decode attention kernel (the CPU reference is paged/step03_attention/
// blockwise.py; every version is tested against tests/oracle.py):
//   v1 (this file)  one thread block walks all of a sequence's blocks. Simplest
//                   mapping of the paper's block-wise equation; enough parallelism
//                   when S * H fills the GPU (large batches, short contexts).
//   v2 (paged_attention_v2.cu)  splits the context into partitions, one thread
//                   block each, then reduces: keeps the GPU busy when few long
//                   sequences would leave most SMs idle under v1 (flash-decoding).
// Both run the same per-block loop, attend_blocks in paged_attention.cuh; nothing
// of it is pasted between them.
//
// Grouped-query attention: query head h reads KV head h / (H / H_kv). Each query
// head of a group re-reads its KV head; the repeats hit in L2.
#include "paged_attention.cuh"

namespace paged_cuda {

// --8<-- [start:v1]
template <typename T, int BLOCK_SIZE, int HEAD_DIM>
__global__ void __launch_bounds__(kNumThreads)
    paged_attention_v1_kernel(T* __restrict__ out,                   // [S, H, D]
                              const T* __restrict__ query,           // [S, H, D]
                              const T* __restrict__ key_cache,       // [N, B, H_kv, D]
                              const T* __restrict__ value_cache,     // [N, B, H_kv, D]
                              const int32_t* __restrict__ block_tables,  // [S, M]
                              const int32_t* __restrict__ context_lens,  // [S]
                              int num_kv_heads, int max_blocks_per_seq, float scale) {
  __shared__ AttentionShared<BLOCK_SIZE, HEAD_DIM> sh;
  const int head = blockIdx.x, seq = blockIdx.y, num_heads = gridDim.x;
  const int kv_head = head / (num_heads / num_kv_heads);
  const int64_t row = (static_cast<int64_t>(seq) * num_heads + head) * HEAD_DIM;
  const int context_len = context_lens[seq];
  if (context_len <= 0) {  // no keys: define the output as zeros
    for (int d = threadIdx.x; d < HEAD_DIM; d += blockDim.x) out[row + d] = from_float<T>(0.f);
    return;
  }
  const int num_blocks = (context_len + BLOCK_SIZE - 1) / BLOCK_SIZE;
  attend_blocks<T, BLOCK_SIZE, HEAD_DIM>(
      query + row, key_cache, value_cache,
      block_tables + static_cast<int64_t>(seq) * max_blocks_per_seq, context_len,
      /*first_block=*/0, /*last_block=*/num_blocks, kv_head, num_kv_heads, scale, sh);
  const Merged r = merge_warps(sh);
  for (int d = threadIdx.x; d < HEAD_DIM; d += blockDim.x)
    out[row + d] = from_float<T>(merged_acc(sh, r, d) / r.sum);
}
// --8<-- [end:v1]

cudaError_t paged_attention_v1(const AttentionArgs& a, cudaStream_t stream) {
  if (a.num_seqs == 0 || a.num_heads == 0) return cudaSuccess;
  return dispatch_attention(a.dtype, a.block_size, a.head_dim,
                            [&](auto type_tag, auto block_size, auto head_dim) -> cudaError_t {
    using T = typename decltype(type_tag)::type;
    constexpr int B = decltype(block_size)::value;
    constexpr int D = decltype(head_dim)::value;
    const dim3 grid(a.num_heads, a.num_seqs);
    PAGED_LAUNCH(grid, kNumThreads, stream, paged_attention_v1_kernel<T, B, D>)(
        static_cast<T*>(a.out), static_cast<const T*>(a.query),
        static_cast<const T*>(a.key_cache), static_cast<const T*>(a.value_cache),
        a.block_tables, a.context_lens, a.num_kv_heads, a.max_blocks_per_seq, a.scale);
    return cudaGetLastError();
  });
}

}  // namespace paged_cuda
