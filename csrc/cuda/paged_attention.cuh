// The part of paged attention both versions run (paged_attention_v1.cu, _v2.cu):
// one thread block attends one query head of one sequence over a range of logical
// KV blocks, the paper's block-wise equation (§4.1) with an online softmax.
//
// Work split (NUM_WARPS warps of 32 lanes per thread block):
//   * warp w walks logical blocks first + w, first + w + NUM_WARPS, ... and looks
//     each one up in the block table: a warp holds one physical block at a time;
//   * scores: the warp's lanes form groups of kGroup lanes; a group computes the
//     dot product q . k_t of one token with 16-byte coalesced loads along D (a
//     token's D elements are contiguous in the [N, B, H_kv, D] layout), so a warp
//     scores kTokensPerPass tokens at once and B tokens in kPasses passes;
//   * softmax: lane t holds score t of the block (B <= 32); the warp updates its
//     running max m, running sum l and rescales its accumulator (online softmax);
//   * values: each lane owns chunks of output dimensions and adds p_t * v_t for
//     every token t of the block, reading V rows with coalesced loads;
//   * the warps' (m, l, acc) are merged through shared memory at the end.
// Everything is accumulated in float32 whatever the storage dtype.
#pragma once

#include <cfloat>

#include "common.cuh"

namespace paged_cuda {

constexpr int kNumWarps = 4;
constexpr int kNumThreads = kNumWarps * kWarpSize;

template <typename T, int BLOCK_SIZE, int HEAD_DIM>
struct AttentionShape {
  static constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte load
  static constexpr int kChunks = HEAD_DIM / kVec;                // 16-byte chunks per key row
  static constexpr int kGroup = pow2_floor(kChunks < kWarpSize ? kChunks : kWarpSize);
  static constexpr int kChunksPerLane = ceil_div(kChunks, kGroup);
  static constexpr int kTokensPerPass = kWarpSize / kGroup;
  static constexpr int kPasses = BLOCK_SIZE / kTokensPerPass;
  // Values: a lane accumulates kVVec adjacent output dims at a time, 4 when the
  // warp covers D in whole 4-wide chunks (D = 128: one 8- or 16-byte load per
  // lane and token), else 2.
  static constexpr int kVVec = HEAD_DIM % (kWarpSize * 4) == 0 ? 4 : 2;
  static constexpr int kVChunks = HEAD_DIM / kVVec;
  static constexpr int kVChunksPerLane = ceil_div(kVChunks, kWarpSize);
  static_assert(HEAD_DIM % kVec == 0, "head dim must be a multiple of 16 bytes");
  static_assert(BLOCK_SIZE <= kWarpSize, "one lane holds one score of a block");
  static_assert(BLOCK_SIZE % kTokensPerPass == 0, "a pass scores whole groups of tokens");
};

// What the warps leave in shared memory: per warp its max, sum and unnormalised
// output; merge_warps combines them.
template <int BLOCK_SIZE, int HEAD_DIM>
struct AttentionShared {
  float scores[kNumWarps][BLOCK_SIZE];
  float max[kNumWarps];
  float sum[kNumWarps];
  float acc[kNumWarps][HEAD_DIM];
};

// --8<-- [start:attend_blocks]
// Attend query head `q` over logical blocks [first_block, last_block) of one
// sequence. Leaves each warp's (max, sum, acc) in `sh`; ends with __syncthreads.
template <typename T, int BLOCK_SIZE, int HEAD_DIM>
__device__ void attend_blocks(const T* __restrict__ q,              // [D]
                              const T* __restrict__ key_cache,      // [N, B, H_kv, D]
                              const T* __restrict__ value_cache,    // [N, B, H_kv, D]
                              const int32_t* __restrict__ blocks,   // [M] this sequence's row
                              int context_len, int first_block, int last_block, int kv_head,
                              int num_kv_heads, float scale,
                              AttentionShared<BLOCK_SIZE, HEAD_DIM>& sh) {
  using Shape = AttentionShape<T, BLOCK_SIZE, HEAD_DIM>;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int token_in_pass = lane / Shape::kGroup;  // which token of a pass this lane scores
  const int group_lane = lane % Shape::kGroup;     // which chunks of that token it loads

  // This lane's chunks of the query, pre-multiplied by the scale.
  float q_chunk[Shape::kChunksPerLane][Shape::kVec];
#pragma unroll
  for (int i = 0; i < Shape::kChunksPerLane; ++i) {
    const int c = group_lane + i * Shape::kGroup;
    if (c < Shape::kChunks) {
      load_as_float<T, Shape::kVec>(q + c * Shape::kVec, q_chunk[i]);
#pragma unroll
      for (int e = 0; e < Shape::kVec; ++e) q_chunk[i][e] *= scale;
    } else {
#pragma unroll
      for (int e = 0; e < Shape::kVec; ++e) q_chunk[i][e] = 0.f;
    }
  }

  const int64_t token_stride = static_cast<int64_t>(num_kv_heads) * HEAD_DIM;  // [B, H_kv, D]
  float m = -FLT_MAX;  // running max of this warp's scores (finite: no inf - inf)
  float l = 0.f;       // running sum of exp(score - m)
  float acc[Shape::kVChunksPerLane][Shape::kVVec] = {};  // running unnormalised output, this lane's dims

  for (int b = first_block + warp; b < last_block; b += kNumWarps) {
    const int64_t physical = blocks[b];
    PAGED_TRACE_VISIT(b, physical);
    const int filled = min(BLOCK_SIZE, context_len - b * BLOCK_SIZE);  // #filled of block b
    const int64_t base = physical * BLOCK_SIZE * token_stride + kv_head * HEAD_DIM;

    // 1. Scores q . k_t of the block's tokens, kTokensPerPass tokens at a time.
    // Every pass's loads are issued before any reduction, to keep many in flight.
    float dot[Shape::kPasses];
#pragma unroll
    for (int p = 0; p < Shape::kPasses; ++p) {
      const int t = p * Shape::kTokensPerPass + token_in_pass;
      dot[p] = 0.f;
      if (t < filled) {  // slots past #filled hold stale data, maybe NaN: never read
        const T* k_row = key_cache + base + t * token_stride;
#pragma unroll
        for (int i = 0; i < Shape::kChunksPerLane; ++i) {
          const int c = group_lane + i * Shape::kGroup;
          if (c < Shape::kChunks) {
            float k_chunk[Shape::kVec];
            load_as_float<T, Shape::kVec>(k_row + c * Shape::kVec, k_chunk);
#pragma unroll
            for (int e = 0; e < Shape::kVec; ++e) dot[p] += q_chunk[i][e] * k_chunk[e];
          }
        }
      }
    }
#pragma unroll
    for (int p = 0; p < Shape::kPasses; ++p) {
      const int t = p * Shape::kTokensPerPass + token_in_pass;
      const float score = group_sum<Shape::kGroup>(dot[p]);
      if (group_lane == 0) sh.scores[warp][t] = t < filled ? score : -FLT_MAX;
    }
    __syncwarp();

    // 2. Online softmax over the block: lane t holds score t.
    const float s = lane < BLOCK_SIZE ? sh.scores[warp][lane] : -FLT_MAX;
    const float m_new = fmaxf(m, warp_max(s));
    const float p = lane < filled ? expf(s - m_new) : 0.f;
    const float correction = expf(m - m_new);  // rescales what earlier blocks added
    l = l * correction + group_sum<kWarpSize>(p);
    m = m_new;

    // 3. acc = acc * correction + sum_t p_t v_t, each lane over its chunks of dims.
#pragma unroll
    for (int i = 0; i < Shape::kVChunksPerLane; ++i)
#pragma unroll
      for (int e = 0; e < Shape::kVVec; ++e) acc[i][e] *= correction;
#pragma unroll
    for (int t = 0; t < BLOCK_SIZE; ++t) {
      const float p_t = __shfl_sync(kFullMask, p, t);
      if (t < filled) {
        const T* v_row = value_cache + base + t * token_stride;
#pragma unroll
        for (int i = 0; i < Shape::kVChunksPerLane; ++i) {
          const int c = lane + i * kWarpSize;
          if (c < Shape::kVChunks) {
            float v_chunk[Shape::kVVec];
            load_as_float<T, Shape::kVVec>(v_row + c * Shape::kVVec, v_chunk);
#pragma unroll
            for (int e = 0; e < Shape::kVVec; ++e) acc[i][e] += p_t * v_chunk[e];
          }
        }
      }
    }
    __syncwarp();  // scores of this block are read before the next block overwrites them
  }

  if (lane == 0) {
    sh.max[warp] = m;
    sh.sum[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < Shape::kVChunksPerLane; ++i) {
    const int c = lane + i * kWarpSize;
    if (c < Shape::kVChunks) {
#pragma unroll
      for (int e = 0; e < Shape::kVVec; ++e) sh.acc[warp][c * Shape::kVVec + e] = acc[i][e];
    }
  }
  __syncthreads();
}
// --8<-- [end:attend_blocks]

// The thread block's combined softmax statistics: the max over all warps and the
// sum rescaled to it. A warp that walked no block has l = 0 and weighs nothing.
struct Merged {
  float max;
  float sum;
};

template <int BLOCK_SIZE, int HEAD_DIM>
__device__ __forceinline__ Merged merge_warps(const AttentionShared<BLOCK_SIZE, HEAD_DIM>& sh) {
  Merged r{-FLT_MAX, 0.f};
#pragma unroll
  for (int w = 0; w < kNumWarps; ++w) r.max = fmaxf(r.max, sh.max[w]);
#pragma unroll
  for (int w = 0; w < kNumWarps; ++w) r.sum += sh.sum[w] * expf(sh.max[w] - r.max);
  return r;
}

// Unnormalised output dimension d of the whole thread block, rescaled to r.max.
template <int BLOCK_SIZE, int HEAD_DIM>
__device__ __forceinline__ float merged_acc(const AttentionShared<BLOCK_SIZE, HEAD_DIM>& sh,
                                            const Merged& r, int d) {
  float x = 0.f;
#pragma unroll
  for (int w = 0; w < kNumWarps; ++w) x += sh.acc[w][d] * expf(sh.max[w] - r.max);
  return x;
}

// Call f(TypeTag<T>{}, block size, head dim) with compile-time constants for the
// runtime (dtype, B, D); unsupported shapes return cudaErrorInvalidValue (the
// binding rejects them first, with a message).
template <typename T, int B, typename F>
cudaError_t dispatch_head_dim(int head_dim, F& f) {
  switch (head_dim) {
    case 32: return f(TypeTag<T>{}, std::integral_constant<int, B>{}, std::integral_constant<int, 32>{});
    case 64: return f(TypeTag<T>{}, std::integral_constant<int, B>{}, std::integral_constant<int, 64>{});
    case 80: return f(TypeTag<T>{}, std::integral_constant<int, B>{}, std::integral_constant<int, 80>{});
    case 96: return f(TypeTag<T>{}, std::integral_constant<int, B>{}, std::integral_constant<int, 96>{});
    case 128: return f(TypeTag<T>{}, std::integral_constant<int, B>{}, std::integral_constant<int, 128>{});
    default: return cudaErrorInvalidValue;
  }
}

template <typename F>
cudaError_t dispatch_attention(DType dtype, int block_size, int head_dim, F&& f) {
  return dispatch_dtype(dtype, [&](auto type_tag) -> cudaError_t {
    using T = typename decltype(type_tag)::type;
    switch (block_size) {
      case 8: return dispatch_head_dim<T, 8>(head_dim, f);
      case 16: return dispatch_head_dim<T, 16>(head_dim, f);
      case 32: return dispatch_head_dim<T, 32>(head_dim, f);
      default: return cudaErrorInvalidValue;
    }
  });
}

}  // namespace paged_cuda
