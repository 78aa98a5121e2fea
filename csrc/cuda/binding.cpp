// Torch binding of the CUDA kernels: the only file here that includes torch. It
// checks every tensor (device, dtype, shape, layout, alignment) with a message that
// says what was wrong and what is allowed, takes the current CUDA stream and calls
// the plain C++ launchers declared in ops.h. Built by paged/kernels/cuda.py, and
// with PAGED_CUDA_EMULATION by paged/kernels/cuda_emulated.py: the same checks
// for CPU tensors, the kernels run by the device emulation (emulation/).
// The parts of torch the checks and the Python module use (not torch/extension.h:
// it parses all of libtorch, two thirds of the build time).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/utils/pybind.h>

#ifndef PAGED_CUDA_EMULATION
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#else
#include <tuple>
#include <vector>

#include "emulation/trace.h"
#endif

#include <algorithm>
#include <optional>
#include <string>

#include "ops.h"

namespace {

using paged_cuda::DType;

#ifndef PAGED_CUDA_EMULATION
constexpr const char* kDeviceName = "a CUDA tensor";
bool on_device(const at::Tensor& t) { return t.is_cuda(); }
using DeviceGuard = c10::cuda::CUDAGuard;
cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream(); }
#else  // the emulation runs the grid on the CPU, synchronously: no device, no stream
constexpr const char* kDeviceName = "a CPU tensor for the device-emulation build";
bool on_device(const at::Tensor& t) { return t.is_cpu(); }
struct DeviceGuard {
  explicit DeviceGuard(const at::Device&) {}
};
cudaStream_t current_stream() { return nullptr; }
#endif

std::string join(const int* first, const int* last) {
  std::string s;
  for (const int* p = first; p != last; ++p) s += (p == first ? "" : ", ") + std::to_string(*p);
  return s;
}

void check_cuda(const at::Tensor& t, const char* name, const at::Tensor& like) {
  TORCH_CHECK_VALUE(on_device(t), name, " must be ", kDeviceName, ", got one on ", t.device());
  TORCH_CHECK_VALUE(t.device() == like.device(), name, " is on ", t.device(),
                    " but the KV cache is on ", like.device());
}

void check_aligned(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.is_contiguous(), name, " must be contiguous (strides ", t.strides(), ")");
  TORCH_CHECK_VALUE(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, name,
                    " must start on a 16-byte boundary (the kernels load 16 bytes at a time);"
                    " clone() it");
}

// The kernels read the query in 16-byte words from a contiguous [S, H, D] tensor.
// A strided query (the model's view of a fused QKV projection) or a misaligned
// one is packed once into a fresh tensor; S * H * D elements, cheap for decode.
at::Tensor packed(const at::Tensor& t) {
  if (t.is_contiguous() && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0) return t;
  return t.clone(at::MemoryFormat::Contiguous);
}

DType attention_dtype(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::kFloat32;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    default:
      TORCH_CHECK_TYPE(false, "paged attention on CUDA supports float32, float16 and bfloat16, got ",
                       t.scalar_type());
  }
}

void check_cuda_error(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, what, " failed to launch: ", cudaGetErrorString(err));
}

// Checks shared by v1 and v2; returns the launcher arguments and the output tensor.
paged_cuda::AttentionArgs attention_args(const at::Tensor& query, const at::Tensor& key_cache,
                                         const at::Tensor& value_cache,
                                         const at::Tensor& block_tables,
                                         const at::Tensor& context_lens, double scale,
                                         at::Tensor& out) {
  TORCH_CHECK_VALUE(query.dim() == 3, "query must be [S, H, D] (one token per sequence), got shape ",
                    query.sizes());
  TORCH_CHECK_VALUE(key_cache.dim() == 4, "key_cache must be [N, B, H_kv, D], got shape ",
                    key_cache.sizes());
  TORCH_CHECK_VALUE(value_cache.sizes() == key_cache.sizes(), "value_cache has shape ",
                    value_cache.sizes(), " but key_cache has ", key_cache.sizes());
  check_cuda(key_cache, "key_cache", key_cache);
  for (const auto& [t, name] : {std::pair<const at::Tensor&, const char*>{query, "query"},
                                {value_cache, "value_cache"}, {block_tables, "block_tables"},
                                {context_lens, "context_lens"}})
    check_cuda(t, name, key_cache);
  const DType dtype = attention_dtype(query);
  TORCH_CHECK_TYPE(key_cache.scalar_type() == query.scalar_type() &&
                       value_cache.scalar_type() == query.scalar_type(),
                   "query, key_cache and value_cache must share a dtype, got ", query.scalar_type(),
                   ", ", key_cache.scalar_type(), ", ", value_cache.scalar_type());
  const int64_t S = query.size(0), H = query.size(1), D = query.size(2);
  const int64_t B = key_cache.size(1), H_kv = key_cache.size(2);
  TORCH_CHECK_VALUE(key_cache.size(3) == D, "query head dim ", D, " != cache head dim ",
                    key_cache.size(3));
  TORCH_CHECK_VALUE(H_kv > 0 && H % H_kv == 0, "query heads (", H,
                    ") must be a multiple of KV heads (", H_kv, ")");
  const auto& bs = paged_cuda::kBlockSizes;
  const auto& hd = paged_cuda::kHeadDims;
  TORCH_CHECK_VALUE(std::find(std::begin(bs), std::end(bs), B) != std::end(bs),
                    "block size ", B, " is not compiled; supported: ", join(std::begin(bs), std::end(bs)));
  TORCH_CHECK_VALUE(std::find(std::begin(hd), std::end(hd), D) != std::end(hd),
                    "head dim ", D, " is not compiled; supported: ", join(std::begin(hd), std::end(hd)));
  TORCH_CHECK_TYPE(block_tables.scalar_type() == at::kInt && context_lens.scalar_type() == at::kInt,
                   "block_tables and context_lens must be int32, got ", block_tables.scalar_type(),
                   " and ", context_lens.scalar_type());
  TORCH_CHECK_VALUE(block_tables.dim() == 2 && block_tables.size(0) == S,
                    "block_tables must be [S, M] with S = ", S, " sequences, got shape ",
                    block_tables.sizes());
  TORCH_CHECK_VALUE(context_lens.dim() == 1 && context_lens.size(0) == S,
                    "context_lens must be [S] with S = ", S, ", got shape ", context_lens.sizes());
  TORCH_CHECK_VALUE(block_tables.is_contiguous() && context_lens.is_contiguous(),
                    "block_tables and context_lens must be contiguous");
  TORCH_CHECK_VALUE(S <= 65535, "at most 65535 sequences per call, got ", S);
  check_aligned(query, "query");
  check_aligned(key_cache, "key_cache");
  check_aligned(value_cache, "value_cache");
  if (!out.defined()) {
    out = at::empty_like(query);
  } else {
    check_cuda(out, "out", key_cache);
    TORCH_CHECK_VALUE(out.sizes() == query.sizes() && out.scalar_type() == query.scalar_type(),
                      "out must match query: ", query.sizes(), " ", query.scalar_type(), ", got ",
                      out.sizes(), " ", out.scalar_type());
    check_aligned(out, "out");
  }
  paged_cuda::AttentionArgs a{};
  a.out = out.data_ptr();
  a.query = query.data_ptr();
  a.key_cache = key_cache.data_ptr();
  a.value_cache = value_cache.data_ptr();
  a.block_tables = block_tables.data_ptr<int32_t>();
  a.context_lens = context_lens.data_ptr<int32_t>();
  a.num_seqs = static_cast<int>(S);
  a.num_heads = static_cast<int>(H);
  a.num_kv_heads = static_cast<int>(H_kv);
  a.head_dim = static_cast<int>(D);
  a.block_size = static_cast<int>(B);
  a.max_blocks_per_seq = static_cast<int>(block_tables.size(1));
  a.scale = static_cast<float>(scale);
  a.dtype = dtype;
  return a;
}

at::Tensor paged_attention_v1(const at::Tensor& query, const at::Tensor& key_cache,
                              const at::Tensor& value_cache, const at::Tensor& block_tables,
                              const at::Tensor& context_lens, double scale,
                              std::optional<at::Tensor> out) {
  at::Tensor result = out.value_or(at::Tensor());
  const at::Tensor q = packed(query);  // named: it must outlive the launch
  const auto args =
      attention_args(q, key_cache, value_cache, block_tables, context_lens, scale, result);
  const DeviceGuard guard(key_cache.device());
  check_cuda_error(paged_cuda::paged_attention_v1(args, current_stream()),
                   "paged_attention_v1");
  return result;
}

at::Tensor paged_attention_v2(const at::Tensor& query, const at::Tensor& key_cache,
                              const at::Tensor& value_cache, const at::Tensor& block_tables,
                              const at::Tensor& context_lens, double scale,
                              std::optional<at::Tensor> out, int64_t partition_size) {
  at::Tensor result = out.value_or(at::Tensor());
  const at::Tensor q = packed(query);  // named: it must outlive the launch
  const auto args =
      attention_args(q, key_cache, value_cache, block_tables, context_lens, scale, result);
  TORCH_CHECK_VALUE(partition_size > 0 && partition_size % args.block_size == 0,
                    "partition_size must be a positive multiple of the block size ",
                    args.block_size, ", got ", partition_size);
  const int64_t max_tokens = static_cast<int64_t>(args.max_blocks_per_seq) * args.block_size;
  const int64_t P = std::max<int64_t>(1, (max_tokens + partition_size - 1) / partition_size);
  TORCH_CHECK_VALUE(P <= 65535, "block_tables allows ", max_tokens, " tokens, ", P,
                    " partitions of ", partition_size, "; use a larger partition_size");
  const DeviceGuard guard(key_cache.device());
  const auto f32 = query.options().dtype(at::kFloat);
  const int64_t S = args.num_seqs, H = args.num_heads;
  at::Tensor max_logits = at::empty({S, H, P}, f32);
  at::Tensor exp_sums = at::empty({S, H, P}, f32);
  at::Tensor partial_out = at::empty({S, H, P, args.head_dim}, f32);
  check_cuda_error(paged_cuda::paged_attention_v2(args, max_logits.data_ptr<float>(),
                                                  exp_sums.data_ptr<float>(),
                                                  partial_out.data_ptr<float>(),
                                                  static_cast<int>(partition_size),
                                                  static_cast<int>(P),
                                                  current_stream()),
                   "paged_attention_v2");
  return result;
}

void write_kv(at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& k,
              const at::Tensor& v, const at::Tensor& slot_mapping) {
  TORCH_CHECK_VALUE(key_cache.dim() == 4 && value_cache.sizes() == key_cache.sizes(),
                    "key_cache and value_cache must both be [N, B, H_kv, D], got ",
                    key_cache.sizes(), " and ", value_cache.sizes());
  TORCH_CHECK_VALUE(key_cache.is_contiguous() && value_cache.is_contiguous(),
                    "key_cache and value_cache must be contiguous (views kv[l, 0], kv[l, 1])");
  const int64_t H_kv = key_cache.size(2), D = key_cache.size(3);
  for (const auto& [t, name] : {std::pair<const at::Tensor&, const char*>{k, "k"}, {v, "v"}}) {
    check_cuda(t, name, key_cache);
    TORCH_CHECK_VALUE(t.dim() == 3 && t.size(1) == H_kv && t.size(2) == D, name,
                      " must be [T, H_kv, D] = [T, ", H_kv, ", ", D, "], got ", t.sizes());
    TORCH_CHECK_VALUE(t.stride(2) == 1 && t.stride(1) == D, name,
                      " must have contiguous [H_kv, D] rows (a token may be strided), strides ",
                      t.strides());
    TORCH_CHECK_TYPE(t.scalar_type() == key_cache.scalar_type(), name, " is ", t.scalar_type(),
                     " but the cache is ", key_cache.scalar_type());
  }
  check_cuda(key_cache, "key_cache", key_cache);
  check_cuda(value_cache, "value_cache", key_cache);
  check_cuda(slot_mapping, "slot_mapping", key_cache);
  TORCH_CHECK_TYPE(value_cache.scalar_type() == key_cache.scalar_type(),
                   "key_cache and value_cache must share a dtype");
  TORCH_CHECK_TYPE(slot_mapping.scalar_type() == at::kLong, "slot_mapping must be int64, got ",
                   slot_mapping.scalar_type());
  const int64_t T = k.size(0);
  TORCH_CHECK_VALUE(v.size(0) == T && slot_mapping.dim() == 1 && slot_mapping.size(0) == T,
                    "k, v and slot_mapping must have the same number of tokens, got ", T, ", ",
                    v.size(0), ", ", slot_mapping.sizes());
  TORCH_CHECK_VALUE(slot_mapping.is_contiguous(), "slot_mapping must be contiguous");
  TORCH_CHECK_VALUE(T <= 0x7fffffff, "at most 2^31 - 1 tokens per call, got ", T);
  const DeviceGuard guard(key_cache.device());
  check_cuda_error(paged_cuda::write_kv(key_cache.data_ptr(), value_cache.data_ptr(), k.data_ptr(),
                                        v.data_ptr(), slot_mapping.data_ptr<int64_t>(), T, H_kv * D,
                                        k.stride(0), v.stride(0),
                                        static_cast<int>(key_cache.element_size()),
                                        current_stream()),
                   "write_kv");
}

void copy_blocks(at::Tensor& kv, const at::Tensor& pairs) {
  TORCH_CHECK_VALUE(kv.dim() == 6, "kv must be the whole cache [L, 2, N, B, H_kv, D], got shape ",
                    kv.sizes());
  TORCH_CHECK_VALUE(kv.size(1) == 2, "kv dimension 1 must be 2 (keys, values), got ", kv.size(1));
  TORCH_CHECK_VALUE(kv.is_contiguous(), "kv must be contiguous");
  check_cuda(kv, "kv", kv);
  check_cuda(pairs, "pairs", kv);
  TORCH_CHECK_TYPE(pairs.scalar_type() == at::kLong, "pairs must be int64, got ", pairs.scalar_type());
  TORCH_CHECK_VALUE(pairs.dim() == 2 && pairs.size(1) == 2 && pairs.is_contiguous(),
                    "pairs must be a contiguous [P, 2] tensor of (src, dst), got shape ",
                    pairs.sizes());
  TORCH_CHECK_VALUE(pairs.size(0) <= 0x7fffffff && kv.size(0) * 2 <= 65535,
                    "too many pairs or layers for one launch");
  const DeviceGuard guard(kv.device());
  check_cuda_error(paged_cuda::copy_blocks(kv.data_ptr(), pairs.data_ptr<int64_t>(), pairs.size(0),
                                           kv.size(0) * 2, kv.size(2),
                                           kv.size(3) * kv.size(4) * kv.size(5),
                                           static_cast<int>(kv.element_size()),
                                           current_stream()),
                   "copy_blocks");
}

#ifdef PAGED_CUDA_EMULATION
// The tracer's records: (block x, block y, block z, warp, logical block, physical block).
std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>> trace_stop() {
  std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>> out;
  for (const auto& v : paged_emu::trace_stop())
    out.emplace_back(v.block_x, v.block_y, v.block_z, v.warp, v.logical_block, v.physical_block);
  return out;
}
#endif

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "paged CUDA kernels: paged attention v1/v2, write_kv, copy_blocks (csrc/cuda)";
  m.def("paged_attention_v1", &paged_attention_v1, "decode attention, one thread block per head",
        py::arg("query"), py::arg("key_cache"), py::arg("value_cache"), py::arg("block_tables"),
        py::arg("context_lens"), py::arg("scale"), py::arg("out") = py::none());
  m.def("paged_attention_v2", &paged_attention_v2, "decode attention split into partitions",
        py::arg("query"), py::arg("key_cache"), py::arg("value_cache"), py::arg("block_tables"),
        py::arg("context_lens"), py::arg("scale"), py::arg("out") = py::none(),
        py::arg("partition_size") = 512);
  m.def("write_kv", &write_kv, "store new tokens' keys and values at their slots",
        py::arg("key_cache"), py::arg("value_cache"), py::arg("k"), py::arg("v"),
        py::arg("slot_mapping"));
  m.def("copy_blocks", &copy_blocks, "copy (src, dst) blocks in every layer in one launch",
        py::arg("kv"), py::arg("pairs"));
#ifdef PAGED_CUDA_EMULATION
  m.def("trace_start", &paged_emu::trace_start, "record the logical blocks each warp visits");
  m.def("trace_stop", &trace_stop, "stop recording; (block x, y, z, warp, logical, physical) per visit");
#endif
}
