// The dense linears of fixed_order_linear.cpp and pair_order_linear.cpp (their summation orders
// and why are documented there); bindings.cpp exposes them to Python.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace paged {

// y [M, N] = x [M, K] · w [N, K]ᵀ (+ bias [N]), x and w both float32 or both
// bfloat16, y in their dtype; every y[m, n] summed in one order fixed by K.
// second_thread_bytes: the work (bytes of w, or half the multiply-adds) from which a call takes a second
// thread; speed only, the bits do not depend on it.
at::Tensor fixed_order_linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                              int64_t second_thread_bytes);

// Whether the AVX2 + FMA loop was compiled in (else the same sums run on scalars).
bool fixed_order_avx2_compiled();

// pair_order_linear.cpp: y [M, N] = x [M, K] · w [N, K]ᵀ (+ bias [N]), all bfloat16, every y[m, n]
// one float32 sum over K a pair at a time (VDPBF16PS), by w as pair_order_pack lays it out once.
// Only where the AVX512_BF16 loop was compiled in (pair_order_compiled); an error elsewhere.
at::Tensor pair_order_pack(const at::Tensor& w);
at::Tensor pair_order_linear(const at::Tensor& x, const at::Tensor& packed, int64_t N,
                             const std::optional<at::Tensor>& bias, int64_t second_thread_bytes);

// Whether the AVX512_BF16 loop of pair_order_linear was compiled in.
bool pair_order_compiled();

}  // namespace paged
