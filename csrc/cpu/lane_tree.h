// The eight float lanes of one AVX register added in one fixed order, the order every
// kernel here writes down for its last step (a scalar loop does the same additions):
//   lane l += lane l + 4 (l < 4), then lane l += lane l + 2 (l < 2), then lane 0 += lane 1.
// fixed_order_linear.cpp's output sums, quant_linear.cpp's per-row totals and the AVX2
// attention kernel's q . k (after its lanes 8-15 are added to 0-7) all end here.
#pragma once

#include <immintrin.h>

namespace paged {

inline float lane_tree8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  // l += l + 4
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));                                    // l += l + 2
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));                                 // 0 += 1
}

}  // namespace paged
