// KV cache operations of the paper's §5 "fused" kernels, for the [L, 2, N, B, H_kv, D]
// cache of docs/architecture.md. Both are bitwise copies, so they depend only on the element
// size, never on the dtype's arithmetic.
//
// Versions:
//   write_kv     the fused reshape-and-write: the new tokens' keys and values, as the
//                projection produced them ([T, H_kv, D] rows, possibly strided views
//                of a fused QKV output), go straight to their slots in one launch,
//                instead of a split, a reshape and a scatter. One thread block per
//                token; negative slots are padding and are skipped.
//   copy_blocks  the fused block copy for copy-on-write and prefix sharing: every
//                (src, dst) pair, in every layer, keys and values, in one launch.
//                Grid (pairs, 2L): one thread block copies one block of one
//                layer's keys or values; no host loop over layers or pairs.
// Both copy in the widest word (16, 8, 4, 2 or 1 bytes) that the sizes and the
// addresses allow, chosen once on the host.
#include <initializer_list>

#include "common.cuh"

namespace paged_cuda {

namespace {

constexpr int kCopyThreads = 256;

// The widest power-of-two word, at most 16 bytes, dividing every value given.
int widest_word(std::initializer_list<uint64_t> values) {
  int word = 16;
  for (uint64_t v : values)
    while (v % static_cast<uint64_t>(word) != 0) word /= 2;
  return word;
}

template <typename F>
cudaError_t dispatch_word(int word, F&& f) {
  switch (word) {
    case 16: return f(TypeTag<Word<16>::type>{});
    case 8: return f(TypeTag<Word<8>::type>{});
    case 4: return f(TypeTag<Word<4>::type>{});
    case 2: return f(TypeTag<Word<2>::type>{});
    case 1: return f(TypeTag<Word<1>::type>{});
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

// --8<-- [start:write_kv]
template <typename W>
__global__ void write_kv_kernel(W* __restrict__ key_cache,    // [N * B, H_kv * D] in words
                                W* __restrict__ value_cache,  // [N * B, H_kv * D]
                                const W* __restrict__ k,      // [T, k_token_stride]
                                const W* __restrict__ v,      // [T, v_token_stride]
                                const int64_t* __restrict__ slot_mapping,  // [T]
                                int64_t row_words, int64_t k_token_stride, int64_t v_token_stride) {
  const int64_t token = blockIdx.x;
  const int64_t slot = slot_mapping[token];
  if (slot < 0) return;  // padding token: nothing to store
  W* k_dst = key_cache + slot * row_words;
  W* v_dst = value_cache + slot * row_words;
  const W* k_src = k + token * k_token_stride;
  const W* v_src = v + token * v_token_stride;
  for (int64_t i = threadIdx.x; i < row_words; i += blockDim.x) {
    k_dst[i] = k_src[i];
    v_dst[i] = v_src[i];
  }
}
// --8<-- [end:write_kv]

// --8<-- [start:copy_blocks]
template <typename W>
__global__ void copy_blocks_kernel(W* __restrict__ kv,               // [2L, N, block_words]
                                   const int64_t* __restrict__ pairs,  // [P, 2] (src, dst)
                                   int64_t num_blocks, int64_t block_words) {
  const int64_t pair = blockIdx.x;
  const int64_t plane = blockIdx.y;  // layer * 2 + (0 keys | 1 values)
  W* base = kv + plane * num_blocks * block_words;
  const W* src = base + pairs[2 * pair] * block_words;
  W* dst = base + pairs[2 * pair + 1] * block_words;
  for (int64_t i = threadIdx.x; i < block_words; i += blockDim.x) dst[i] = src[i];
}
// --8<-- [end:copy_blocks]

cudaError_t write_kv(void* key_cache, void* value_cache, const void* k, const void* v,
                     const int64_t* slot_mapping, int64_t num_tokens, int64_t row_elems,
                     int64_t k_token_stride, int64_t v_token_stride, int element_size,
                     cudaStream_t stream) {
  if (num_tokens == 0 || row_elems == 0) return cudaSuccess;
  const uint64_t es = static_cast<uint64_t>(element_size);
  const int word = widest_word({row_elems * es, k_token_stride * es, v_token_stride * es,
                                reinterpret_cast<uintptr_t>(key_cache),
                                reinterpret_cast<uintptr_t>(value_cache),
                                reinterpret_cast<uintptr_t>(k), reinterpret_cast<uintptr_t>(v)});
  return dispatch_word(word, [&](auto word_tag) -> cudaError_t {
    using W = typename decltype(word_tag)::type;
    const int64_t bytes = static_cast<int64_t>(sizeof(W));
    PAGED_LAUNCH(static_cast<unsigned>(num_tokens), kCopyThreads, stream, write_kv_kernel<W>)(
        static_cast<W*>(key_cache), static_cast<W*>(value_cache), static_cast<const W*>(k),
        static_cast<const W*>(v), slot_mapping, row_elems * element_size / bytes,
        k_token_stride * element_size / bytes, v_token_stride * element_size / bytes);
    return cudaGetLastError();
  });
}

cudaError_t copy_blocks(void* kv, const int64_t* pairs, int64_t num_pairs, int64_t num_planes,
                        int64_t num_blocks, int64_t block_elems, int element_size,
                        cudaStream_t stream) {
  if (num_pairs == 0 || num_planes == 0 || block_elems == 0) return cudaSuccess;
  const int64_t block_bytes = block_elems * element_size;
  const int word = widest_word({static_cast<uint64_t>(block_bytes), reinterpret_cast<uintptr_t>(kv)});
  return dispatch_word(word, [&](auto word_tag) -> cudaError_t {
    using W = typename decltype(word_tag)::type;
    const dim3 grid(static_cast<unsigned>(num_pairs), static_cast<unsigned>(num_planes));
    PAGED_LAUNCH(grid, kCopyThreads, stream, copy_blocks_kernel<W>)(
        static_cast<W*>(kv), pairs, num_blocks, block_bytes / static_cast<int64_t>(sizeof(W)));
    return cudaGetLastError();
  });
}

}  // namespace paged_cuda
