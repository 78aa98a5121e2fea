// The eight float lanes of one AVX register added in one fixed order, the order every
// kernel here writes down for its last step (a scalar loop does the same additions):
//   lane l += lane l + 4 (l < 4), then lane l += lane l + 2 (l < 2), then lane 0 += lane 1.
// fixed_order_linear.cpp's output sums and quant_linear.cpp's per-row totals end in
// lane_tree8; the AVX2 attention kernel's q . k (after its lanes 8-15 are added to 0-7)
// in lane_trees8, the same additions for 8 vectors at once.
#pragma once

#include <immintrin.h>

namespace paged {

inline float lane_tree8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  // l += l + 4
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));                                    // l += l + 2
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));                                 // 0 += 1
}

// lane_tree8's first step (l += l + 4) for two vectors at once: [a0 + a4 .. a3 + a7 | b0 + b4 .. b3 + b7].
inline __m256 halves_added(__m256 a, __m256 b) {
  return _mm256_add_ps(_mm256_insertf128_ps(a, _mm256_castps256_ps128(b), 1), _mm256_permute2f128_ps(a, b, 0x31));
}

// lane_tree8 of 8 vectors, lanes(0) .. lanes(7), as one vector: the same additions of the
// same values, 7 vector adds for the 8 trees. After the first step each vector's 4 sums are
// half a vector; the adds of l + 2, then of l + 1, take the sums they need from two such
// vectors by shuffles. The vectors go in as 0, 4, 1, 5, 2, 6, 3, 7 so the trees come out
// in order.
template <typename Lanes>
inline __m256 lane_trees8(Lanes lanes) {
  const __m256 s04 = halves_added(lanes(0), lanes(4));
  const __m256 s15 = halves_added(lanes(1), lanes(5));
  const __m256 s26 = halves_added(lanes(2), lanes(6));
  const __m256 s37 = halves_added(lanes(3), lanes(7));
  // l += l + 2: from the halves [0 1 | 4 5] and [2 3 | 6 7] of (0, 1 | 4, 5) and (2, 3 | 6, 7)
  const __m256 t0145 = _mm256_add_ps(_mm256_shuffle_ps(s04, s15, _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm256_shuffle_ps(s04, s15, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 t2367 = _mm256_add_ps(_mm256_shuffle_ps(s26, s37, _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm256_shuffle_ps(s26, s37, _MM_SHUFFLE(3, 2, 3, 2)));
  // lane 0 += lane 1: 0 1 2 3 | 4 5 6 7
  return _mm256_add_ps(_mm256_shuffle_ps(t0145, t2367, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm256_shuffle_ps(t0145, t2367, _MM_SHUFFLE(3, 1, 3, 1)));
}

}  // namespace paged
