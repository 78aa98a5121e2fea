// AVX-512 building blocks shared by the CPU kernels: widening loads of float32
// and bfloat16 rows, a vectorized exp and tanh (soft-capped scores), tail and
// range masks, an L2 prefetch of strided rows, the fixed summation tree of 16
// lanes (one vector, or 16 vectors lane by lane) and a 16 x 16 transpose. Only compiled where the compiler targets
// AVX-512F (-march=native on a CPU that has it); every caller keeps a scalar
// path for the other CPUs.
#pragma once

#if defined(__AVX512F__)
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <climits>
#include <cstdint>
#include <cstring>

#include "softmax_exp.h"

namespace paged {
namespace avx512 {

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {
  // bfloat16 is the top half of a float32: widen and shift, exactly.
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// exp(x) for x <= 0 (scores minus their running maximum), ~1 ulp: softmax_exp.h's
// polynomial (Cephes expf) in 16 lanes, 2^n applied by scalef, so no clamp above -104.
inline __m512 exp16(__m512 x) {
  using namespace softmax_exp;
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));  // exp(-104) is 0 in float32
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kPoly[0]);
  for (int i = 1; i < kTerms; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kPoly[i]));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// The sum of x's 16 lanes in one fixed tree: lane i + lane i+8, then i + i+4,
// then i + i+2, then lane 0 + lane 1. (The tree GCC's _mm512_reduce_add_ps
// uses, written out so that no compiler or library can change it: the decode
// and prefill attention kernels must round the same sums the same way.)
inline float sum16(__m512 x) {
  const __m256 a = _mm256_add_ps(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)),
                                 _mm512_castps512_ps256(x));                     // i + (i+8)
  const __m128 b = _mm_add_ps(_mm256_extractf128_ps(a, 1), _mm256_castps256_ps128(a));  // + (i+4)
  const __m128 c = _mm_add_ps(b, _mm_shuffle_ps(b, b, _MM_SHUFFLE(1, 0, 3, 2)));  // i + (i+2)
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));                  // 0 + 1
}

// sum16 of 16 vectors at once, transposed: lane t of the result is the sum of
// lane t of x[0..15] in sum16's tree (x[i] + x[i+8], then + x[i+4], ...), so
// it is bitwise sum16 of the vector (x[0][t], ..., x[15][t]).
inline __m512 sum16_lanes(const __m512* x) {
  __m512 a[8], b[4];
  for (int i = 0; i < 8; ++i) a[i] = _mm512_add_ps(x[i + 8], x[i]);
  for (int i = 0; i < 4; ++i) b[i] = _mm512_add_ps(a[i + 4], a[i]);
  return _mm512_add_ps(_mm512_add_ps(b[0], b[2]), _mm512_add_ps(b[1], b[3]));
}

// Transposes 16 vectors of 16 32-bit values in place: afterwards r[w] lane t is
// what r[t] lane w was. Bit moves only (any 32-bit payload: floats, bfloat16 pairs).
inline void transpose16(__m512* r) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {  // per 128-bit lane: a0 b0 a1 b1 / a2 b2 a3 b3
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  __m512 u[16];
  for (int i = 0; i < 4; ++i) {  // u[4i + c], 128-bit lane k: element 4k + c of rows 4i .. 4i+3
    const __m512d t0 = _mm512_castps_pd(t[4 * i]), t1 = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d t2 = _mm512_castps_pd(t[4 * i + 2]), t3 = _mm512_castps_pd(t[4 * i + 3]);
    u[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
    u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
    u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
    u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
  }
  for (int c = 0; c < 4; ++c) {  // 4 x 4 transpose of 128-bit lanes: column 4k + c gathers lane k
    const __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44), v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
    const __m512 v2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
    const __m512 v3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
    r[c] = _mm512_shuffle_f32x4(v0, v2, 0x88);
    r[4 + c] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
    r[8 + c] = _mm512_shuffle_f32x4(v1, v3, 0x88);
    r[12 + c] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
  }
}

// 32 bits at p (a bfloat16 pair), any alignment, in every lane. An integer
// broadcast (VPBROADCASTD): VDPBF16PS takes it at full rate, while a float
// one (VBROADCASTSS) feeding it halves its rate on Zen 4 (measured).
inline __m512i broadcast32(const void* p) {
  int32_t x;
  std::memcpy(&x, p, 4);
  return _mm512_set1_epi32(x);
}

inline __mmask16 tail_mask(int64_t remaining) {
  return remaining >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << remaining) - 1u);
}

// Lanes i with lo <= i < hi (either bound may lie outside 0 .. 16): the
// tokens of a 16-token chunk that a windowed query sees.
inline __mmask16 range_mask(int64_t lo, int64_t hi) {
  auto below = [](int64_t k) { return k <= 0 ? __mmask16(0) : tail_mask(k); };
  return below(hi) & __mmask16(~below(lo));
}

// tanh(x), ~2 ulp: below |x| = 0.625 an odd polynomial (the minimax
// coefficients of Cephes' tanhf), where 1 - e would cancel; above, (1 - e) /
// (1 + e) with e = exp(-2|x|) <= 1 (exp16's domain), the sign put back.
inline __m512 tanh16(__m512 x) {
  const __m512 z = _mm512_abs_ps(x), one = _mm512_set1_ps(1.0f);
  const __m512 e = exp16(_mm512_mul_ps(z, _mm512_set1_ps(-2.0f)));
  const __m512 far = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));  // tanh |x|
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN));
  const __m512 s = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(-5.70498872745e-3f);
  p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(2.06390887954e-2f));
  p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(-5.37397155531e-2f));
  p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(1.33314422036e-1f));
  p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(-3.33332819422e-1f));
  const __m512 near = _mm512_fmadd_ps(_mm512_mul_ps(p, s), x, x);  // x + x^3 P(x^2)
  const __mmask16 small = _mm512_cmp_ps_mask(z, _mm512_set1_ps(0.625f), _CMP_LT_OQ);
  return _mm512_mask_blend_ps(small, _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(far), sign)), near);
}

// Soft-capped scores: cap * tanh(s / cap) (Gemma 2), lane by lane, so that
// decode (16 tokens per vector) and prefill (16 query rows) round alike.
inline __m512 softcap16(__m512 s, float cap) {
  const __m512 c = _mm512_set1_ps(cap);
  return _mm512_mul_ps(c, tanh16(_mm512_div_ps(s, c)));
}

// Ask for n rows of `bytes` each, `row` elements apart, into L2 (into L1 they
// would evict the rows in use).
template <typename T>
inline void prefetch_rows(const T* first, int64_t row, int64_t n, int64_t bytes) {
  for (int64_t t = 0; t < n; ++t) {
    const char* p = reinterpret_cast<const char*>(first + t * row);
    for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T1);
  }
}

}  // namespace avx512
}  // namespace paged
#endif  // __AVX512F__
