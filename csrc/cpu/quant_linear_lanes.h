// The lanes layout of quant_linear.cpp: Q4_0, Q4_1, Q5_0 and Q8_0 weights regrouped so that one vector
// lane is one output column (AVX-512 VNNI only).
//
// The row layout (pack_blocks) keeps each weight row's blocks together, so a dot product sums 16
// lanes of partial sums and must add them up at the end, once per output: at one row of x that
// tree and the per-row scale shuffles cost more than the weights take to arrive. Here, per group of
// 16 output rows, block b of all 16 sits in one record:
//
//   4-bit (Q4_0, Q4_1)  256 bytes q: vector v (v = 0..3) holds in lane r (4 bytes) row r's weights
//                       8v..8v+3 in its low nibbles and 8v+4..8v+7 in its high ones
//                       | 16 float16 d | Q4_1: 16 float16 m               (288 or 320 bytes)
//   Q8_0                512 bytes q: vector v (v = 0..7) holds in lane r row r's weights
//                       4v..4v+3, each + 128 (as unsigned bytes) | 16 float16 d     (544 bytes)
//   Q5_0                as Q8_0, each weight's q - 16 (-16..15) in a byte: w = d (q - 16) is a Q8_0
//                       weight with the same d, so the same loop multiplies it, exactly. 1.5x the
//                       file's bytes, read as one stream.
//
// so one step of K is one 64-byte load of weights and one 4-byte broadcast of x, and vpdpbusd adds
// four products to each of 16 outputs at once. A group's records follow each other: a group is one
// stream of bytes, read from the start to the end (measured on a Zen 4: four groups read side by
// side got half the bandwidth one stream gets).
//
// Per output, in the order of the blocks b, with the integer sum exact:
//
//   4-bit:  acc = fma(float(sum_j q_j qx_j), d_b * dx_b, acc);  acc = fma(m_b, s_b, acc)
//           (m_b = -8 d_b for Q4_0; s_b = dx_b sum_j qx_j, QuantizedRow's s)
//   Q8_0:   acc = fma(float(sum_j (q_j + 128) qx_j - 128 sum_j qx_j), d_b * dx_b, acc)
//
// The same order for every row of x, every row count and thread count, so a row's result does not
// depend on the batch; it differs from the row layout's order (a float32 rounding apart), and
// tests/kernels/test_quant_linear.py holds it to the same bound.
// Included by quant_linear.cpp, inside its namespace, after QuantizedRow and quantize_row.

#pragma once

#if defined(PAGED_QUANT_VNNI)

constexpr int64_t LANES = 16;  // output columns per group: one float32 per lane of a 512-bit vector

inline bool lanes_type(int64_t type) { return type == kQ4_0 || type == kQ4_1 || type == kQ5_0 || type == kQ8_0; }

// The loop a type runs in lanes: Q5_0's is Q8_0's (see above).
constexpr int64_t lanes_loop(int64_t type) { return type == kQ5_0 ? kQ8_0 : type; }

struct LaneLayout {
  int64_t groups;       // N / 16, rounded up (the missing rows of the last group are zero)
  int64_t blocks;       // K / 32
  int64_t q_bytes;      // per record: 256 (4-bit) or 512 (Q8_0)
  int64_t block_bytes;  // one record: q, then 16 d, then (Q4_1) 16 m
  int64_t group_bytes;

  LaneLayout(int64_t type, int64_t N, int64_t K)
      : groups((N + LANES - 1) / LANES),
        blocks(K / QK),
        q_bytes(lanes_loop(type) == kQ8_0 ? 512 : 256),
        block_bytes(q_bytes + 2 * LANES * (type == kQ4_1 ? 2 : 1)),
        group_bytes(blocks * block_bytes) {}
};

// The records of one group from the row layout: rows[r] is row r of the group (nullptr past N).
inline void pack_lane_group(int64_t type, const RowLayout& RL, const LaneLayout& L, const uint8_t* const* rows,
                            uint8_t* group) {
  for (int64_t b = 0; b < L.blocks; ++b) {
    uint8_t* rec = group + b * L.block_bytes;
    for (int64_t r = 0; r < LANES; ++r) {
      const uint8_t* row = rows[r];
      if (row == nullptr) continue;  // the record was zeroed: weights 0, d 0 (and m 0)
      if (type == kQ8_0) {
        for (int v = 0; v < 8; ++v)
          for (int i = 0; i < 4; ++i) rec[64 * v + 4 * r + i] = static_cast<uint8_t>(row[b * QK + 4 * v + i] ^ 0x80);
      } else if (type == kQ5_0) {  // q - 16 + 128, q = the low nibble (weights 0..15) or high one, and bit j of qh
        const uint32_t high = high_bits(row + RL.m_offset, b);
        auto q = [&](int j) {
          const uint8_t byte = row[b * 16 + (j & 15)];
          return (j < 16 ? byte & 0xF : byte >> 4) | static_cast<int>(((high >> j) & 1) << 4);
        };
        for (int v = 0; v < 8; ++v)
          for (int i = 0; i < 4; ++i) rec[64 * v + 4 * r + i] = static_cast<uint8_t>(q(4 * v + i) - 16 + 128);
      } else {
        auto q = [&](int j) { const uint8_t byte = row[b * 16 + (j & 15)]; return j < 16 ? byte & 0xF : byte >> 4; };
        for (int v = 0; v < 4; ++v)
          for (int i = 0; i < 4; ++i) rec[64 * v + 4 * r + i] = static_cast<uint8_t>(q(8 * v + i) | (q(8 * v + 4 + i) << 4));
      }
      std::memcpy(rec + L.q_bytes + 2 * r, row + RL.d_offset + 2 * b, 2);
      if (type == kQ4_1) std::memcpy(rec + L.q_bytes + 2 * LANES + 2 * r, row + RL.m_offset + 2 * b, 2);
    }
  }
}

// The 16 outputs of one group for R rows of x (acc[r]: lane c is output column c of the group).
// qsum[r][b]: sum_j qx_j of block b of row r (Q8_0 only).
template <int64_t TYPE, int R>
void lanes_group(const uint8_t* group, const LaneLayout& L, const QuantizedRow* const* xs,
                 const int32_t* const* qsum, __m512 (&acc)[R]) {
  const __m512i zero = _mm512_setzero_si512();
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < L.blocks; ++b) {
    const uint8_t* rec = group + b * L.block_bytes;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + L.q_bytes)));
    if constexpr (TYPE == kQ8_0) {
      __m512i w[8];
      for (int v = 0; v < 8; ++v) w[v] = _mm512_loadu_si512(rec + 64 * v);
      for (int r = 0; r < R; ++r) {
        int32_t xw[8];  // x's 32 int8 of block b, four to a word
        std::memcpy(xw, xs[r]->q + b * QK, 32);
        __m512i s0 = zero, s1 = zero;  // two chains: vpdpbusd waits for its accumulator
        for (int v = 0; v < 8; v += 2) {
          s0 = _mm512_dpbusd_epi32(s0, w[v], _mm512_set1_epi32(xw[v]));
          s1 = _mm512_dpbusd_epi32(s1, w[v + 1], _mm512_set1_epi32(xw[v + 1]));
        }
        const __m512i s = _mm512_sub_epi32(_mm512_add_epi32(s0, s1), _mm512_set1_epi32(128 * qsum[r][b]));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d, _mm512_set1_ps(xs[r]->d[b])), acc[r]);
      }
    } else {
      __m512i lo[4], hi[4];
      for (int v = 0; v < 4; ++v) {
        const __m512i w = _mm512_loadu_si512(rec + 64 * v);
        lo[v] = _mm512_and_si512(w, low4);
        hi[v] = _mm512_and_si512(_mm512_srli_epi16(w, 4), low4);
      }
      const __m512 m = TYPE == kQ4_1
                           ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + L.q_bytes + 32)))
                           : _mm512_mul_ps(d, _mm512_set1_ps(-8.0f));  // exact: a power of two
      for (int r = 0; r < R; ++r) {
        int32_t xw[8];
        std::memcpy(xw, xs[r]->q + b * QK, 32);
        __m512i s0 = zero, s1 = zero;  // low nibbles meet x words 0, 2, 4, 6; high ones 1, 3, 5, 7
        for (int v = 0; v < 4; ++v) {
          s0 = _mm512_dpbusd_epi32(s0, lo[v], _mm512_set1_epi32(xw[2 * v]));
          s1 = _mm512_dpbusd_epi32(s1, hi[v], _mm512_set1_epi32(xw[2 * v + 1]));
        }
        const __m512 f = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
        acc[r] = _mm512_fmadd_ps(f, _mm512_mul_ps(d, _mm512_set1_ps(xs[r]->d[b])), acc[r]);
        acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(xs[r]->s[b]), acc[r]);
      }
    }
  }
}

template <typename T, int64_t TYPE>
void lanes_impl(const at::Tensor& x, const at::Tensor& lanes, int64_t N, int64_t K, at::Tensor& y,
                std::optional<int64_t> second_thread_weights) {
  const RowLayout RL(kQ8_0, K);  // x's blocks in their natural order (the padding block, if any, is never read)
  const LaneLayout L(TYPE, N, K);
  const int64_t M = x.size(0), ld = x.stride(0);
  const T* x0 = x.data_ptr<T>();
  T* y0 = y.data_ptr<T>();
  const uint8_t* w0 = lanes.data_ptr<uint8_t>();
  QuantizedRows xq(M, RL.blocks);
  auto row_of = [&](int64_t m) { return xq.row(m); };
  std::vector<int32_t> sums(TYPE == kQ8_0 ? M * L.blocks : 0);
  for (int64_t m = 0; m < M; ++m) {
    quantize_row(Vnni{}, x0 + m * ld, K, RL, false, row_of(m));
    if constexpr (TYPE == kQ8_0) {
      for (int64_t b = 0; b < L.blocks; ++b) {
        int32_t total = 0;
        for (int j = 0; j < QK; ++j) total += row_of(m).q[b * QK + j];
        sums[m * L.blocks + b] = total;
      }
    }
  }
  const int64_t min_task = second_thread_weights.value_or(MIN_TASK_WEIGHTS);
  const int64_t grain = std::max<int64_t>(1, min_task / (LANES * K * M));
  at::parallel_for(0, L.groups, grain, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const uint8_t* group = w0 + g * L.group_bytes;
      const int64_t n0 = g * LANES, cols = std::min(LANES, N - n0);
      auto run = [&](int64_t m, auto rows) {  // rows of x m .. m + R - 1
        constexpr int R = decltype(rows)::value;
        QuantizedRow xr[R];
        const QuantizedRow* xs[R];
        const int32_t* qs[R];
        for (int r = 0; r < R; ++r) {
          xr[r] = row_of(m + r), xs[r] = &xr[r];
          qs[r] = sums.empty() ? nullptr : sums.data() + (m + r) * L.blocks;
        }
        __m512 acc[R];
        lanes_group<TYPE, R>(group, L, xs, qs, acc);
        for (int r = 0; r < R; ++r) {
          alignas(64) float out[LANES];
          _mm512_store_ps(out, acc[r]);
          for (int64_t c = 0; c < cols; ++c) y0[(m + r) * N + n0 + c] = static_cast<T>(out[c]);
        }
      };
      int64_t m = 0;
      for (; m + 2 <= M; m += 2) run(m, std::integral_constant<int, 2>{});  // a group's records read once for two rows
      if (m < M) run(m, std::integral_constant<int, 1>{});
    }
  });
}

#endif  // PAGED_QUANT_VNNI
