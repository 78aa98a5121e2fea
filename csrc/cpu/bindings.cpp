// Python binding of the CPU kernels: argument checks, then plain pointers to
// paged_attention_avx512.cpp / paged_attention_scalar.cpp (decode attention)
// and paged_prefill_avx512.cpp / paged_attention_scalar.cpp (prefill), with
// paged_attention_avx2.cpp (both: the scalar's arithmetic in AVX2 vectors);
// the KV write by slot mapping; and the fused element-wise ops of
// fused_ops.cpp (which check their own arguments).
//
// Every check raises an exception a user can act on: TypeError for a wrong
// dtype, ValueError for a wrong shape, layout or value, naming the argument,
// what it was, and what was expected. A kernel never sees an unchecked index.
//
// Implementations: decode(impl="auto") picks avx512 when it applies, else avx2
// when it applies (bitwise the scalar's), else scalar; impl="scalar" / "avx2" /
// "avx512" force one, for the tests that check each against the oracle (and
// avx2 against scalar); partition_blocks forces avx512's split-context
// partitioning (tests) or leaves it to the kernel (-1). prefill takes the same
// impl, and query_tile (query tokens per work item: speed only, the tests vary
// it to show the bits do not move). Both take a sliding window and a score
// soft-cap (None: none; paged_attention.h). write_kv has one
// implementation (a row copy per token).

// Narrow includes instead of <torch/extension.h>: they halve the first build.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/utils/pybind.h>

#include <cmath>
#include <cstring>
#include <sstream>
#include <vector>

#include "fixed_order_linear.h"
#include "fused_ops.h"
#include "quant_linear.h"
#include "paged_attention.h"
#include "softmax_exp.h"

namespace {

std::string shape_of(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

paged::DType kernel_dtype(const at::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat: return paged::DType::kFloat32;
    case at::kBFloat16: return paged::DType::kBFloat16;
    case at::kDouble: return paged::DType::kFloat64;
    default:
      TORCH_CHECK_TYPE(false, name, " must be float32, bfloat16 or float64, got ", t.scalar_type());
  }
  return paged::DType::kFloat32;  // unreachable
}

void check_cpu(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), name, " must be on the CPU, got ", t.device());
}

// key_cache / value_cache: [N, B, H_kv, D], contiguous, same dtype as `like`.
void check_cache(const at::Tensor& c, const char* name, const at::Tensor& like) {
  check_cpu(c, name);
  TORCH_CHECK_VALUE(c.dim() == 4, name, " must be [N, B, H_kv, D], got shape ", shape_of(c));
  TORCH_CHECK_TYPE(c.scalar_type() == like.scalar_type(), name, " must have dtype ",
                   like.scalar_type(), " like the query / new keys, got ", c.scalar_type());
  TORCH_CHECK_VALUE(c.is_contiguous(), name,
                    " must be contiguous (a layer view kv[l, 0] or kv[l, 1] of the "
                    "[L, 2, N, B, H_kv, D] cache is)");
}

// What decode and prefill share: the query [rows, H, D] and the caches
// checked against each other; S sequences' block tables and context lengths
// checked for dtype and shape (their values are checked by the caller, which
// knows each kernel's bounds); the output allocated or checked.
struct Inputs {
  int64_t S, H, D, N, B, H_kv, M;
  at::Tensor query, block_tables, context_lens, out;
};

Inputs check_inputs(const at::Tensor& query_in, const at::Tensor& key_cache, const at::Tensor& value_cache,
                    const at::Tensor& block_tables_in, const at::Tensor& context_lens_in, int64_t S,
                    const c10::optional<at::Tensor>& out_in, const char* query_shape) {
  check_cpu(query_in, "query");
  kernel_dtype(query_in, "query");
  TORCH_CHECK_VALUE(query_in.dim() == 3, "query must be ", query_shape, ", got shape ", shape_of(query_in));
  check_cache(key_cache, "key_cache", query_in);
  check_cache(value_cache, "value_cache", query_in);
  TORCH_CHECK_VALUE(value_cache.sizes() == key_cache.sizes(), "value_cache shape ",
                    shape_of(value_cache), " differs from key_cache shape ", shape_of(key_cache));
  Inputs in;
  in.S = S;
  in.H = query_in.size(1), in.D = query_in.size(2);
  in.N = key_cache.size(0), in.B = key_cache.size(1), in.H_kv = key_cache.size(2);
  TORCH_CHECK_VALUE(key_cache.size(3) == in.D, "head dim of key_cache (", key_cache.size(3),
                    ") differs from the query's (", in.D, ")");
  TORCH_CHECK_VALUE(in.H_kv > 0 && in.H % in.H_kv == 0, "query heads H = ", in.H,
                    " must be a multiple of the cache's KV heads H_kv = ", in.H_kv);
  TORCH_CHECK_VALUE(in.D > 0 && in.B > 0, "head dim and block size must be positive, got D = ", in.D,
                    ", B = ", in.B);

  check_cpu(block_tables_in, "block_tables");
  check_cpu(context_lens_in, "context_lens");
  TORCH_CHECK_TYPE(block_tables_in.scalar_type() == at::kInt, "block_tables must be int32, got ",
                   block_tables_in.scalar_type());
  TORCH_CHECK_TYPE(context_lens_in.scalar_type() == at::kInt, "context_lens must be int32, got ",
                   context_lens_in.scalar_type());
  TORCH_CHECK_VALUE(block_tables_in.dim() == 2 && block_tables_in.size(0) == S,
                    "block_tables must be [S, M] with S = ", S, " sequences, got shape ",
                    shape_of(block_tables_in));
  TORCH_CHECK_VALUE(context_lens_in.dim() == 1 && context_lens_in.size(0) == S,
                    "context_lens must be [S] with S = ", S, ", got shape ", shape_of(context_lens_in));
  in.block_tables = block_tables_in.contiguous();
  in.context_lens = context_lens_in.contiguous();
  in.M = in.block_tables.size(1);

  // Rows of D must be contiguous; row and head strides may be anything
  // (a query sliced out of a fused QKV projection keeps its strides).
  in.query = query_in.stride(2) == 1 ? query_in : query_in.contiguous();
  if (out_in.has_value()) {
    in.out = *out_in;
    check_cpu(in.out, "out");
    TORCH_CHECK_TYPE(in.out.scalar_type() == in.query.scalar_type(), "out must have dtype ",
                     in.query.scalar_type(), ", got ", in.out.scalar_type());
    TORCH_CHECK_VALUE(in.out.sizes() == in.query.sizes(), "out must have the query's shape ",
                      shape_of(in.query), ", got ", shape_of(in.out));
    TORCH_CHECK_VALUE(in.out.stride(2) == 1, "out must have contiguous rows (stride 1 in the last dim)");
  } else {
    in.out = at::empty_like(in.query, at::MemoryFormat::Contiguous);
  }
  return in;
}

// Every block a sequence of len tokens reads (from the one holding position
// `from`, its first query's window start) must be a physical block of the cache.
void check_blocks(const Inputs& in, int64_t s, int64_t len, int64_t from = 0) {
  const int32_t* table = in.block_tables.data_ptr<int32_t>();
  for (int64_t j = from / in.B; j * in.B < len; ++j) {
    const int64_t b = table[s * in.M + j];
    TORCH_CHECK_VALUE(b >= 0 && b < in.N, "block_tables[", s, ", ", j, "] = ", b,
                      " is not a physical block of the cache (N = ", in.N, ")");
  }
}

void check_impl(const std::string& impl) {
  TORCH_CHECK_VALUE(impl == "auto" || impl == "scalar" || impl == "avx2" || impl == "avx512",
                    "impl must be 'auto', 'scalar', 'avx2' or 'avx512', got '", impl, "'");
}

// A sliding window of at least one key (None: none) and a positive, finite soft-cap (None: none),
// stored in args (0 meaning none).
void set_window_and_softcap(paged::DecodeArgs& args, const c10::optional<int64_t>& window,
                            const c10::optional<double>& softcap) {
  TORCH_CHECK_VALUE(!window.has_value() || *window >= 1, "window must be >= 1 (keys a query sees, itself "
                    "included) or None, got ", window.value_or(0));
  TORCH_CHECK_VALUE(!softcap.has_value() || (std::isfinite(*softcap) && *softcap > 0),
                    "softcap must be a finite number > 0 or None, got ", softcap.value_or(0));
  args.window = window.value_or(0);
  args.softcap = softcap.value_or(0);
}

void fill_args(paged::DecodeArgs& args, const Inputs& in, const at::Tensor& key_cache, const at::Tensor& value_cache,
               double scale) {
  args.query = in.query.data_ptr();
  args.key_cache = key_cache.data_ptr();
  args.value_cache = value_cache.data_ptr();
  args.out = in.out.data_ptr();
  args.block_tables = in.block_tables.data_ptr<int32_t>();
  args.context_lens = in.context_lens.data_ptr<int32_t>();
  args.num_seqs = in.S;
  args.num_heads = in.H;
  args.num_kv_heads = in.H_kv;
  args.head_dim = in.D;
  args.block_size = in.B;
  args.max_blocks = in.M;
  args.q_stride_s = in.query.stride(0);
  args.q_stride_h = in.query.stride(1);
  args.out_stride_s = in.out.stride(0);
  args.out_stride_h = in.out.stride(1);
  args.scale = scale;
  args.dtype = kernel_dtype(in.query, "query");
  args.num_threads = at::get_num_threads();
}

// impl "scalar": the scalar kernel; else avx512, or for "auto" scalar where avx512 does not apply.
template <typename Args>
void run_kernel(const std::string& impl, const Args& args, const Inputs& in, void (*scalar)(const Args&),
                bool (*avx2)(const Args&), bool (*avx512)(const Args&)) {
  if (impl == "scalar") return scalar(args);
  if (impl != "avx2" && avx512(args)) return;
  TORCH_CHECK_VALUE(impl != "avx512", "impl 'avx512' needs an AVX-512 build and float32 or bfloat16 with a head "
                    "dim in {16, 32, ..., 128, 160, 192, 256}; got ", in.query.scalar_type(), ", D = ", in.D,
                    ", AVX-512 build: ", paged::avx512_compiled() ? "yes" : "no");
  if (avx2(args)) return;
  TORCH_CHECK_VALUE(impl == "auto", "impl 'avx2' needs an AVX2 build and float32 or bfloat16 with a head dim "
                    "that is a multiple of 16; got ", in.query.scalar_type(), ", D = ", in.D,
                    ", AVX2 build: ", paged::avx2_compiled() ? "yes" : "no");
  scalar(args);
}

at::Tensor decode(const at::Tensor& query_in,   // [S, H, D]
                  const at::Tensor& key_cache,  // [N, B, H_kv, D]
                  const at::Tensor& value_cache,
                  const at::Tensor& block_tables_in,  // [S, M] int32
                  const at::Tensor& context_lens_in,  // [S] int32
                  double scale, c10::optional<at::Tensor> out_in, const std::string& impl,
                  int64_t partition_blocks, c10::optional<int64_t> window, c10::optional<double> softcap) {
  const int64_t S = query_in.dim() == 3 ? query_in.size(0) : 0;
  Inputs in = check_inputs(query_in, key_cache, value_cache, block_tables_in, context_lens_in, S, out_in,
                           "[S, H, D] (one token per sequence)");
  paged::DecodeArgs args;
  set_window_and_softcap(args, window, softcap);
  const int32_t* lens = in.context_lens.data_ptr<int32_t>();
  for (int64_t s = 0; s < S; ++s) {
    TORCH_CHECK_VALUE(lens[s] >= 1 && lens[s] <= in.M * in.B, "context_lens[", s, "] = ", lens[s],
                      " must be in [1, M * B] = [1, ", in.M * in.B, "] (M = ", in.M,
                      " block-table columns, B = ", in.B, ")");
    check_blocks(in, s, lens[s], paged::first_key(args, lens[s] - 1));
  }
  check_impl(impl);
  TORCH_CHECK_VALUE(partition_blocks >= -1, "partition_blocks must be -1 (auto), 0 (none) or a block count, got ",
                    partition_blocks);
  if (S == 0 || in.H == 0) return in.out;

  fill_args(args, in, key_cache, value_cache, scale);
  args.partition_blocks = partition_blocks;
  run_kernel(impl, args, in, paged::paged_attention_decode_scalar, paged::paged_attention_decode_avx2,
             paged::paged_attention_decode_avx512);
  return in.out;
}

at::Tensor prefill(const at::Tensor& query_in,   // [T, H, D] the new tokens of every sequence, packed
                   const at::Tensor& key_cache,  // [N, B, H_kv, D]
                   const at::Tensor& value_cache,
                   const at::Tensor& block_tables_in,  // [S, M] int32
                   const at::Tensor& context_lens_in,  // [S] int32, new tokens included
                   const at::Tensor& query_lens_in,    // [S] int32, new tokens of each sequence
                   double scale, c10::optional<at::Tensor> out_in, const std::string& impl,
                   int64_t query_tile, c10::optional<int64_t> window, c10::optional<double> softcap) {
  TORCH_CHECK_VALUE(context_lens_in.dim() == 1, "context_lens must be [S] (one length per sequence), got shape ",
                    shape_of(context_lens_in));
  const int64_t S = context_lens_in.size(0);
  Inputs in = check_inputs(query_in, key_cache, value_cache, block_tables_in, context_lens_in, S, out_in,
                           "[T, H, D] (the new tokens of every sequence, packed)");
  check_cpu(query_lens_in, "query_lens");
  TORCH_CHECK_TYPE(query_lens_in.scalar_type() == at::kInt, "query_lens must be int32, got ",
                   query_lens_in.scalar_type());
  TORCH_CHECK_VALUE(query_lens_in.dim() == 1 && query_lens_in.size(0) == S,
                    "query_lens must be [S] with S = ", S, ", got shape ", shape_of(query_lens_in));
  const at::Tensor query_lens = query_lens_in.contiguous();
  const int32_t* q_lens = query_lens.data_ptr<int32_t>();
  paged::PrefillArgs args;
  set_window_and_softcap(args, window, softcap);
  const int32_t* lens = in.context_lens.data_ptr<int32_t>();
  std::vector<int64_t> starts(S);
  int64_t rows = 0;
  for (int64_t s = 0; s < S; ++s) {
    TORCH_CHECK_VALUE(lens[s] >= 0 && lens[s] <= in.M * in.B, "context_lens[", s, "] = ", lens[s],
                      " must be in [0, M * B] = [0, ", in.M * in.B, "] (M = ", in.M,
                      " block-table columns, B = ", in.B, ")");
    TORCH_CHECK_VALUE(q_lens[s] >= 0 && q_lens[s] <= lens[s], "query_lens[", s, "] = ", q_lens[s],
                      " must be in [0, context_lens[", s, "]] = [0, ", lens[s], "]");
    check_blocks(in, s, lens[s], paged::first_key(args, lens[s] - q_lens[s]));
    starts[s] = rows;
    rows += q_lens[s];
  }
  TORCH_CHECK_VALUE(rows == in.query.size(0), "query_lens sum to ", rows, " but query has ", in.query.size(0),
                    " token rows");
  check_impl(impl);
  TORCH_CHECK_VALUE(query_tile >= 1, "query_tile must be >= 1, got ", query_tile);
  if (rows == 0 || in.H == 0) return in.out;

  fill_args(args, in, key_cache, value_cache, scale);
  args.query_lens = q_lens;
  args.query_starts = starts.data();
  args.query_tile = query_tile;
  run_kernel(impl, args, in, paged::paged_attention_prefill_scalar, paged::paged_attention_prefill_avx2,
             paged::paged_attention_prefill_avx512);
  return in.out;
}

// key_cache.view(N * B, H_kv, D)[slot_mapping[t]] = k[t] (same for v); slots < 0 are skipped.
void write_kv(const at::Tensor& key_cache, const at::Tensor& value_cache, const at::Tensor& k_in,
              const at::Tensor& v_in, const at::Tensor& slot_mapping_in) {
  check_cpu(k_in, "k");
  check_cpu(v_in, "v");
  check_cache(key_cache, "key_cache", k_in);
  check_cache(value_cache, "value_cache", k_in);
  TORCH_CHECK_VALUE(value_cache.sizes() == key_cache.sizes(), "value_cache shape ",
                    shape_of(value_cache), " differs from key_cache shape ", shape_of(key_cache));
  TORCH_CHECK_TYPE(v_in.scalar_type() == k_in.scalar_type(), "v must have k's dtype ",
                   k_in.scalar_type(), ", got ", v_in.scalar_type());
  const int64_t N = key_cache.size(0), B = key_cache.size(1), H_kv = key_cache.size(2),
                D = key_cache.size(3);
  TORCH_CHECK_VALUE(k_in.dim() == 3 && k_in.size(1) == H_kv && k_in.size(2) == D,
                    "k must be [T, H_kv, D] = [T, ", H_kv, ", ", D, "], got shape ", shape_of(k_in));
  TORCH_CHECK_VALUE(v_in.sizes() == k_in.sizes(), "v shape ", shape_of(v_in),
                    " differs from k shape ", shape_of(k_in));
  const int64_t T = k_in.size(0);
  check_cpu(slot_mapping_in, "slot_mapping");
  TORCH_CHECK_TYPE(slot_mapping_in.scalar_type() == at::kLong, "slot_mapping must be int64, got ",
                   slot_mapping_in.scalar_type());
  TORCH_CHECK_VALUE(slot_mapping_in.dim() == 1 && slot_mapping_in.size(0) == T,
                    "slot_mapping must be [T] with T = ", T, " new tokens, got shape ",
                    shape_of(slot_mapping_in));
  const at::Tensor slots = slot_mapping_in.contiguous();
  const int64_t* slot = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK_VALUE(slot[t] < N * B, "slot_mapping[", t, "] = ", slot[t],
                      " is past the cache's last slot N * B - 1 = ", N * B - 1);

  // One token's heads must be one run of H_kv * D elements.
  auto rows = [&](const at::Tensor& x) {
    return (x.stride(2) == 1 && x.stride(1) == D) ? x : x.contiguous();
  };
  const at::Tensor k = rows(k_in), v = rows(v_in);
  const int64_t bytes = H_kv * D * static_cast<int64_t>(k.element_size());
  const char* k_src = static_cast<const char*>(k.data_ptr());
  const char* v_src = static_cast<const char*>(v.data_ptr());
  const int64_t k_stride = k.stride(0) * k.element_size(), v_stride = v.stride(0) * v.element_size();
  char* k_dst = static_cast<char*>(key_cache.data_ptr());
  char* v_dst = static_cast<char*>(value_cache.data_ptr());
  at::parallel_for(0, T, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (slot[t] < 0) continue;
      std::memcpy(k_dst + slot[t] * bytes, k_src + t * k_stride, bytes);
      std::memcpy(v_dst + slot[t] * bytes, v_src + t * v_stride, bytes);
    }
  });
}

// The attention kernels' softmax exp of every element of a float32 tensor (impl "scalar":
// exp_nonpositive; "avx2": exp_nonpositive8, eight at a time, the tail by the scalar): for
// the tests that hold the two to each other and to libm.
at::Tensor softmax_exp(const at::Tensor& x, const std::string& impl) {
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat, "x must be float32, got ", x.scalar_type());
  TORCH_CHECK_VALUE(x.device().is_cpu() && x.is_contiguous(), "x must be a contiguous CPU tensor");
  TORCH_CHECK_VALUE(impl == "scalar" || impl == "avx2", "impl must be 'scalar' or 'avx2', got '", impl, "'");
  TORCH_CHECK_VALUE(impl != "avx2" || paged::avx2_compiled(), "impl='avx2': the AVX2 kernels are not compiled in");
  at::Tensor y = at::empty_like(x);
  const float* in = x.data_ptr<float>();
  float* out = y.data_ptr<float>();
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  if (impl == "avx2")
    for (; i + 8 <= x.numel(); i += 8) _mm256_storeu_ps(out + i, paged::exp_nonpositive8(_mm256_loadu_ps(in + i)));
#endif
  for (; i < x.numel(); ++i) out[i] = paged::exp_nonpositive(in[i]);
  return y;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "paged: CPU paged-attention decode and prefill, KV write, fused ops (csrc/cpu)";
  m.def("decode", &decode, "Paged attention decode, one query per sequence",
        py::arg("query"), py::arg("key_cache"), py::arg("value_cache"), py::arg("block_tables"),
        py::arg("context_lens"), py::arg("scale"), py::arg("out") = py::none(),
        py::arg("impl") = "auto", py::arg("partition_blocks") = -1, py::arg("window") = py::none(),
        py::arg("softcap") = py::none(), py::call_guard<py::gil_scoped_release>());
  m.def("prefill", &prefill, "Paged attention of many causal queries per sequence (prompts, chunks)",
        py::arg("query"), py::arg("key_cache"), py::arg("value_cache"), py::arg("block_tables"),
        py::arg("context_lens"), py::arg("query_lens"), py::arg("scale"), py::arg("out") = py::none(),
        py::arg("impl") = "auto", py::arg("query_tile") = 32, py::arg("window") = py::none(),
        py::arg("softcap") = py::none(), py::call_guard<py::gil_scoped_release>());
  m.def("write_kv", &write_kv, "Write new K/V rows into the cache by slot mapping",
        py::arg("key_cache"), py::arg("value_cache"), py::arg("k"), py::arg("v"),
        py::arg("slot_mapping"), py::call_guard<py::gil_scoped_release>());
  m.def("avx512_compiled", &paged::avx512_compiled, "Whether the AVX-512 decode was compiled in");
  m.def("avx2_compiled", &paged::avx2_compiled, "Whether the AVX2 attention (the scalar's arithmetic) was compiled in");
  m.def("softmax_exp", &softmax_exp, "The scalar and AVX2 attention kernels' softmax exp, element-wise",
        py::arg("x"), py::arg("impl"));
  m.def("add_rms_norm", &paged::add_rms_norm,
        "RMSNorm of x (of x + residual first, when given): (normed, x + residual or None)", py::arg("x"),
        py::arg("residual"), py::arg("weight"), py::arg("eps"), py::call_guard<py::gil_scoped_release>());
  m.def("gemma_rms_norm", &paged::gemma_rms_norm,
        "Gemma's RMSNorm of x, x / rms(x) * (1 + weight) in float32 (plus residual after it, when given)",
        py::arg("x"), py::arg("residual"), py::arg("weight"), py::arg("eps"), py::call_guard<py::gil_scoped_release>());
  m.def("silu_and_mul", &paged::silu_and_mul, "silu(x[:, :I]) * x[:, I:]", py::arg("x"),
        py::call_guard<py::gil_scoped_release>());
  m.def("rotary_", &paged::rotary_, "Rotate every head of x [T, heads, D] in place by the tables at positions",
        py::arg("x"), py::arg("positions"), py::arg("cos"), py::arg("sin"),
        py::call_guard<py::gil_scoped_release>());
  m.def("argmax_rows", &paged::argmax_rows, "torch.argmax(logits, dim=1) of [S, V] float32/bfloat16 logits",
        py::arg("logits"), py::call_guard<py::gil_scoped_release>());
  m.def("quant_linear", &paged::quant_linear, "x [M, K] times a GGUF-quantized W [N, K] transposed -> [M, N]",
        py::arg("x"), py::arg("blocks"), py::arg("type"), py::arg("n"), py::arg("k"), py::arg("impl") = "auto",
        py::arg("second_thread_weights") = py::none(), py::call_guard<py::gil_scoped_release>());
  m.def("quant_dequantize", &paged::quant_dequantize, "a GGUF-quantized W [N, K] as float32",
        py::arg("blocks"), py::arg("type"), py::arg("n"), py::arg("k"), py::call_guard<py::gil_scoped_release>());
  m.def("quant_pack_lanes", &paged::quant_pack_lanes,
        "The blocks of a W [N, K] (pack_blocks' layout) laid out with one output column per vector lane (in `into`, "
        "quant_lanes_bytes long, when given)",
        py::arg("blocks"), py::arg("type"), py::arg("n"), py::arg("k"), py::arg("into") = py::none(),
        py::call_guard<py::gil_scoped_release>());
  m.def("quant_lanes_bytes", &paged::quant_lanes_bytes, "Bytes of quant_pack_lanes' layout of a W [N, K]",
        py::arg("type"), py::arg("n"), py::arg("k"));
  m.def("quant_unpack_lanes", &paged::quant_unpack_lanes,
        "quant_pack_lanes' layout back in pack_blocks' row layout, byte for byte (its inverse)",
        py::arg("lanes"), py::arg("type"), py::arg("n"), py::arg("k"), py::call_guard<py::gil_scoped_release>());
  m.def("quant_linear_lanes", &paged::quant_linear_lanes,
        "x [M, K] times a W [N, K] in quant_pack_lanes' layout, transposed -> [M, N]", py::arg("x"), py::arg("lanes"),
        py::arg("type"), py::arg("n"), py::arg("k"), py::arg("impl") = "auto",
        py::arg("second_thread_weights") = py::none(), py::call_guard<py::gil_scoped_release>());
  m.def("quant_vnni_compiled", &paged::quant_vnni_compiled, "Whether the AVX-512 VNNI quantized linear was compiled in");
  m.def("quant_avx2_compiled", &paged::quant_avx2_compiled, "Whether the AVX2 quantized linear was compiled in");
  m.def("fixed_order_linear", &paged::fixed_order_linear,
        "x [M, K] times w [N, K] transposed (+ bias) -> [M, N], every output summed in one order fixed by K",
        py::arg("x"), py::arg("w"), py::arg("bias") = py::none(), py::arg("second_thread_bytes") = int64_t(2) << 20,
        py::call_guard<py::gil_scoped_release>());
  m.def("fixed_order_avx2_compiled", &paged::fixed_order_avx2_compiled,
        "Whether the AVX2 + FMA fixed-order linear was compiled in");
  m.def("pair_order_pack", &paged::pair_order_pack,
        "bfloat16 w [N, K] laid out for pair_order_linear: [ceil(N/16), ceil(K/2), 16, 2], zeros past N and K",
        py::arg("w"));
  m.def("pair_order_linear", &paged::pair_order_linear,
        "bfloat16 x [M, K] times w transposed (+ bias) -> [M, N], w as pair_order_pack laid it out, every output "
        "one sum over K a pair at a time (AVX512_BF16)",
        py::arg("x"), py::arg("packed"), py::arg("n"), py::arg("bias") = py::none(),
        py::arg("second_thread_bytes") = int64_t(2) << 20, py::call_guard<py::gil_scoped_release>());
  m.def("pair_order_compiled", &paged::pair_order_compiled, "Whether the AVX512_BF16 pair-order linear was compiled in");
}
