// Fused element-wise operations of a decoder layer on the CPU, for serving.
//
// Between its GEMMs a LLaMA layer runs a dozen small element-wise operations
// (residual add, RMSNorm with its float32 casts, RoPE's four products and two
// sums, SiLU times the up projection) and the sampler an argmax. In eager
// PyTorch each is its own pass over memory, its own allocation and its own
// parallel region; at decode batch sizes their fixed cost rivals the GEMMs'.
// Here each is one pass per row, rounding exactly where the eager formula
// rounds (paged/models/layers.py spells each one out), so:
//   * add_rms_norm, gemma_rms_norm, rotary_, argmax_rows: bitwise equal to the
//     eager formula except for the order of RMSNorm's sum of squares (a float32 sum);
//   * silu_and_mul: equal up to the exp (a polynomial on AVX-512, std::exp
//     elsewhere), then rounded to the storage type like the eager op.
// float32 and bfloat16 only (float64 models keep the eager path). The tests
// are tests/step03_attention/test_fused_ops.py. The build turns off the
// compiler's contraction of a * b + c into one fused multiply-add
// (-ffp-contract=off), which would skip a rounding the eager formula makes.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>

#include "avx512_math.h"
#include "fused_ops.h"

namespace paged {
namespace {

// Storage <-> float32, rounding to nearest even like torch's bfloat16 ops.
inline float widen(float x) { return x; }
inline float widen(c10::BFloat16 x) {
  const uint32_t bits = uint32_t(x.x) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
template <typename T>
inline T narrow(float f);
template <>
inline float narrow<float>(float f) { return f; }
template <>
inline c10::BFloat16 narrow<c10::BFloat16>(float f) { return c10::BFloat16(f); }

// The value as stored in T, widened back: the rounding an eager op applies to
// each intermediate result.
template <typename T>
inline float round_to(float f) { return widen(narrow<T>(f)); }

// Rows per task of at::parallel_for: enough elements that a thread's share
// outweighs waking it.
inline int64_t grain_rows(int64_t row_elements) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, row_elements));
}

void check_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK_VALUE(x.device().is_cpu(), name, " must be on the CPU, got ", x.device());
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, name,
                   " must be float32 or bfloat16, got ", x.scalar_type());
  TORCH_CHECK_VALUE(x.dim() == 2 && x.stride(1) == 1, name,
                    " must be [T, N] with contiguous rows, got shape ", x.sizes(), " strides ", x.strides());
}

// --- RMSNorm, with the residual add before it ------------------------------

// 1 / sqrt(mean(x^2) + eps) of one row, in float32 (1 / sqrt: torch's rsqrt, bit for bit).
template <typename T>
inline float inverse_rms(const T* x, int64_t n, double eps) {
  float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
  for (int64_t i = 0; i < n; ++i) squares += widen(x[i]) * widen(x[i]);
  return 1.0f / std::sqrt(squares / float(n) + float(eps));
}

// out = weight * T(x * rsqrt(mean(x^2) + eps)), x = T(x + residual) when there
// is a residual (then also written to residual_out).
template <typename T>
void add_rms_norm_rows(const at::Tensor& x, const at::Tensor* residual, const at::Tensor& weight,
                       double eps, at::Tensor& out, at::Tensor* residual_out) {
  const int64_t rows = x.size(0), n = x.size(1);
  const T* w = weight.data_ptr<T>();
  const T* x0 = x.data_ptr<T>();
  T* out0 = out.data_ptr<T>();
  const T* r0 = residual != nullptr ? residual->data_ptr<T>() : nullptr;
  T* ro0 = residual != nullptr ? residual_out->data_ptr<T>() : nullptr;
  at::parallel_for(0, rows, grain_rows(n), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const T* xr = x0 + t * x.stride(0);
      T* o = out0 + t * n;
      const T* src = xr;
      if (r0 != nullptr) {
        const T* r = r0 + t * residual->stride(0);
        T* ro = ro0 + t * n;
        for (int64_t i = 0; i < n; ++i) ro[i] = narrow<T>(widen(xr[i]) + widen(r[i]));
        src = ro;
      }
      const float inv = inverse_rms(src, n, eps);
      for (int64_t i = 0; i < n; ++i) o[i] = narrow<T>(widen(w[i]) * round_to<T>(widen(src[i]) * inv));
    }
  });
}

// Gemma's RMSNorm: out = T(x * rsqrt(mean(x^2) + eps) * (1 + weight)), the scale 1 + weight and
// both products in float32, one rounding to T at the end; then, with a residual,
// out = T(residual + out) (the sandwich norm's output joining the residual stream).
template <typename T>
void gemma_rms_norm_rows(const at::Tensor& x, const at::Tensor* residual, const at::Tensor& weight,
                         double eps, at::Tensor& out) {
  const int64_t rows = x.size(0), n = x.size(1);
  const T* w = weight.data_ptr<T>();
  const T* x0 = x.data_ptr<T>();
  T* out0 = out.data_ptr<T>();
  const T* r0 = residual != nullptr ? residual->data_ptr<T>() : nullptr;
  at::parallel_for(0, rows, grain_rows(n), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const T* xr = x0 + t * x.stride(0);
      T* o = out0 + t * n;
      const float inv = inverse_rms(xr, n, eps);
      for (int64_t i = 0; i < n; ++i) o[i] = narrow<T>(widen(xr[i]) * inv * (1.0f + widen(w[i])));
      if (r0 != nullptr) {
        const T* r = r0 + t * residual->stride(0);
        for (int64_t i = 0; i < n; ++i) o[i] = narrow<T>(widen(r[i]) + widen(o[i]));
      }
    }
  });
}

void check_norm_weight(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK_VALUE(weight.dim() == 1 && weight.size(0) == x.size(1) && weight.is_contiguous(),
                    "weight must be [N] = [", x.size(1), "] and contiguous, got shape ", weight.sizes());
  TORCH_CHECK_TYPE(weight.scalar_type() == x.scalar_type(), "weight must have x's dtype ", x.scalar_type(),
                   ", got ", weight.scalar_type());
}

void check_residual(const at::Tensor& x, const at::Tensor& residual) {
  TORCH_CHECK_VALUE(residual.sizes() == x.sizes() && residual.scalar_type() == x.scalar_type(),
                    "residual must match x (", x.sizes(), ", ", x.scalar_type(), "), got ",
                    residual.sizes(), ", ", residual.scalar_type());
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const c10::optional<at::Tensor>& residual,
                                                const at::Tensor& weight, double eps) {
  check_rows(x, "x");
  check_norm_weight(x, weight);
  at::Tensor out = at::empty(x.sizes(), x.options());
  at::Tensor residual_out;
  if (residual.has_value()) {
    check_rows(*residual, "residual");
    check_residual(x, *residual);
    residual_out = at::empty(x.sizes(), x.options());
  }
  const at::Tensor* r = residual.has_value() ? &*residual : nullptr;
  at::Tensor* ro = residual.has_value() ? &residual_out : nullptr;
  if (x.scalar_type() == at::kFloat) add_rms_norm_rows<float>(x, r, weight, eps, out, ro);
  else add_rms_norm_rows<c10::BFloat16>(x, r, weight, eps, out, ro);
  return {out, residual_out};
}

at::Tensor gemma_rms_norm(const at::Tensor& x, const c10::optional<at::Tensor>& residual, const at::Tensor& weight,
                          double eps) {
  check_rows(x, "x");
  check_norm_weight(x, weight);
  const at::Tensor* r = nullptr;
  if (residual.has_value()) {
    check_rows(*residual, "residual");
    check_residual(x, *residual);
    r = &*residual;
  }
  at::Tensor out = at::empty(x.sizes(), x.options());
  if (x.scalar_type() == at::kFloat) gemma_rms_norm_rows<float>(x, r, weight, eps, out);
  else gemma_rms_norm_rows<c10::BFloat16>(x, r, weight, eps, out);
  return out;
}

// --- SiLU(gate) * up -------------------------------------------------------

namespace {

// exp(-g) for the SiLU: 16 at a time on AVX-512, std::exp elsewhere.
template <typename T>
void silu_row(const T* gate, const T* up, T* out, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  float buf[16];
  for (; i + 16 <= n; i += 16) {
    const __m512 g = avx512::load16(gate + i);
    const __m512 e = avx512::exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    _mm512_storeu_ps(buf, _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)));
    for (int k = 0; k < 16; ++k) out[i + k] = narrow<T>(round_to<T>(buf[k]) * widen(up[i + k]));
  }
#endif
  for (; i < n; ++i) {
    const float g = widen(gate[i]);
    out[i] = narrow<T>(round_to<T>(g / (1.0f + std::exp(-g))) * widen(up[i]));
  }
}

}  // namespace

at::Tensor silu_and_mul(const at::Tensor& x) {
  check_rows(x, "x");
  TORCH_CHECK_VALUE(x.size(1) % 2 == 0, "x must be [T, 2 * I] (gate then up), got width ", x.size(1));
  const int64_t rows = x.size(0), n = x.size(1) / 2;
  at::Tensor out = at::empty({rows, n}, x.options());
  at::parallel_for(0, rows, grain_rows(n), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (x.scalar_type() == at::kFloat) {
        const float* r = x.data_ptr<float>() + t * x.stride(0);
        silu_row<float>(r, r + n, out.data_ptr<float>() + t * n, n);
      } else {
        const c10::BFloat16* r = x.data_ptr<c10::BFloat16>() + t * x.stride(0);
        silu_row<c10::BFloat16>(r, r + n, out.data_ptr<c10::BFloat16>() + t * n, n);
      }
    }
  });
  return out;
}

// --- rotary position embedding, in place -----------------------------------

namespace {

// Pair (x[i], x[i + D/2]) of every head of token t turns by the table's angle
// at positions[t]: (a c - b s, b c + a s), each product and sum rounded to T.
template <typename T>
void rotary_rows(at::Tensor& x, const int64_t* positions, const T* cos, const T* sin) {
  const int64_t tokens = x.size(0), heads = x.size(1), half = x.size(2) / 2;
  T* x0 = x.data_ptr<T>();
  at::parallel_for(0, tokens, grain_rows(heads * 2 * half), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const T* c = cos + positions[t] * half;
      const T* s = sin + positions[t] * half;
      for (int64_t h = 0; h < heads; ++h) {
        T* a = x0 + t * x.stride(0) + h * x.stride(1);
        T* b = a + half;
        for (int64_t i = 0; i < half; ++i) {
          const float ai = widen(a[i]), bi = widen(b[i]), ci = widen(c[i]), si = widen(s[i]);
          a[i] = narrow<T>(round_to<T>(ai * ci) - round_to<T>(bi * si));
          b[i] = narrow<T>(round_to<T>(bi * ci) + round_to<T>(ai * si));
        }
      }
    }
  });
}

}  // namespace

void rotary_(at::Tensor x, const at::Tensor& positions_in, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK_VALUE(x.device().is_cpu() && x.dim() == 3 && x.stride(2) == 1 && x.size(2) % 2 == 0,
                    "x must be a CPU [T, heads, D] tensor with contiguous rows and even D, got shape ",
                    x.sizes(), " strides ", x.strides());
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
                   "x must be float32 or bfloat16, got ", x.scalar_type());
  const int64_t half = x.size(2) / 2;
  for (const at::Tensor* table : {&cos, &sin}) {
    TORCH_CHECK_VALUE(table->dim() == 2 && table->size(1) == half && table->is_contiguous(),
                      "cos and sin must be contiguous [P, D/2] = [P, ", half, "], got shape ", table->sizes());
    TORCH_CHECK_TYPE(table->scalar_type() == x.scalar_type(), "cos and sin must have x's dtype ",
                     x.scalar_type(), ", got ", table->scalar_type());
  }
  TORCH_CHECK_TYPE(positions_in.scalar_type() == at::kLong, "positions must be int64, got ",
                   positions_in.scalar_type());
  TORCH_CHECK_VALUE(positions_in.dim() == 1 && positions_in.size(0) == x.size(0),
                    "positions must be [T] with T = ", x.size(0), ", got shape ", positions_in.sizes());
  const at::Tensor positions = positions_in.contiguous();
  const int64_t* pos = positions.data_ptr<int64_t>();
  for (int64_t t = 0; t < x.size(0); ++t)
    TORCH_CHECK_VALUE(pos[t] >= 0 && pos[t] < cos.size(0), "positions[", t, "] = ", pos[t],
                      " is outside the table's [0, ", cos.size(0), ")");
  if (x.scalar_type() == at::kFloat) rotary_rows<float>(x, pos, cos.data_ptr<float>(), sin.data_ptr<float>());
  else rotary_rows<c10::BFloat16>(x, pos, cos.data_ptr<c10::BFloat16>(), sin.data_ptr<c10::BFloat16>());
}

// --- argmax of each row ----------------------------------------------------

namespace {

// torch.argmax's answer: the first index of the largest value, a NaN counting
// as larger than any number (the first NaN wins).
template <typename T>
int64_t argmax_row(const T* row, int64_t n) {
  float best = widen(row[0]);
  int64_t at = 0;
  if (std::isnan(best)) return 0;
  for (int64_t i = 1; i < n; ++i) {
    const float v = widen(row[i]);
    if (v > best) {
      best = v;
      at = i;
    } else if (std::isnan(v)) {
      return i;
    }
  }
  return at;
}

#if defined(__AVX512F__)
// The same answer in two vector passes: the row's maximum (a NaN anywhere
// hands the row to argmax_row), then the first index holding it. +0 and -0
// compare equal in both, as in torch.
template <typename T>
int64_t argmax_row_avx512(const T* row, int64_t n) {
  const int64_t body = n / 16 * 16;
  __m512 best = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __mmask16 nan = 0;
  for (int64_t i = 0; i < body; i += 16) {
    const __m512 v = avx512::load16(row + i);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    best = _mm512_max_ps(best, v);
  }
  float m = _mm512_reduce_max_ps(best);
  for (int64_t i = body; i < n; ++i) {
    const float v = widen(row[i]);
    if (std::isnan(v)) nan = 1;
    m = std::max(m, v);
  }
  if (nan) return argmax_row(row, n);
  const __m512 target = _mm512_set1_ps(m);
  for (int64_t i = 0; i < body; i += 16) {
    const __mmask16 hit = _mm512_cmp_ps_mask(avx512::load16(row + i), target, _CMP_EQ_OQ);
    if (hit) return i + __builtin_ctz(hit);
  }
  for (int64_t i = body; i < n; ++i)
    if (widen(row[i]) == m) return i;
  return 0;  // unreachable: m is one of the row's values
}
#endif

// torch.argmax's answer for one row, vectorized where the build allows.
template <typename T>
int64_t argmax_fast(const T* row, int64_t n) {
#if defined(__AVX512F__)
  return argmax_row_avx512(row, n);
#else
  return argmax_row(row, n);
#endif
}

}  // namespace

at::Tensor argmax_rows(const at::Tensor& x) {
  check_rows(x, "logits");
  TORCH_CHECK_VALUE(x.size(1) > 0, "logits must have at least one column");
  const int64_t rows = x.size(0), n = x.size(1);
  at::Tensor out = at::empty({rows}, x.options().dtype(at::kLong));
  int64_t* o = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, grain_rows(n), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      o[t] = x.scalar_type() == at::kFloat ? argmax_fast(x.data_ptr<float>() + t * x.stride(0), n)
                                           : argmax_fast(x.data_ptr<c10::BFloat16>() + t * x.stride(0), n);
    }
  });
  return out;
}

}  // namespace paged
