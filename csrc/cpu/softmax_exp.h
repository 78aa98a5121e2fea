// exp(x) for the online softmax of the scalar and AVX2 attention kernels: x is a
// score minus the running maximum, so x <= 0.
//
// Written twice, as plain C++ (exp_nonpositive, what the scalar kernel calls)
// and as 8-float AVX2 vectors (exp_nonpositive8), with the same operations in
// the same order, so the two kernels give the same bits while the AVX2 one
// takes eight exponentials per step instead of one libm call per score:
//   x = n ln2 + r,  n = round(x / ln2),  |r| <= ln2 / 2  (ln2 in two parts, so r is exact)
//   exp(r) = 1 + r + r^2 (1/2 + r/6 + ...): Cephes' degree-6 polynomial of expf, ~1 ulp
//   exp(x) = exp(r) * 2^n, 2^n built in the float's exponent bits.
// Below -87 the result is 0: exp(-87) = 1.6e-38 is the last value above
// float32's smallest normal number, and a probability that small is below the
// rounding of a softmax sum that holds a 1 (the maximum's own exp(0)). -inf (the
// running maximum before the first block) gives 0, NaN stays NaN. The AVX-512
// kernels' exp16 (avx512_math.h) takes the same constants.
// Every product and sum is rounded where written: the fused multiply-adds are
// std::fma / _mm256_fmadd_ps (one rounding each, the same in both), and the
// build keeps the compiler from fusing anything else (-ffp-contract=off).
// tests/kernels/test_cpu_avx2_attention.py holds the two to each other bit for
// bit and to std::exp within 2 ulp.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace paged {
namespace softmax_exp {
constexpr float kLowest = -87.0f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;      // ln 2 = kLn2Hi + kLn2Lo; kLn2Hi has 9 significant bits,
constexpr float kLn2Lo = -2.12194440e-4f;  // so n * kLn2Hi is exact for |n| < 2^15
constexpr int kTerms = 6;
constexpr float kPoly[kTerms] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
}  // namespace softmax_exp

inline float exp_nonpositive(float x) {
  using namespace softmax_exp;
  if (x < kLowest) return 0.0f;  // and -inf
  if (x != x) return x;          // NaN
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(-n, kLn2Hi, x);
  r = std::fma(-n, kLn2Lo, r);
  float p = kPoly[0];
  for (int i = 1; i < kTerms; ++i) p = std::fma(p, r, kPoly[i]);
  p = std::fma(p, r * r, r + 1.0f);
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n, n in [-126, 0]
  float two_to_n;
  std::memcpy(&two_to_n, &bits, sizeof bits);
  return p * two_to_n;
}

// The online softmax's exp in the kernel's accumulation type: float64 keeps libm's.
inline float softmax_exp_of(float x) { return exp_nonpositive(x); }
inline double softmax_exp_of(double x) { return std::exp(x); }

#if defined(__AVX2__) && defined(__FMA__)
// exp_nonpositive of eight floats, operation for operation.
inline __m256 exp_nonpositive8(__m256 x) {
  using namespace softmax_exp;
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kPoly[0]);
  for (int i = 1; i < kTerms; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kPoly[i]));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
  // lanes below kLowest (and -inf) to 0; a NaN lane compares "not less" and keeps its NaN
  return _mm256_and_ps(y, _mm256_cmp_ps(x, _mm256_set1_ps(kLowest), _CMP_NLT_UQ));
}
#endif

}  // namespace paged
