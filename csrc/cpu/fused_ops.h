// The fused element-wise operations of fused_ops.cpp (what each computes, and
// how it rounds, is documented there); bindings.cpp exposes them to Python.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

namespace paged {

// RMSNorm of x [T, N] (of x + residual first, when a residual is given):
// returns (normed, x + residual), the second undefined without a residual.
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const c10::optional<at::Tensor>& residual,
                                                const at::Tensor& weight, double eps);

// Gemma's RMSNorm of x [T, N], scaled by 1 + weight in float32; plus residual
// after the norm, when given (the sandwich norm's output added to the stream).
at::Tensor gemma_rms_norm(const at::Tensor& x, const c10::optional<at::Tensor>& residual, const at::Tensor& weight,
                          double eps);

// silu(x[:, :I]) * x[:, I:] of x [T, 2I] -> [T, I].
at::Tensor silu_and_mul(const at::Tensor& x);

// Rotary embedding of every head of x [T, heads, D], in place, by the
// [P, D/2] cos / sin tables at positions [T].
void rotary_(at::Tensor x, const at::Tensor& positions, const at::Tensor& cos, const at::Tensor& sin);

// torch.argmax(logits, dim=1) of [S, V] logits -> [S] int64.
at::Tensor argmax_rows(const at::Tensor& logits);

}  // namespace paged
