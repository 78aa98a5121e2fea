// The quantized linear of quant_linear.cpp (block formats, rounding and what
// the tests check are documented there); bindings.cpp exposes it to Python.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>

namespace paged {

// GGUF's block type numbers (ggml_type) for the formats the kernel reads.
constexpr int64_t kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ8_0 = 8, kQ4_K = 12, kQ6_K = 14;

// x [M, K] (float32 or bfloat16) times W [N, K] transposed, W given as its
// GGUF blocks regrouped per row (uint8; paged/models/quantized.py's pack_blocks;
// K-quants as the file stores them), x rounded to int8 per block of 32: y [M, N]
// in x's dtype. impl: "scalar", "avx2", "avx512" (VNNI), or "auto" (the widest compiled in).
// second_thread_weights: the weights x rows of x from which a call takes a second thread (speed only,
// the same bits); none: the loop's own rule, set where idle threads sleep.
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& blocks, int64_t type, int64_t N, int64_t K,
                        const std::string& impl = "auto", std::optional<int64_t> second_thread_weights = std::nullopt);

// W [N, K] as float32: w = d * (q - 8), d * q + m, d * (q - 16) or d * q (K-quants: quant_linear_k.h), each
// product rounded.
at::Tensor quant_dequantize(const at::Tensor& packed, int64_t type, int64_t N, int64_t K);

// The blocks of pack_blocks' layout (any format quant_linear reads) laid out again with one output column
// per vector lane (quant_linear_lanes.h), for quant_linear_lanes; needs the AVX2 loops (quant_avx2_compiled()).
// into: the tensor to write them in (quant_lanes_bytes(type, N, K) bytes), else a new one.
at::Tensor quant_pack_lanes(const at::Tensor& blocks, int64_t type, int64_t N, int64_t K,
                            const std::optional<at::Tensor>& into = std::nullopt);
// The bytes of quant_pack_lanes' layout of a W [N, K] of that type.
int64_t quant_lanes_bytes(int64_t type, int64_t N, int64_t K);
// Its inverse: quant_pack_lanes' layout back in pack_blocks' row layout, byte for byte.
at::Tensor quant_unpack_lanes(const at::Tensor& lanes, int64_t type, int64_t N, int64_t K);

// quant_linear over quant_pack_lanes' layout: the same x rounding, each output summed in the lanes
// layout's own fixed order (a float32 rounding from the row layout's). impl: "avx2", "avx512" (VNNI), or
// "auto" (the widest compiled in); both loops compute the same sums in the same order.
at::Tensor quant_linear_lanes(const at::Tensor& x, const at::Tensor& lanes, int64_t type, int64_t N, int64_t K,
                              const std::string& impl = "auto",
                              std::optional<int64_t> second_thread_weights = std::nullopt);

// Whether the AVX-512 VNNI loops were compiled in (impl "avx512").
bool quant_vnni_compiled();

// Whether the AVX2 loops were compiled in (impl "avx2").
bool quant_avx2_compiled();

}  // namespace paged
