// The dense linear of fixed_order_linear.cpp (its summation order and why are
// documented there); bindings.cpp exposes it to Python.
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

}  // namespace paged
