// AVX-512 building blocks shared by the CPU kernels: widening loads of float32
// and bfloat16 rows, a vectorized exp, tail masks and an L2 prefetch of strided
// rows. Only compiled where the compiler targets AVX-512F (-march=native on a
// CPU that has it); every caller keeps a scalar path for the other CPUs.
#pragma once

#if defined(__AVX512F__)
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <cstdint>

namespace paged {
namespace avx512 {

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {
  // bfloat16 is the top half of a float32: widen and shift, exactly.
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// exp(x) for x <= 0 (scores minus their running maximum), ~1 ulp: Cephes expf.
// x = n ln2 + r with |r| <= ln2 / 2, exp(r) by a degree-6 polynomial, times 2^n.
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));  // exp(-104) is 0 in float32
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

inline __mmask16 tail_mask(int64_t remaining) {
  return remaining >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << remaining) - 1u);
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
