// The K-quants of quant_linear.cpp: Q4_K and Q6_K, the pair a Q4_K_M file is made of.
//
// A K-quant row is super-blocks of 256 weights, kept as the file has them
// (paged/models/kquants.py lists the layouts and the formulas):
//
//   Q4_K (144 bytes)  d, dmin (float16) | 12 bytes: eight 6-bit scales sc and mins m |
//                     128 bytes: 4-bit q, each 32 bytes holding 32 weights in the low
//                     nibbles and the next 32 in the high ones.   w = d*sc*q - dmin*m
//   Q6_K (210 bytes)  128 bytes: low 4 bits | 64 bytes: high 2 bits | 16 int8 scales |
//                     d.   w = d*sc*(q - 32), a scale per 16 weights.
//
// The activations are rounded as for the other formats (blocks of 32, dx = max|x| / 127,
// here in their natural order), so one block of x meets 32 weights of one sub-block (Q4_K)
// or of two (Q6_K), and per block
//
//   Q4_K:  sum_j w_j x^_j = (d sc dx) sum_j q_j qx_j - (dmin m) (dx sum_j qx_j)
//   Q6_K:  sum_j w_j x^_j = (d sc dx) sum_{j<16} (q_j - 32) qx_j + (d sc' dx) sum_{j>=16} ...
//
// with the integer sums exact (vpdpbusd, or vpmaddubsw and vpmaddwd; Q6_K's signed q - 32 by
// moving its sign onto x, as Q8_0 does) and the rest in float32, in the same order for every
// row, thread and batch.
// Included by quant_linear.cpp, inside its namespace, after RowLayout and QuantizedRow.

#pragma once

constexpr int64_t QK_K = 256;

inline int64_t k_block_bytes(int64_t type) { return type == kQ4_K ? 144 : 210; }

// Q4_K's 12 scale bytes -> sc[8], m[8] (6 bits each).
inline void k_scales_mins(const uint8_t* s, uint8_t* sc, uint8_t* m) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 63;
    m[j] = s[j + 4] & 63;
    sc[j + 4] = (s[j + 8] & 0xF) | ((s[j] >> 6) << 4);
    m[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
  }
}

// Weight j (0..255) of a Q6_K super-block, as 0..63 (the stored q, before - 32).
inline int q6_at(const uint8_t* blk, int j) {
  const int h = j / 128, r = (j % 128) / 32, l = j % 32;
  const uint8_t lo = blk[h * 64 + (r & 1) * 32 + l];
  const int low = r < 2 ? (lo & 0xF) : (lo >> 4);
  const int high = (blk[128 + h * 32 + l] >> (2 * r)) & 3;
  return low | (high << 4);
}

// Weight j of a Q4_K super-block, 0..15.
inline int q4k_at(const uint8_t* blk, int j) {
  const uint8_t b = blk[16 + (j / 64) * 32 + j % 32];
  return (j % 64) < 32 ? (b & 0xF) : (b >> 4);
}

// Q4_K's min term of one super-block: sum_j dmin m_j (dx sum qx)_j.
inline float q4k_min_term(float dmin, const uint8_t* m, const float* s, float off) {
  for (int j = 0; j < 8; ++j) off = std::fma(dmin * float(m[j]), s[j], off);
  return off;
}

// One dot product of a W row (K-quant super-blocks) with a rounded x row.
template <int64_t TYPE>
float dot_k(Scalar, const uint8_t* row, int64_t K, const QuantizedRow& x) {
  const int64_t supers = K / QK_K;
  float off = 0.0f;  // Q4_K's min term, summed apart
  float acc = 0.0f;
  for (int64_t sb = 0; sb < supers; ++sb) {
    const float* dx = x.d + sb * 8;
    const int8_t* xq = x.q + sb * QK_K;
    if constexpr (TYPE == kQ4_K) {
      const uint8_t* blk = row + sb * 144;
      const float d = half_at(blk), dmin = half_at(blk + 2);
      uint8_t sc[8], m[8];
      k_scales_mins(blk + 4, sc, m);
      for (int b = 0; b < 8; ++b) {
        int32_t s = 0;
        for (int j = 0; j < 32; ++j) s += q4k_at(blk, b * 32 + j) * xq[b * 32 + j];
        acc = std::fma(static_cast<float>(s), d * float(sc[b]) * dx[b], acc);
      }
      off = q4k_min_term(dmin, m, x.s + sb * 8, off);
    } else {
      const uint8_t* blk = row + sb * 210;
      const float d = half_at(blk + 208);
      const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
      for (int i = 0; i < 16; ++i) {  // sub-blocks of 16
        int32_t s = 0;
        for (int j = 0; j < 16; ++j) s += (q6_at(blk, i * 16 + j) - 32) * xq[i * 16 + j];
        acc = std::fma(static_cast<float>(s), d * float(sc[i]) * dx[i / 2], acc);
      }
    }
  }
  return acc - off;
}

#if defined(PAGED_QUANT_AVX2) || defined(PAGED_QUANT_VNNI)
// Weights 32b .. 32b + 31 of a Q6_K super-block as signed bytes q - 32 (-32..31): q6_at, 32 at a time
// (half b / 4, quarter b % 4: the low 4 bits from one nibble of 32 bytes, the high 2 from 32 more).
inline __m256i q6k_weights32(const uint8_t* blk, int b) {
  const int h = b / 4, r = b % 4;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i lb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + h * 64 + (r & 1) * 32));
  const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + h * 32));
  const __m256i low = r < 2 ? _mm256_and_si256(lb, low4) : _mm256_and_si256(_mm256_srli_epi16(lb, 4), low4);
  const __m256i high = _mm256_and_si256(_mm256_srli_epi16(hb, 2 * r), _mm256_set1_epi8(3));
  return _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)), _mm256_set1_epi8(32));
}
#endif

#if defined(PAGED_QUANT_AVX2)
// dot_k for R rows of x at once (xs[r] -> out[r]): each output gets the same operations in the same order
// whatever R, and the rows share what depends on the weights only (the loads, the unpacking, Q4_K's
// scales and mins, d * sc).
template <int64_t TYPE, int R>
void dot_k_rows(Avx2, const uint8_t* row, int64_t K, const QuantizedRow* const* xs, float* out) {
  const int64_t supers = K / QK_K;
  float off[R];  // Q4_K's min terms, summed apart
  __m256 acc[R];
  for (int r = 0; r < R; ++r) off[r] = 0.0f, acc[r] = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int64_t sb = 0; sb < supers; ++sb) {
    const int8_t* xq[R];  // each row's super-block sb: its bytes and its 8 scales
    const float* dx[R];
    for (int r = 0; r < R; ++r) xq[r] = xs[r]->q + sb * QK_K, dx[r] = xs[r]->d + sb * 8;
    if constexpr (TYPE == kQ4_K) {
      const uint8_t* blk = row + sb * 144;
      const float d = half_at(blk), dmin = half_at(blk + 2);
      uint8_t sc[8], m[8];
      k_scales_mins(blk + 4, sc, m);
      for (int c = 0; c < 4; ++c) {  // 64 weights: blocks 2c (low nibbles) and 2c + 1 (high)
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + c * 32));
        const __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        const float d_lo = d * float(sc[2 * c]), d_hi = d * float(sc[2 * c + 1]);
        for (int r = 0; r < R; ++r) {
          const __m256i s_lo = dot4(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[r] + c * 64)));
          const __m256i s_hi = dot4(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[r] + c * 64 + 32)));
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s_lo), _mm256_set1_ps(d_lo * dx[r][2 * c]), acc[r]);
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s_hi), _mm256_set1_ps(d_hi * dx[r][2 * c + 1]), acc[r]);
        }
      }
      for (int r = 0; r < R; ++r) off[r] = q4k_min_term(dmin, m, xs[r]->s + sb * 8, off[r]);
    } else {  // Q6_K
      const uint8_t* blk = row + sb * 210;
      const float d = half_at(blk + 208);
      const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
      for (int b = 0; b < 8; ++b) {  // 32 weights: half b / 4, quarter b % 4
        const __m256i w = q6k_weights32(blk, b);
        const __m256i w_abs = _mm256_abs_epi8(w);
        const float d_a = d * float(sc[b * 2]), d_b = d * float(sc[b * 2 + 1]);
        for (int r = 0; r < R; ++r) {
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[r] + b * 32));
          const __m256i s = dot4(w_abs, _mm256_sign_epi8(xv, w));  // lanes 0-3, 4-7: the two 16s
          const __m256 scale = _mm256_blend_ps(_mm256_set1_ps(d_a * dx[r][b]), _mm256_set1_ps(d_b * dx[r][b]), 0xF0);
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, acc[r]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) out[r] = lane_tree8(acc[r]) - off[r];
}

template <int64_t TYPE>
float dot_k(Avx2, const uint8_t* row, int64_t K, const QuantizedRow& x) {
  const QuantizedRow* xs[1] = {&x};
  float out;
  dot_k_rows<TYPE, 1>(Avx2{}, row, K, xs, &out);
  return out;
}

template <int64_t TYPE>
void dot_k2(Avx2, const uint8_t* row, int64_t K, const QuantizedRow& x0, const QuantizedRow& x1, float* o0,
            float* o1) {
  const QuantizedRow* xs[2] = {&x0, &x1};
  float out[2];
  dot_k_rows<TYPE, 2>(Avx2{}, row, K, xs, out);
  *o0 = out[0], *o1 = out[1];
}
#endif

#if defined(PAGED_QUANT_VNNI)
template <int64_t TYPE>
float dot_k(Vnni, const uint8_t* row, int64_t K, const QuantizedRow& x) {
  const int64_t supers = K / QK_K;
  float off = 0.0f;
  __m512 acc = _mm512_setzero_ps();
  const __m512i zero = _mm512_setzero_si512();
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int64_t sb = 0; sb < supers; ++sb) {
    const float* dx = x.d + sb * 8;  // the 8 activation blocks of this super-block
    const int8_t* xq = x.q + sb * QK_K;
    if constexpr (TYPE == kQ4_K) {
      const uint8_t* blk = row + sb * 144;
      const float d = half_at(blk), dmin = half_at(blk + 2);
      uint8_t sc[8], m[8];
      k_scales_mins(blk + 4, sc, m);
      for (int c = 0; c < 4; ++c) {  // 64 weights: blocks 2c (low nibbles) and 2c + 1 (high)
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + c * 32));
        const __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        const __m512i s = _mm512_dpbusd_epi32(zero, w, _mm512_loadu_si512(xq + c * 64));
        const __m512 scale = _mm512_mask_blend_ps(__mmask16(0xFF00), _mm512_set1_ps(d * float(sc[2 * c]) * dx[2 * c]),
                                                  _mm512_set1_ps(d * float(sc[2 * c + 1]) * dx[2 * c + 1]));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, acc);
      }
      off = q4k_min_term(dmin, m, x.s + sb * 8, off);
    } else {  // Q6_K
      const uint8_t* blk = row + sb * 210;
      const float d = half_at(blk + 208);
      const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
      for (int b = 0; b < 8; ++b) {  // 32 weights: half b / 4, quarter b % 4
        const __m256i w = q6k_weights32(blk, b);
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + b * 32));
        const __m256i sx = _mm256_mask_sub_epi8(xv, _mm256_movepi8_mask(w), _mm256_setzero_si256(), xv);
        const __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(w), sx);  // lanes 0-3, 4-7
        const int i = b * 2;  // the two sub-blocks of 16
        const __m256 scale = _mm256_blend_ps(_mm256_set1_ps(d * float(sc[i]) * dx[b]),
                                             _mm256_set1_ps(d * float(sc[i + 1]) * dx[b]), 0xF0);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_zextsi256_si512(s)),
                              _mm512_castps256_ps512(scale), acc);  // lanes 8..15 stay zero
      }
    }
  }
  return _mm512_reduce_add_ps(acc) - off;
}
#endif

// w of a K-quant super-block row, as gguf's dequantizer rounds it: each product, then the difference.
inline void dequantize_k_row(const uint8_t* row, int64_t type, int64_t K, float* w) {
  for (int64_t sb = 0; sb < K / QK_K; ++sb) {
    float* out = w + sb * QK_K;
    if (type == kQ4_K) {
      const uint8_t* blk = row + sb * 144;
      const float d = half_at(blk), dmin = half_at(blk + 2);
      uint8_t sc[8], m[8];
      k_scales_mins(blk + 4, sc, m);
      for (int j = 0; j < 256; ++j) {
        const float dl = d * float(sc[j / 32]), ml = dmin * float(m[j / 32]);
        out[j] = dl * float(q4k_at(blk, j)) - ml;
      }
    } else {
      const uint8_t* blk = row + sb * 210;
      const float d = half_at(blk + 208);
      const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
      for (int j = 0; j < 256; ++j) out[j] = (d * float(sc[j / 16])) * float(q6_at(blk, j) - 32);
    }
  }
}

// The other loops: dot_k once for each row.
template <int64_t TYPE, typename Isa>
void dot_k2(Isa isa, const uint8_t* row, int64_t K, const QuantizedRow& x0, const QuantizedRow& x1, float* o0,
            float* o1) {
  *o0 = dot_k<TYPE>(isa, row, K, x0);
  *o1 = dot_k<TYPE>(isa, row, K, x1);
}
