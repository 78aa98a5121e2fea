// A linear layer whose weight stays in GGUF's quantized blocks: y = x · Wᵀ.
//
// A GGUF file (llama.cpp's format) stores each row of a weight matrix W [N, K]
// as blocks of 32 consecutive weights: a float16 scale d (Q4_1: and a float16
// offset m) and 32 small integers q.
//
//   type   weights                          bytes per block
//   Q4_0   w = d * (q - 8),  q in 0..15     18: d, 16 bytes (q[j] low nibble, q[j + 16] high)
//   Q4_1   w = d * q + m,    q in 0..15     20: d, m, 16 bytes as in Q4_0
//   Q5_0   w = d * (q - 16), q in 0..31     22: d, qh (bit j: q[j]'s fifth bit), 16 bytes as in Q4_0
//   Q8_0   w = d * q,        q in -128..127 34: d, 32 int8
//
// At one token per step a decoder reads every weight once per token and does
// two flops with it, so its speed is the speed of reading weights: 4.5 to 8.5
// bits per weight here instead of bfloat16's 16. Widening every weight to a
// float to multiply it costs more instructions than the memory saves time
// (measured: slower than a bfloat16 GEMM), so the kernel does what llama.cpp
// does: it quantizes the activations too, each block of 32 values of a row of
// x to int8 with a float32 scale (dx = max|x| / 127, qx = round(x / dx)), and
// multiplies integers: one AVX-512 VNNI instruction (vpdpbusd) sums 64
// products of unsigned 8-bit by signed 8-bit values. Per block of a row,
//
//   sum_j w_j x_j  ~  d dx sum_j q_j qx_j  +  m dx sum_j qx_j      (m = -8 d for Q4_0, -16 d for Q5_0)
//
// with the integer sums exact and the rest in float32. So the result is the
// product of the dequantized weights with the int8-rounded x, up to float32
// rounding; tests/kernels/test_quant_linear.py checks it against that product
// in float64 and against the exact x within the bound the rounding of x gives.
//
// Layout. At load, each row's blocks are regrouped (paged/models/quantized.py,
// ``pack_blocks``): all its q bytes, then all its d, then all its m (Q5_0: qh), with the
// block count padded to even by a zero block. Same bytes, but four blocks' q
// are one 64-byte load and four scales one 8-byte load.
//
// Every output element is summed in the same order wherever it falls (which
// row of x, how many rows, which thread), so a row's result does not depend on
// the batch.
//
// Three implementations of the same sums, one struct each (the tests name each, through
// quant_linear's impl): Scalar, the plain loops; Avx2, 32 bytes a step, where vpmaddubsw
// multiplies unsigned by signed bytes and adds neighbours to int16 (at most 2 * 128 * 127,
// which fits) and vpmaddwd by ones adds those to int32; Vnni, 64 bytes a step, vpdpbusd doing
// both at once. The integer sums are exact on all three; they differ only in the order the
// float32 terms are added, so each is held to the same bound, and each is batch-invariant on
// its own. impl="auto" takes the widest one compiled in.
//
// Q4_K and Q6_K (super-blocks of 256 weights, read in place): quant_linear_k.h. Every format laid out
// again with one output column per vector lane, for a VNNI loop and an AVX2 one (quant_pack_lanes,
// quant_linear_lanes): quant_linear_lanes.h.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) && \
    defined(__F16C__)
#define PAGED_QUANT_VNNI 1
#include <immintrin.h>

#include "avx512_math.h"
#endif
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define PAGED_QUANT_AVX2 1
#include <immintrin.h>

#include "lane_tree.h"
#endif
#if defined(PAGED_QUANT_VNNI) && !defined(PAGED_QUANT_AVX2)
#error "the VNNI loops call the AVX2 ones for Q5_0: a CPU with AVX-512 VNNI has AVX2, FMA and F16C"
#endif

#include "quant_linear.h"

namespace paged {
namespace {

// Which loops run (see the top of this file): a tag passed to the functions below.
struct Scalar {};
struct Avx2 {};
struct Vnni {};

constexpr int64_t QK = 32;     // weights per block
constexpr int64_t TILE_N = 4;  // output columns computed side by side
// Waking a second thread costs microseconds to tens of them where idle threads sleep (paged's
// default); a call of fewer than this many weights x rows of x finishes sooner on one. Measured
// per loop: on an AVX2 CPU (Zen 3, `python -m paged.bench quant_kernel --type Q4_1 --rows 1`) 960 x
// 576 took 0.072 ms split in two, 0.032 on one. The VNNI loop had a quarter of this bound, measured
// on a Zen 5 whose threads were then left spinning; with them asleep on a Zen 4 it woke the second
// thread for three of a decode step's four layers, and one stream of SmolLM2 Q4_1 decoded at
// 40-43 tokens/s against 52-55 with this bound (docs/benchmarks.md). The AVX2 and scalar loops
// count the rows of x at half (at least one): the weights are read once for all of them (the same
// AVX2 CPU, SmolLM2 Q4_1 decoding 2 or 4 sequences: 78.5, 88.5 -> 90.2, 94.4 and 107.7, 112.2 ->
// 117.3, 121.1 tokens/s against counting each row whole; docs/benchmarks.md); the VNNI loop counts
// each row whole. A caller whose threads spin (woken at once) passes its own, smaller rule
// (quant_linear's second_thread_weights; paged/models/quantized.py).
constexpr int64_t MIN_TASK_WEIGHTS = 1 << 21;
// A thread prefetches the tile this many ahead of the one it computes (speed only: no value changes).
constexpr int64_t PREFETCH_TILES = 8;

// Where the parts of one packed row are: q bytes, then the d scales, then (Q4_1) the m offsets.
struct RowLayout {
  int64_t blocks;      // K / 32, padded to even
  int64_t q_bytes;     // per block: 16 (Q4_x) or 32 (Q8_0)
  int64_t row_bytes;
  int64_t d_offset, m_offset;  // m_offset: Q4_1's offsets m, or Q5_0's high bits qh (4 bytes a block)

  RowLayout(int64_t type, int64_t K) {
    if (is_k(type)) {  // super-blocks as stored; blocks: of the activations (32 each)
      blocks = K / QK;
      q_bytes = d_offset = m_offset = 0;
      row_bytes = K / 256 * (type == kQ4_K ? 144 : 210);
      return;
    }
    blocks = K / QK + (K / QK) % 2;
    q_bytes = type == kQ8_0 ? 32 : 16;
    d_offset = blocks * q_bytes;
    m_offset = d_offset + blocks * 2;
    row_bytes = m_offset + (type == kQ4_1 ? blocks * 2 : type == kQ5_0 ? blocks * 4 : 0);
  }

  static constexpr bool is_k(int64_t type) { return type == kQ4_K || type == kQ6_K; }
};

void check_type(int64_t type) {
  TORCH_CHECK_VALUE(type == kQ4_0 || type == kQ4_1 || type == kQ5_0 || type == kQ8_0 || RowLayout::is_k(type),
                    "unsupported GGUF block type ", type,
                    "; supported: 2 (Q4_0), 3 (Q4_1), 6 (Q5_0), 8 (Q8_0), 12 (Q4_K), 14 (Q6_K)");
}

inline float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return c10::detail::fp16_ieee_to_fp32_value(bits);
}

// Q5_0: the fifth bits of block b's 32 weights (bit j: weight j's), from the row's qh words.
inline uint32_t high_bits(const uint8_t* qh, int64_t b) {
  uint32_t bits;
  std::memcpy(&bits, qh + 4 * b, 4);
  return bits;
}

// --- the activations, quantized per block of 32 -------------------------------------------

// One row of x as int8 blocks. For the 4-bit formats the halves of each block are stored
// apart (lo: values 0..15 of every block, then hi: values 16..31), matching where the low
// and high nibbles of the weights sit; for Q8_0 they stay in order.
struct QuantizedRow {
  int8_t* q;  // [blocks * 32]
  float* d;   // [blocks] scale dx
  float* s;   // [blocks] dx * sum(qx), for the offset term of the 4-bit formats
};

// The memory for M rows of x as QuantizedRow's, blocks each.
struct QuantizedRows {
  int64_t blocks;
  std::vector<int8_t> q;
  std::vector<float> d, s;

  QuantizedRows(int64_t M, int64_t blocks) : blocks(blocks), q(M * blocks * QK), d(M * blocks), s(M * blocks) {}
  QuantizedRow row(int64_t m) { return {q.data() + m * blocks * QK, d.data() + m * blocks, s.data() + m * blocks}; }
};

template <typename T>
inline float widen_x(T v) { return static_cast<float>(v); }

// The plain loop: per block, the largest |x|, the step d = max / 127, each value rounded to the
// nearest multiple (ties to even) and clamped to +-127.
template <typename T>
void quantize_row(Scalar, const T* x, int64_t K, const RowLayout& L, bool split_halves, QuantizedRow out) {
  for (int64_t b = 0; b < L.blocks; ++b) {
    float v[QK];
    if (b < K / QK) {
      for (int j = 0; j < QK; ++j) v[j] = widen_x(x[b * QK + j]);
    } else {
      std::fill(v, v + QK, 0.0f);  // the padding block
    }
    float amax = 0.0f;
    for (int j = 0; j < QK; ++j) amax = std::max(amax, std::fabs(v[j]));
    const float d = amax / 127.0f;
    const float inv = d != 0.0f ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int j = 0; j < QK; ++j) {
      const int q = std::clamp(static_cast<int>(std::nearbyint(v[j] * inv)), -127, 127);  // ties to even
      sum += q;
      const int64_t at = split_halves ? (j < 16 ? b * 16 + j : L.blocks * 16 + b * 16 + j - 16) : b * QK + j;
      out.q[at] = static_cast<int8_t>(q);
    }
    out.d[b] = d;
    out.s[b] = d * static_cast<float>(sum);
  }
}

#if defined(PAGED_QUANT_AVX2)
// The AVX2 dot products read the activations as the scalar loop rounds them.
template <typename T>
void quantize_row(Avx2, const T* x, int64_t K, const RowLayout& L, bool split_halves, QuantizedRow out) {
  quantize_row(Scalar{}, x, K, L, split_halves, out);
}
#endif

#if defined(PAGED_QUANT_VNNI)
// The scalar loop, 32 values at a time: the same max, scale, products and rounding
// (cvtps_epi32 rounds ties to even, as nearbyint does), so the same bytes.
template <typename T>
void quantize_row(Vnni, const T* x, int64_t K, const RowLayout& L, bool split_halves, QuantizedRow out) {
  for (int64_t b = 0; b < K / QK; ++b) {
    const __m512 v0 = avx512::load16(x + b * QK), v1 = avx512::load16(x + b * QK + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float d = amax / 127.0f;
    const __m512 inv = _mm512_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    const __m512i lim = _mm512_set1_epi32(127);
    const __m512i q0 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v0, inv)),
                                                         _mm512_sub_epi32(_mm512_setzero_si512(), lim)), lim);
    const __m512i q1 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v1, inv)),
                                                         _mm512_sub_epi32(_mm512_setzero_si512(), lim)), lim);
    const int64_t lo = split_halves ? b * 16 : b * QK, hi = split_halves ? L.blocks * 16 + b * 16 : b * QK + 16;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out.q + lo), _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out.q + hi), _mm512_cvtsepi32_epi8(q1));
    out.d[b] = d;
    out.s[b] = d * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)));
  }
  for (int64_t b = K / QK; b < L.blocks; ++b) {  // the padding block
    const int64_t lo = split_halves ? b * 16 : b * QK, hi = split_halves ? L.blocks * 16 + b * 16 : b * QK + 16;
    std::memset(out.q + lo, 0, 16);
    std::memset(out.q + hi, 0, 16);
    out.d[b] = out.s[b] = 0.0f;
  }
}
#endif

// Every row of x [M, K] rounded per block (quantize_row), on torch's threads.
template <typename T, typename Isa>
QuantizedRows quantize_rows(Isa isa, const at::Tensor& x, int64_t K, const RowLayout& L, bool split_halves) {
  const int64_t M = x.size(0), ld = x.stride(0);
  const T* x0 = x.data_ptr<T>();
  QuantizedRows rows(M, L.blocks);
  at::parallel_for(0, M, std::max<int64_t>(1, 8192 / K), [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) quantize_row(isa, x0 + m * ld, K, L, split_halves, rows.row(m));
  });
  return rows;
}

// --- the dot products of one row of x with TILE_N (or fewer) rows of W --------------------
//
// dot_cols(isa, ...) writes out[c] = sum_b d_b dx_b sum_j q_j qx_j for C rows of W side by side
// (they share each load of x); add_offsets then adds each row's offset term.

#if defined(PAGED_QUANT_AVX2) || defined(PAGED_QUANT_VNNI)
inline __m128 half_scales(const uint8_t* d16, int n) {  // n = 2 or 4 blocks' float16 d, widened
  int32_t two;
  std::memcpy(&two, d16, 4);
  return _mm_cvtph_ps(n == 4 ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(d16)) : _mm_cvtsi32_si128(two));
}
inline __m128 scales(__m128 d, const float* dx, int n) {  // d * dx for those n blocks
  return _mm_mul_ps(d, n == 4 ? _mm_loadu_ps(dx) : _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(dx))));
}
inline __m128 scales(const uint8_t* d16, const float* dx, int n) { return scales(half_scales(d16, n), dx, n); }
#endif

// sum_b m_b * s_b (Q4_1), or sum_b d_b * s_b (Q4_0, to be multiplied by -8): the offset term.
inline float offset_term(Scalar, const uint8_t* h16, const float* s, int64_t blocks) {
  float acc = 0.0f;
  for (int64_t b = 0; b < blocks; ++b) acc = std::fma(half_at(h16 + 2 * b), s[b], acc);
  return acc;
}

template <int64_t TYPE, int C>
void dot_cols(Scalar, const uint8_t* rows, const RowLayout& L, const QuantizedRow& x, float* out) {
  const int64_t B = L.blocks;
  for (int c = 0; c < C; ++c) {
    const uint8_t* row = rows + c * L.row_bytes;
    float acc = 0.0f;
    for (int64_t b = 0; b < B; ++b) {
      int32_t s = 0;
      for (int j = 0; j < QK; ++j) {
        int w;
        if constexpr (TYPE == kQ8_0) {
          w = reinterpret_cast<const int8_t*>(row)[b * QK + j];
          s += w * x.q[b * QK + j];
        } else {
          const uint8_t byte = row[b * 16 + (j & 15)];
          w = j < 16 ? (byte & 0xF) : (byte >> 4);
          if constexpr (TYPE == kQ5_0) w |= ((high_bits(row + L.m_offset, b) >> j) & 1) << 4;
          s += w * x.q[(j < 16 ? 0 : B * 16) + b * 16 + (j & 15)];
        }
      }
      acc = std::fma(static_cast<float>(s), half_at(row + L.d_offset + 2 * b) * x.d[b], acc);
    }
    out[c] = acc;
  }
}

#if defined(PAGED_QUANT_AVX2)
// 16 int16 lanes added in pairs into 8 int32 ones (vpmaddwd by ones), exact.
inline __m256i widen_pairs(__m256i pairs) { return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)); }

// Lane i of the result: sum of the products of bytes 4i..4i+3 (u unsigned, s signed), exact.
inline __m256i dot4(__m256i u, __m256i s) { return widen_pairs(_mm256_maddubs_epi16(u, s)); }

// Byte i: 16 where bit i of bits is set, else 0 (Q5_0's fifth bits, in place in their bytes).
inline __m256i fifth_bits(uint32_t bits) {
  const __m256i spread = _mm256_shuffle_epi8(  // byte i <- byte i / 8 of bits
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201);  // byte i: bit i % 8
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(16));
}

inline float offset_term(Avx2, const uint8_t* h16, const float* s, int64_t blocks) {
  __m256 acc = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 8 <= blocks; b += 8) {
    const __m256 h = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h16 + 2 * b)));
    acc = _mm256_fmadd_ps(h, _mm256_loadu_ps(s + b), acc);
  }
  float total = lane_tree8(acc);
  for (; b < blocks; ++b) total = std::fma(half_at(h16 + 2 * b), s[b], total);
  return total;
}

// dot_cols for R rows of x at once (xs[r] -> out[r]): each output gets the same operations in the same
// order whatever R, and the rows share what depends on the weights only (each load of W, the 4-bit
// unpacking, Q5_0's fifth bits, Q8_0's |w|, the float16 scales widened), which R = 1 redoes per row.
template <int64_t TYPE, int C, int R>
void dot_cols_rows(Avx2, const uint8_t* rows, const RowLayout& L, const QuantizedRow* const* xs, float* const* out) {
  const int64_t B = L.blocks;
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  if constexpr (TYPE == kQ8_0) {
    for (int64_t b = 0; b < B; ++b) {  // one block of 32 per step
      __m256i xv[R];
      for (int r = 0; r < R; ++r) xv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[r]->q + b * QK));
      for (int c = 0; c < C; ++c) {
        const uint8_t* row = rows + c * L.row_bytes;
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + b * QK));
        const __m256i w_abs = _mm256_abs_epi8(w);
        const float d = half_at(row + L.d_offset + 2 * b);
        for (int r = 0; r < R; ++r) {
          // vpmaddubsw multiplies unsigned by signed bytes: |w| times x with w's sign
          const __m256i s = dot4(w_abs, _mm256_sign_epi8(xv[r], w));
          acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d * xs[r]->d[b]), acc[r][c]);
        }
      }
    }
  } else {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i spread = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);  // lanes 0-3: block b, 4-7: b + 1
    for (int64_t b = 0; b < B; b += 2) {  // two blocks per step (B is even)
      __m256i lo_x[R], hi_x[R];
      for (int r = 0; r < R; ++r) {
        lo_x[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[r]->q + b * 16));
        hi_x[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[r]->q + B * 16 + b * 16));
      }
      for (int c = 0; c < C; ++c) {
        const uint8_t* row = rows + c * L.row_bytes;
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + b * 16));
        __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        if constexpr (TYPE == kQ5_0) {  // lo: weights 0..15 of blocks b and b + 1; hi: weights 16..31
          const uint32_t h0 = high_bits(row + L.m_offset, b), h1 = high_bits(row + L.m_offset, b + 1);
          lo = _mm256_or_si256(lo, fifth_bits((h0 & 0xFFFFu) | (h1 << 16)));
          hi = _mm256_or_si256(hi, fifth_bits((h0 >> 16) | (h1 & 0xFFFF0000u)));
        }
        const __m128 d = half_scales(row + L.d_offset + 2 * b, 2);
        for (int r = 0; r < R; ++r) {
          // four products of at most 31 * 127 per int16 lane before vpmaddwd widens them
          const __m256i pairs =
              _mm256_add_epi16(_mm256_maddubs_epi16(lo, lo_x[r]), _mm256_maddubs_epi16(hi, hi_x[r]));
          const __m256i s = _mm256_madd_epi16(pairs, ones);
          const __m256 scale =
              _mm256_permutevar8x32_ps(_mm256_castps128_ps256(scales(d, xs[r]->d + b, 2)), spread);
          acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, acc[r][c]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[r][c] = lane_tree8(acc[r][c]);
}

template <int64_t TYPE, int C>
void dot_cols(Avx2, const uint8_t* rows, const RowLayout& L, const QuantizedRow& x, float* out) {
  const QuantizedRow* xs[1] = {&x};
  float* outs[1] = {out};
  dot_cols_rows<TYPE, C, 1>(Avx2{}, rows, L, xs, outs);
}

template <int64_t TYPE, int C>
void dot_cols2(Avx2, const uint8_t* rows, const RowLayout& L, const QuantizedRow& x0, const QuantizedRow& x1,
               float* out0, float* out1) {
  const QuantizedRow* xs[2] = {&x0, &x1};
  float* outs[2] = {out0, out1};
  dot_cols_rows<TYPE, C, 2>(Avx2{}, rows, L, xs, outs);
}
#endif

#if defined(PAGED_QUANT_VNNI)
// lanes 4i..4i+3 <- scale i (four blocks of 4-bit weights per 512-bit step)
inline __m512 spread4(__m128 s) {
  return _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
                               _mm512_castps128_ps512(s));
}
// lanes 8i..8i+7 <- scale i (two blocks of Q8_0 per step)
inline __m512 spread2x8(__m128 s) {
  return _mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                               _mm512_castps128_ps512(s));
}

inline float offset_term(Vnni, const uint8_t* h16, const float* s, int64_t blocks) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; b += 16) {
    const __mmask16 k = blocks - b >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (blocks - b)) - 1);
    const __m512 h = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, h16 + 2 * b));
    acc = _mm512_fmadd_ps(h, _mm512_maskz_loadu_ps(k, s + b), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

template <int64_t TYPE, int C>
void dot_cols(Vnni, const uint8_t* rows, const RowLayout& L, const QuantizedRow& x, float* out) {
  if constexpr (TYPE == kQ5_0) {  // the AVX2 loop (a Q4_K_M file's few Q5_0 layers; the same rounded x)
    dot_cols<TYPE, C>(Avx2{}, rows, L, x, out);
    return;
  }
  const int64_t B = L.blocks;
  __m512 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
  const __m512i zero = _mm512_setzero_si512();
  if constexpr (TYPE == kQ8_0) {
    for (int64_t b = 0; b < B; b += 2) {  // B is even
      const __m512i xv = _mm512_loadu_si512(x.q + b * QK);
      const __m128 dx2 = _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(x.d + b)));
      for (int c = 0; c < C; ++c) {
        const uint8_t* row = rows + c * L.row_bytes;
        const __m512i w = _mm512_loadu_si512(row + b * QK);
        // vpdpbusd multiplies unsigned by signed bytes: |w| times x with w's sign
        const __m512i sx = _mm512_mask_sub_epi8(xv, _mm512_movepi8_mask(w), zero, xv);
        const __m512i s = _mm512_dpbusd_epi32(zero, _mm512_abs_epi8(w), sx);
        int32_t two;
        std::memcpy(&two, row + L.d_offset + 2 * b, 4);
        const __m128i h = _mm_cvtsi32_si128(two);
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), spread2x8(_mm_mul_ps(_mm_cvtph_ps(h), dx2)), acc[c]);
      }
    }
  } else {
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    const int8_t* xlo = x.q;
    const int8_t* xhi = x.q + B * 16;
    int64_t b = 0;
    for (; b + 4 <= B; b += 4) {
      const __m512i lo_x = _mm512_loadu_si512(xlo + b * 16), hi_x = _mm512_loadu_si512(xhi + b * 16);
      for (int c = 0; c < C; ++c) {
        const uint8_t* row = rows + c * L.row_bytes;
        const __m512i v = _mm512_loadu_si512(row + b * 16);
        const __m512i lo = _mm512_and_si512(v, low4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, lo, lo_x), hi, hi_x);
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), spread4(scales(row + L.d_offset + 2 * b, x.d + b, 4)),
                                 acc[c]);
      }
    }
    if (b < B) {  // two blocks left (B is even): the same on 256 bits, zero-extended
      const __m256i lo_x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xlo + b * 16));
      const __m256i hi_x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xhi + b * 16));
      const __m256i low4_256 = _mm256_set1_epi8(0x0F);
      for (int c = 0; c < C; ++c) {
        const uint8_t* row = rows + c * L.row_bytes;
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + b * 16));
        const __m256i lo = _mm256_and_si256(v, low4_256);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4_256);
        const __m256i z = _mm256_setzero_si256();
        const __m256i s = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(z, lo, lo_x), hi, hi_x);
        const __m512 s16 = _mm512_cvtepi32_ps(_mm512_zextsi256_si512(s));  // lanes 8..15 are zero
        acc[c] = _mm512_fmadd_ps(s16, spread4(scales(row + L.d_offset + 2 * b, x.d + b, 2)), acc[c]);
      }
    }
  }
  for (int c = 0; c < C; ++c) out[c] = _mm512_reduce_add_ps(acc[c]);
}
#endif

// The other loops: dot_cols once for each row.
template <int64_t TYPE, int C, typename Isa>
void dot_cols2(Isa isa, const uint8_t* rows, const RowLayout& L, const QuantizedRow& x0, const QuantizedRow& x1,
               float* out0, float* out1) {
  dot_cols<TYPE, C>(isa, rows, L, x0, out0);
  dot_cols<TYPE, C>(isa, rows, L, x1, out1);
}

// The offset term of the 4-bit formats, for each of the C rows.
template <int64_t TYPE, int C, typename Isa>
void add_offsets(Isa isa, const uint8_t* rows, const RowLayout& L, const QuantizedRow& x, float* out) {
  if constexpr (TYPE == kQ4_1) {
    for (int c = 0; c < C; ++c) out[c] += offset_term(isa, rows + c * L.row_bytes + L.m_offset, x.s, L.blocks);
  } else if constexpr (TYPE == kQ4_0 || TYPE == kQ5_0) {
    constexpr float zero_point = TYPE == kQ4_0 ? 8.0f : 16.0f;
    for (int c = 0; c < C; ++c) {
      out[c] -= zero_point * offset_term(isa, rows + c * L.row_bytes + L.d_offset, x.s, L.blocks);
    }
  }
}

#include "quant_linear_k.h"
#include "quant_linear_lanes.h"

// f(std::integral_constant<int, C>{}) with C = cols (1 .. TILE_N): the loops take their column count as
// a template argument, so their accumulators are registers.
template <typename F>
void with_cols(int64_t cols, F&& f) {
  switch (cols) {
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    default: f(std::integral_constant<int, 1>{}); break;
  }
}

template <typename Isa, typename T, int64_t TYPE>
void linear_impl(const at::Tensor& x, const at::Tensor& packed, int64_t N, int64_t K, at::Tensor& y,
                 std::optional<int64_t> second_thread_weights) {
  const RowLayout L(TYPE, K);
  const int64_t M = x.size(0);
  T* y0 = y.data_ptr<T>();
  const uint8_t* w0 = packed.data_ptr<uint8_t>();
  QuantizedRows xq = quantize_rows<T>(Isa{}, x, K, L, TYPE != kQ8_0 && !RowLayout::is_k(TYPE));
  auto row_of = [&](int64_t m) { return xq.row(m); };
  const int64_t tiles = (N + TILE_N - 1) / TILE_N;
  const int64_t min_task = second_thread_weights.value_or(MIN_TASK_WEIGHTS);
  const int64_t rows_counted = std::is_same_v<Isa, Vnni> ? M : std::max<int64_t>(1, M / 2);
  const int64_t grain = std::max<int64_t>(1, min_task / (TILE_N * K * rows_counted));
  at::parallel_for(0, tiles, grain, [&](int64_t begin, int64_t end) {
    float out[TILE_N], out1[TILE_N];
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n0 = t * TILE_N, cols = std::min(TILE_N, N - n0);
      const uint8_t* rows = w0 + n0 * L.row_bytes;
      if (t + PREFETCH_TILES < end) {  // ask for a later tile's bytes now: memory answers in ~100 ns
        const uint8_t* ahead = rows + PREFETCH_TILES * TILE_N * L.row_bytes;
        for (int64_t i = 0; i < TILE_N * L.row_bytes; i += 64) __builtin_prefetch(ahead + i);
      }
      auto store = [&](int64_t m, const float* o) {
        for (int64_t c = 0; c < cols; ++c) y0[m * N + n0 + c] = static_cast<T>(o[c]);
      };
      for (int64_t m = 0; m < M;) {
        const QuantizedRow xr = row_of(m);
        if constexpr (RowLayout::is_k(TYPE)) {
          if (m + 1 < M) {  // two rows of x at once: the same sums as one at a time
            const QuantizedRow xr1 = row_of(m + 1);
            for (int64_t c = 0; c < cols; ++c) dot_k2<TYPE>(Isa{}, rows + c * L.row_bytes, K, xr, xr1, out + c, out1 + c);
            store(m, out), store(m + 1, out1), m += 2;
          } else {
            for (int64_t c = 0; c < cols; ++c) out[c] = dot_k<TYPE>(Isa{}, rows + c * L.row_bytes, K, xr);
            store(m, out), m += 1;
          }
        } else if (m + 1 < M) {  // two rows of x at once: the same sums as one at a time
          const QuantizedRow xr1 = row_of(m + 1);
          with_cols(cols, [&](auto tag) {
            constexpr int C = decltype(tag)::value;
            dot_cols2<TYPE, C>(Isa{}, rows, L, xr, xr1, out, out1);
            add_offsets<TYPE, C>(Isa{}, rows, L, xr, out), add_offsets<TYPE, C>(Isa{}, rows, L, xr1, out1);
          });
          store(m, out), store(m + 1, out1), m += 2;
        } else {
          with_cols(cols, [&](auto tag) {
            constexpr int C = decltype(tag)::value;
            dot_cols<TYPE, C>(Isa{}, rows, L, xr, out), add_offsets<TYPE, C>(Isa{}, rows, L, xr, out);
          });
          store(m, out), m += 1;
        }
      }
    }
  });
}

// A block type the kernel reads and a shape of whole blocks (K-quants: super-blocks) per row.
void check_shape(int64_t type, int64_t N, int64_t K) {
  check_type(type);
  const int64_t unit = RowLayout::is_k(type) ? 256 : QK;
  TORCH_CHECK_VALUE(N > 0 && K > 0 && K % unit == 0, "a quantized weight needs N > 0 and K a positive multiple of ",
                    unit, ", got N = ", N, ", K = ", K);
}

void check_packed(const at::Tensor& packed, int64_t type, int64_t N, int64_t K) {
  check_shape(type, N, K);
  TORCH_CHECK_TYPE(packed.scalar_type() == at::kByte, "packed blocks must be uint8, got ", packed.scalar_type());
  TORCH_CHECK_VALUE(packed.device().is_cpu() && packed.is_contiguous(), "packed blocks must be a contiguous CPU tensor");
  const RowLayout L(type, K);
  TORCH_CHECK_VALUE(packed.numel() == N * L.row_bytes, "packed blocks hold ", packed.numel(), " bytes; a [", N, ", ",
                    K, "] weight of type ", type, " takes ", N * L.row_bytes, " (pack_blocks' layout)");
}

void check_x(const at::Tensor& x, int64_t K) {
  TORCH_CHECK_VALUE(x.device().is_cpu(), "x must be on the CPU, got ", x.device());
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
                   "x must be float32 or bfloat16, got ", x.scalar_type());
  TORCH_CHECK_VALUE(x.dim() == 2 && x.size(1) == K && x.stride(1) == 1, "x must be [M, ", K,
                    "] with contiguous rows, got shape ", x.sizes(), " strides ", x.strides());
}

}  // namespace

bool quant_vnni_compiled() {
#if defined(PAGED_QUANT_VNNI)
  return true;
#else
  return false;
#endif
}

bool quant_avx2_compiled() {
#if defined(PAGED_QUANT_AVX2)
  return true;
#else
  return false;
#endif
}

at::Tensor quant_dequantize(const at::Tensor& packed, int64_t type, int64_t N, int64_t K) {
  check_packed(packed, type, N, K);
  const RowLayout L(type, K);
  at::Tensor out = at::empty({N, K}, packed.options().dtype(at::kFloat));
  const uint8_t* w0 = packed.data_ptr<uint8_t>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const uint8_t* row = w0 + n * L.row_bytes;
      if (RowLayout::is_k(type)) {
        dequantize_k_row(row, type, K, o + n * K);
        continue;
      }
      for (int64_t b = 0; b < K / QK; ++b) {
        const float d = half_at(row + L.d_offset + 2 * b);
        float* w = o + n * K + b * QK;
        for (int j = 0; j < QK; ++j) {
          if (type == kQ8_0) {
            w[j] = d * float(reinterpret_cast<const int8_t*>(row)[b * QK + j]);
            continue;
          }
          const uint8_t byte = row[b * 16 + (j & 15)];
          const int q = j < 16 ? (byte & 0xF) : (byte >> 4);
          if (type == kQ5_0) {  // the fifth bit from qh
            const int high = static_cast<int>((high_bits(row + L.m_offset, b) >> j) & 1);
            w[j] = d * float((q | (high << 4)) - 16);
            continue;
          }
          // -ffp-contract=off: each product rounded before the sum, as gguf's dequantizer rounds
          w[j] = type == kQ4_0 ? d * float(q - 8) : d * float(q) + half_at(row + L.m_offset + 2 * b);
        }
      }
    }
  });
  return out;
}

namespace {

// f(std::type_identity<T>{}, std::integral_constant<int64_t, TYPE>{}) for x's dtype T and the block type: the
// loops take both as template arguments.
template <typename F>
void with_dtype_and_type(const at::Tensor& x, int64_t type, F&& f) {
  auto by_type = [&](auto dtype) {
    switch (type) {
      case kQ4_0: f(dtype, std::integral_constant<int64_t, kQ4_0>{}); break;
      case kQ4_1: f(dtype, std::integral_constant<int64_t, kQ4_1>{}); break;
      case kQ5_0: f(dtype, std::integral_constant<int64_t, kQ5_0>{}); break;
      case kQ4_K: f(dtype, std::integral_constant<int64_t, kQ4_K>{}); break;
      case kQ6_K: f(dtype, std::integral_constant<int64_t, kQ6_K>{}); break;
      default: f(dtype, std::integral_constant<int64_t, kQ8_0>{}); break;
    }
  };
  if (x.scalar_type() == at::kBFloat16) {
    by_type(std::type_identity<c10::BFloat16>{});
  } else {
    by_type(std::type_identity<float>{});
  }
}

template <typename Isa>
void linear_for(const at::Tensor& x, const at::Tensor& packed, int64_t type, int64_t N, int64_t K, at::Tensor& y,
                std::optional<int64_t> split) {
  with_dtype_and_type(x, type, [&](auto dtype, auto block_type) {
    linear_impl<Isa, typename decltype(dtype)::type, decltype(block_type)::value>(x, packed, N, K, y, split);
  });
}

// Refuses the lanes layout where no loop that reads it is built (the AVX2 one, or the VNNI one beside it).
void check_lanes_built() {
  TORCH_CHECK_VALUE(quant_avx2_compiled(), "the lanes layout needs a build for a CPU with AVX2, FMA and F16C; "
                    "this one has not (quant_avx2_compiled() is False)");
}

#if defined(PAGED_QUANT_AVX2)
// A tensor that holds (lanes) or is to hold (into) the lanes layout of a [N, K] weight: uint8, contiguous, on
// the CPU, quant_lanes_bytes long.
void check_lanes_tensor(const at::Tensor& t, const char* name, const LaneLayout& L, int64_t type, int64_t N,
                        int64_t K) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kByte, name, " must be uint8, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.device().is_cpu() && t.is_contiguous() && t.numel() == L.groups * L.group_bytes, name,
                    " must be a contiguous CPU tensor of ", L.groups * L.group_bytes,
                    " bytes (quant_lanes_bytes) for a [", N, ", ", K, "] weight of type ", type, ", got ", t.numel());
}
#endif

}  // namespace

at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& packed, int64_t type, int64_t N, int64_t K,
                        const std::string& impl, std::optional<int64_t> second_thread_weights) {
  check_packed(packed, type, N, K);
  TORCH_CHECK_VALUE(impl == "auto" || impl == "scalar" || impl == "avx2" || impl == "avx512",
                    "impl must be 'auto', 'scalar', 'avx2' or 'avx512', got '", impl, "'");
  TORCH_CHECK_VALUE(impl != "avx2" || quant_avx2_compiled(), "impl 'avx2' needs a build for a CPU with AVX2, FMA "
                    "and F16C; this one has not (quant_avx2_compiled() is False)");
  TORCH_CHECK_VALUE(impl != "avx512" || quant_vnni_compiled(), "impl 'avx512' needs a build for a CPU with "
                    "AVX-512 VNNI; this one has not (quant_vnni_compiled() is False)");
  check_x(x, K);
  at::Tensor y = at::empty({x.size(0), N}, x.options());
  if (x.size(0) == 0) return y;
#if defined(PAGED_QUANT_VNNI)
  if (impl == "avx512" || impl == "auto") {
    linear_for<Vnni>(x, packed, type, N, K, y, second_thread_weights);
    return y;
  }
#endif
#if defined(PAGED_QUANT_AVX2)
  if (impl == "avx2" || impl == "auto") {
    linear_for<Avx2>(x, packed, type, N, K, y, second_thread_weights);
    return y;
  }
#endif
  linear_for<Scalar>(x, packed, type, N, K, y, second_thread_weights);
  return y;
}

int64_t quant_lanes_bytes(int64_t type, int64_t N, int64_t K) {
  check_lanes_built();
  int64_t bytes = 0;
#if defined(PAGED_QUANT_AVX2)
  check_shape(type, N, K);
  const LaneLayout L(type, N, K);
  bytes = L.groups * L.group_bytes;
#endif
  return bytes;
}

at::Tensor quant_pack_lanes(const at::Tensor& packed, int64_t type, int64_t N, int64_t K,
                            const std::optional<at::Tensor>& into) {
  check_packed(packed, type, N, K);
  check_lanes_built();
  at::Tensor out;
#if defined(PAGED_QUANT_AVX2)
  const RowLayout RL(type, K);
  const LaneLayout L(type, N, K);
  if (into.has_value()) {  // a place given (one part of a larger allocation): zeroed here, as at::zeros would
    out = *into;
    check_lanes_tensor(out, "into", L, type, N, K);
    out.zero_();
  } else {
    out = at::zeros({L.groups * L.group_bytes}, packed.options());
  }
  const uint8_t* src = packed.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, L.groups, 16, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const uint8_t* rows[LANES];
      for (int64_t r = 0; r < LANES; ++r) rows[r] = g * LANES + r < N ? src + (g * LANES + r) * RL.row_bytes : nullptr;
      pack_lane_group(type, RL, L, rows, dst + g * L.group_bytes);
    }
  });
#endif
  return out;
}

at::Tensor quant_unpack_lanes(const at::Tensor& lanes, int64_t type, int64_t N, int64_t K) {
  check_lanes_built();
  at::Tensor out;
#if defined(PAGED_QUANT_AVX2)
  check_shape(type, N, K);
  const RowLayout RL(type, K);
  const LaneLayout L(type, N, K);
  check_lanes_tensor(lanes, "lanes", L, type, N, K);
  out = at::zeros({N * RL.row_bytes}, lanes.options());
  const uint8_t* src = lanes.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, L.groups, 16, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      uint8_t* rows[LANES];
      for (int64_t r = 0; r < LANES; ++r) rows[r] = g * LANES + r < N ? dst + (g * LANES + r) * RL.row_bytes : nullptr;
      unpack_lane_group(type, RL, L, src + g * L.group_bytes, rows);
    }
  });
#endif
  return out;
}

at::Tensor quant_linear_lanes(const at::Tensor& x, const at::Tensor& lanes, int64_t type, int64_t N, int64_t K,
                              const std::string& impl, std::optional<int64_t> second_thread_weights) {
  check_lanes_built();
  TORCH_CHECK_VALUE(impl == "auto" || impl == "avx2" || impl == "avx512",
                    "impl must be 'auto', 'avx2' or 'avx512' for the lanes layout, got '", impl, "'");
  TORCH_CHECK_VALUE(impl != "avx512" || quant_vnni_compiled(), "impl 'avx512' needs a build for a CPU with "
                    "AVX-512 VNNI; this one has not (quant_vnni_compiled() is False)");
  at::Tensor y;
#if defined(PAGED_QUANT_AVX2)
  check_shape(type, N, K);
  const LaneLayout L(type, N, K);
  check_lanes_tensor(lanes, "lanes", L, type, N, K);
  check_x(x, K);
  y = at::empty({x.size(0), N}, x.options());
  if (x.size(0) == 0) return y;
  with_dtype_and_type(x, type, [&](auto dtype, auto block_type) {
    using D = typename decltype(dtype)::type;
    constexpr int64_t TYPE = decltype(block_type)::value;
#if defined(PAGED_QUANT_VNNI)
    if (impl != "avx2") return lanes_impl<Vnni, D, TYPE>(x, lanes, N, K, y, second_thread_weights);
#endif
    lanes_impl<Avx2, D, TYPE>(x, lanes, N, K, y, second_thread_weights);
  });
#endif
  return y;
}

}  // namespace paged
