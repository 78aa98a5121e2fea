// The lanes layout of quant_linear.cpp: Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K weights regrouped so that
// one vector lane is one output column (read by an AVX-512 VNNI loop, or by an AVX2 one as two halves).
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
//   Q5_0                as Q4_0, the low 4 bits of q | 64 bytes: per vector of q two 64-bit masks, bit
//                       4r + i the fifth bit of lane r's byte i, low nibble then high | 16 d
//                       (352 bytes: the file's)
//   Q4_K                per super-block of 256 weights a header (16 float16 d | 16 float16 dmin),
//                       then its 8 blocks: 256 bytes q as the 4-bit formats | 16 scales sc | 16 mins m
//                       (w = d sc q - dmin m: a Q4_1 block whose d sc and dmin m are exact in float32)
//   Q6_K                per super-block a header (16 float16 d), then its 8 blocks: 512 bytes q as
//                       Q8_0, each weight's q (0..63) in a byte | 16 int8 scales of weights 0..15 |
//                       16 of weights 16..31 (w = d sc (q - 32), a scale per 16 weights)
//
// so one step of K is one 64-byte load of weights and one 4-byte broadcast of x, and vpdpbusd adds
// four products to each of 16 outputs at once. An AVX2 CPU reads the same records as two halves of
// 32 bytes (outputs 0..7, then 8..15 of the group): vpmaddubsw and vpmaddwd do vpdpbusd's work in two
// steps (lanes_group_avx2, below). A group's records follow each other: a group is one
// stream of bytes, read from the start to the end (measured on a Zen 4: four groups read side by
// side got half the bandwidth one stream gets).
//
// Per output, in the order of the blocks b, with the integer sums exact:
//
//   4-bit:  acc = fma(float(sum_j q_j qx_j), d_b * dx_b, acc);  acc = fma(m_b, s_b, acc)
//           (m_b = -8 d_b for Q4_0, -16 d_b for Q5_0; d_b = d sc_b and m_b = -(dmin m_b) for Q4_K;
//           s_b = dx_b sum_j qx_j, QuantizedRow's s)
//   Q8_0:   acc = fma(float(sum_j (q_j + 128) qx_j - 128 sum_j qx_j), d_b * dx_b, acc)
//   Q6_K:   per half h of the block (16 weights): acc = fma(float(sum_j q_j qx_j - 32 sum_j qx_j),
//           (d sc_h) * dx_b, acc)
//
// The same order for every row of x, every row count and thread count, so a row's result does not
// depend on the batch; it differs from the row layout's order (a float32 rounding apart), and
// tests/kernels/test_quant_linear.py holds it to the same bound. The AVX2 loop computes the same
// integer sums and then the same float32 operations per output in the same order as the VNNI one.
// Included by quant_linear.cpp, inside its namespace, after QuantizedRow and quantize_row.

#pragma once

#if defined(PAGED_QUANT_AVX2)  // (a CPU with VNNI has AVX2 too)

constexpr int64_t LANES = 16;  // output columns per group: one float32 per lane of a 512-bit vector

// A weight in a byte (Q8_0, Q6_K), or two (the 4-bit formats; Q5_0's fifth bits apart).
constexpr bool byte_weights(int64_t type) { return type == kQ8_0 || type == kQ6_K; }

struct LaneLayout {
  int64_t groups;        // N / 16, rounded up (the missing rows of the last group are zero)
  int64_t blocks;        // K / 32
  int64_t q_bytes;       // per block record: 256 (4-bit) or 512 (a byte a weight)
  int64_t scales;        // where the record's scales start: after q (Q5_0: and its fifth bits)
  int64_t block_bytes;   // one block record: q, then its scales (see the top of this file)
  int64_t per_header;    // blocks under one header: 8 for the K-quants (a super-block), else all of them
  int64_t header_bytes;  // the K-quants' 16 d (and 16 dmin); 0 for the others
  int64_t group_bytes;

  LaneLayout(int64_t type, int64_t N, int64_t K)
      : groups((N + LANES - 1) / LANES),
        blocks(K / QK),
        q_bytes(byte_weights(type) ? 512 : 256),
        scales(q_bytes + (type == kQ5_0 ? 64 : 0)),
        block_bytes(scales + (type == kQ4_1 ? 4 * LANES : 2 * LANES)),
        per_header(type == kQ4_K || type == kQ6_K ? 8 : std::max<int64_t>(1, blocks)),
        header_bytes(type == kQ4_K ? 4 * LANES : type == kQ6_K ? 2 * LANES : 0),
        group_bytes(blocks / per_header * header_bytes + blocks * block_bytes) {}

  // Where block b's record and its header (the K-quants) start in a group. Asked once a block by the loops,
  // so without a division by a variable (a 64-bit idiv per block, as a first version of the AVX2 loop had).
  int64_t header(int64_t b) const {
    return header_bytes == 0 ? 0 : b / 8 * (header_bytes + 8 * block_bytes);  // the K-quants: per_header is 8
  }
  int64_t record(int64_t b) const {
    return header_bytes == 0 ? b * block_bytes : header(b) + header_bytes + b % 8 * block_bytes;
  }
};

// The records of one group from the row layout (K-quants: the file's super-blocks): rows[r] is row r of
// the group (nullptr past N).
inline void pack_lane_group(int64_t type, const RowLayout& RL, const LaneLayout& L, const uint8_t* const* rows,
                            uint8_t* group) {
  for (int64_t b = 0; b < L.blocks; ++b) {
    uint8_t* rec = group + L.record(b);
    uint8_t* head = group + L.header(b);
    for (int64_t r = 0; r < LANES; ++r) {
      const uint8_t* row = rows[r];
      if (row == nullptr) continue;  // the record was zeroed: weights 0, scales 0
      auto put_bytes = [&](auto q) {  // q(j): weight j of the block as the byte it is stored as
        for (int v = 0; v < 8; ++v)
          for (int i = 0; i < 4; ++i) rec[64 * v + 4 * r + i] = static_cast<uint8_t>(q(4 * v + i));
      };
      auto put_nibbles = [&](auto q) {  // q(j): weight j of the block, 0..15
        for (int v = 0; v < 4; ++v)
          for (int i = 0; i < 4; ++i)
            rec[64 * v + 4 * r + i] = static_cast<uint8_t>(q(8 * v + i) | (q(8 * v + 4 + i) << 4));
      };
      auto nibble = [&](int j) { const uint8_t byte = row[b * 16 + (j & 15)]; return j < 16 ? byte & 0xF : byte >> 4; };
      if (type == kQ4_K || type == kQ6_K) {
        const uint8_t* blk = row + b / 8 * (type == kQ4_K ? 144 : 210);  // the file's super-block
        const int sub = static_cast<int>(b % 8);
        if (type == kQ4_K) {
          put_nibbles([&](int j) { return q4k_at(blk, sub * 32 + j); });
          uint8_t sc[8], m[8];
          k_scales_mins(blk + 4, sc, m);
          rec[L.scales + r] = sc[sub];
          rec[L.scales + LANES + r] = m[sub];
          std::memcpy(head + 2 * r, blk, 2);                // d
          std::memcpy(head + 2 * LANES + 2 * r, blk + 2, 2);  // dmin
        } else {
          put_bytes([&](int j) { return q6_at(blk, sub * 32 + j); });
          rec[L.scales + r] = blk[192 + 2 * sub];              // the scale of weights 0..15
          rec[L.scales + LANES + r] = blk[192 + 2 * sub + 1];  // of weights 16..31
          std::memcpy(head + 2 * r, blk + 208, 2);              // d
        }
        continue;
      }
      if (type == kQ8_0) {
        put_bytes([&](int j) { return row[b * QK + j] ^ 0x80; });
      } else if (type == kQ5_0) {  // the nibbles as Q4_0, and bit j of qh into the masks of the bytes they went to
        put_nibbles(nibble);
        const uint32_t high = high_bits(row + RL.m_offset, b);
        for (int v = 0; v < 4; ++v)
          for (int i = 0; i < 4; ++i)
            for (int half = 0; half < 2; ++half) {  // the low nibble holds weight 8v + i, the high one 8v + 4 + i
              const uint64_t bit = (high >> (8 * v + 4 * half + i)) & 1;
              uint64_t mask;
              std::memcpy(&mask, rec + L.q_bytes + 16 * v + 8 * half, 8);
              mask |= bit << (4 * r + i);
              std::memcpy(rec + L.q_bytes + 16 * v + 8 * half, &mask, 8);
            }
      } else {
        put_nibbles(nibble);
      }
      std::memcpy(rec + L.scales + 2 * r, row + RL.d_offset + 2 * b, 2);
      if (type == kQ4_1) std::memcpy(rec + L.scales + 2 * LANES + 2 * r, row + RL.m_offset + 2 * b, 2);
    }
  }
}

// The inverse of pack_lane_group: the rows of one group back in the row layout (rows[r] nullptr past N),
// byte for byte; each row's bytes must be zero before (the row layout's padding block, if any, stays zero).
// Every bit of the row layout has its place in a record, so nothing is lost: quant_unpack_lanes.
inline void unpack_lane_group(int64_t type, const RowLayout& RL, const LaneLayout& L, const uint8_t* group,
                              uint8_t* const* rows) {
  for (int64_t b = 0; b < L.blocks; ++b) {
    const uint8_t* rec = group + L.record(b);
    const uint8_t* head = group + L.header(b);
    for (int64_t r = 0; r < LANES; ++r) {
      uint8_t* row = rows[r];
      if (row == nullptr) continue;
      auto byte_at = [&](int j) { return rec[64 * (j / 4) + 4 * r + j % 4]; };  // put_bytes' place of weight j
      auto nibble_at = [&](int j) {                                             // put_nibbles' place of weight j
        const uint8_t byte = rec[64 * (j / 8) + 4 * r + j % 4];
        return j % 8 < 4 ? byte & 0xF : byte >> 4;
      };
      if (type == kQ4_K || type == kQ6_K) {
        uint8_t* blk = row + b / 8 * (type == kQ4_K ? 144 : 210);
        const int sub = static_cast<int>(b % 8);
        if (type == kQ4_K) {
          for (int j = 0; j < 32; ++j) {  // q4k_at's byte and nibble of weight sub * 32 + j
            const int w = sub * 32 + j;
            blk[16 + (w / 64) * 32 + w % 32] |= static_cast<uint8_t>(nibble_at(j) << ((w % 64) < 32 ? 0 : 4));
          }
          // k_scales_mins backwards: sc and m of sub-blocks 0..3 in the low 6 bits of bytes 0..3 and 4..7, those
          // of 4..7 split into a low nibble in bytes 8..11 and their top two bits on top of bytes 0..7
          const uint8_t sc = rec[L.scales + r], m = rec[L.scales + LANES + r];
          uint8_t* s = blk + 4;
          if (sub < 4) {
            s[sub] |= sc, s[sub + 4] |= m;
          } else {
            s[sub - 4] |= static_cast<uint8_t>((sc >> 4) << 6), s[sub] |= static_cast<uint8_t>((m >> 4) << 6);
            s[sub + 4] |= static_cast<uint8_t>((sc & 0xF) | ((m & 0xF) << 4));
          }
          std::memcpy(blk, head + 2 * r, 2);                  // d
          std::memcpy(blk + 2, head + 2 * LANES + 2 * r, 2);  // dmin
        } else {
          for (int j = 0; j < 32; ++j) {  // q6_at's low nibble and high two bits of weight sub * 32 + j
            const int w = sub * 32 + j, h = w / 128, part = (w % 128) / 32, l = w % 32, q = byte_at(j);
            blk[h * 64 + (part & 1) * 32 + l] |= static_cast<uint8_t>((q & 0xF) << (part < 2 ? 0 : 4));
            blk[128 + h * 32 + l] |= static_cast<uint8_t>((q >> 4) << (2 * part));
          }
          blk[192 + 2 * sub] = rec[L.scales + r];
          blk[192 + 2 * sub + 1] = rec[L.scales + LANES + r];
          std::memcpy(blk + 208, head + 2 * r, 2);  // d
        }
        continue;
      }
      if (type == kQ8_0) {
        for (int j = 0; j < QK; ++j) row[b * QK + j] = static_cast<uint8_t>(byte_at(j) ^ 0x80);
      } else {  // the file's byte t holds weight t in its low nibble and t + 16 in its high one
        for (int t = 0; t < 16; ++t) row[b * 16 + t] = static_cast<uint8_t>(nibble_at(t) | (nibble_at(t + 16) << 4));
      }
      if (type == kQ5_0) {
        uint32_t high = 0;
        for (int v = 0; v < 4; ++v)
          for (int half = 0; half < 2; ++half) {
            uint64_t mask;
            std::memcpy(&mask, rec + L.q_bytes + 16 * v + 8 * half, 8);
            for (int i = 0; i < 4; ++i) high |= static_cast<uint32_t>((mask >> (4 * r + i)) & 1) << (8 * v + 4 * half + i);
          }
        std::memcpy(row + RL.m_offset + 4 * b, &high, 4);
      }
      std::memcpy(row + RL.d_offset + 2 * b, rec + L.scales + 2 * r, 2);
      if (type == kQ4_1) std::memcpy(row + RL.m_offset + 2 * b, rec + L.scales + 2 * LANES + 2 * r, 2);
    }
  }
}

#if defined(PAGED_QUANT_VNNI)
// 16 bytes of a record as 16 float32 lanes: unsigned (Q4_K's sc, m) or signed (Q6_K's scales).
inline __m512 bytes_as_floats(const uint8_t* p, bool is_signed) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm512_cvtepi32_ps(is_signed ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b));
}
inline __m512 halves_at(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// The 16 outputs of one group for R rows of x (acc[r]: lane c is output column c of the group).
// sums[r][h]: sum_j qx_j over the 16 values h of row r (two per block; the byte-weight formats only).
template <int64_t TYPE, int R>
void lanes_group(const uint8_t* group, const LaneLayout& L, const QuantizedRow* const* xs,
                 const int32_t* const* sums, __m512 (&acc)[R]) {
  const __m512i zero = _mm512_setzero_si512();
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  __m512 head_d = _mm512_setzero_ps(), head_dmin = _mm512_setzero_ps();  // the K-quants' super-block d (dmin)
  for (int64_t b = 0; b < L.blocks; ++b) {
    const uint8_t* rec = group + L.record(b);
    if constexpr (TYPE == kQ4_K || TYPE == kQ6_K) {
      if (b % 8 == 0) {
        head_d = halves_at(group + L.header(b));
        if constexpr (TYPE == kQ4_K) head_dmin = halves_at(group + L.header(b) + 2 * LANES);
      }
    }
    if constexpr (byte_weights(TYPE)) {
      __m512i w[8];
      for (int v = 0; v < 8; ++v) w[v] = _mm512_loadu_si512(rec + 64 * v);
      // the scales of weights 0..15 and 16..31 (one d for both in Q8_0)
      const __m512 d0 = TYPE == kQ6_K ? _mm512_mul_ps(head_d, bytes_as_floats(rec + L.scales, true))
                                      : halves_at(rec + L.scales);
      const __m512 d1 = TYPE == kQ6_K ? _mm512_mul_ps(head_d, bytes_as_floats(rec + L.scales + LANES, true)) : d0;
      constexpr int32_t bias = TYPE == kQ6_K ? 32 : 128;  // what the stored byte adds to the signed weight
      for (int r = 0; r < R; ++r) {
        int32_t xw[8];  // x's 32 int8 of block b, four to a word
        std::memcpy(xw, xs[r]->q + b * QK, 32);
        __m512i s0 = zero, s1 = zero, t0 = zero, t1 = zero;  // two chains a half: vpdpbusd waits for its sum
        for (int v = 0; v < 4; v += 2) {
          s0 = _mm512_dpbusd_epi32(s0, w[v], _mm512_set1_epi32(xw[v]));
          s1 = _mm512_dpbusd_epi32(s1, w[v + 1], _mm512_set1_epi32(xw[v + 1]));
          t0 = _mm512_dpbusd_epi32(t0, w[v + 4], _mm512_set1_epi32(xw[v + 4]));
          t1 = _mm512_dpbusd_epi32(t1, w[v + 5], _mm512_set1_epi32(xw[v + 5]));
        }
        const int32_t* h = sums[r] + 2 * b;
        const __m512 dx = _mm512_set1_ps(xs[r]->d[b]);
        if constexpr (TYPE == kQ6_K) {  // a scale per half
          const __m512i lo = _mm512_sub_epi32(_mm512_add_epi32(s0, s1), _mm512_set1_epi32(bias * h[0]));
          const __m512i hi = _mm512_sub_epi32(_mm512_add_epi32(t0, t1), _mm512_set1_epi32(bias * h[1]));
          acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), _mm512_mul_ps(d0, dx), acc[r]);
          acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), _mm512_mul_ps(d1, dx), acc[r]);
        } else {
          const __m512i all = _mm512_add_epi32(_mm512_add_epi32(s0, s1), _mm512_add_epi32(t0, t1));
          const __m512i s = _mm512_sub_epi32(all, _mm512_set1_epi32(bias * (h[0] + h[1])));
          acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d0, dx), acc[r]);
        }
      }
    } else {
      __m512i lo[4], hi[4];
      for (int v = 0; v < 4; ++v) {
        const __m512i w = _mm512_loadu_si512(rec + 64 * v);
        lo[v] = _mm512_and_si512(w, low4);
        hi[v] = _mm512_and_si512(_mm512_srli_epi16(w, 4), low4);
        if constexpr (TYPE == kQ5_0) {  // 16 more where the fifth bit is set
          uint64_t bits[2];
          std::memcpy(bits, rec + L.q_bytes + 16 * v, 16);
          lo[v] = _mm512_mask_add_epi8(lo[v], bits[0], lo[v], _mm512_set1_epi8(16));
          hi[v] = _mm512_mask_add_epi8(hi[v], bits[1], hi[v], _mm512_set1_epi8(16));
        }
      }
      __m512 d, m;  // w = d q + m
      if constexpr (TYPE == kQ4_K) {  // d sc and dmin m: exact products (11 by 6 significant bits)
        d = _mm512_mul_ps(head_d, bytes_as_floats(rec + L.scales, false));
        const __m512 dmin_m = _mm512_mul_ps(head_dmin, bytes_as_floats(rec + L.scales + LANES, false));
        m = _mm512_sub_ps(_mm512_setzero_ps(), dmin_m);
      } else {
        d = halves_at(rec + L.scales);
        m = TYPE == kQ4_1 ? halves_at(rec + L.scales + 2 * LANES)
                          : _mm512_mul_ps(d, _mm512_set1_ps(TYPE == kQ5_0 ? -16.0f : -8.0f));  // exact: a power of two
      }
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

#endif  // PAGED_QUANT_VNNI

// --- the AVX2 loop: each record as two halves of 8 lanes ----------------------------------------------
//
// Half h of a 64-byte vector is its bytes 32h..32h+31: outputs 8h..8h+7 of the group. Per output the
// same integer sums as lanes_group, exact, then the same float32 operations in the same order:
//   * 4-bit: vpmaddubsw multiplies a weight (0..31) by an x byte and adds neighbours: at most
//     2 * 31 * 127 = 7874 per int16; four of those added in int16 (31496) before vpmaddwd widens.
//   * Q6_K: weights 0..63: 2 * 63 * 127 = 16002, two added (32004) before widening.
//   * Q8_0: the stored byte is q + 128 (up to 255: 2 * 255 * 127 overflows int16), so the signed q is
//     taken back and multiplied as |q| times x with q's sign (at most 2 * 128 * 127 = 32512), each
//     widened alone; the sum is sum q qx, what lanes_group gets as sum (q + 128) qx - 128 sum qx.

// 8 bytes of a record as 8 float32 lanes: unsigned (Q4_K's sc, m) or signed (Q6_K's scales).
inline __m256 bytes_as_floats8(const uint8_t* p, bool is_signed) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b));
}
inline __m256 halves_at8(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
// The AVX2 loop prefetches the bytes this far ahead of the record it reads (speed only; on a Zen 3, cold,
// Q4_1 at one row went from 1.24 to 1.36 times the row layout's speed on one thread; 2048 gave no more).
constexpr int64_t LANES_PREFETCH = 1024;

// lanes_group's outputs for R rows of x: acc[r][h] holds output columns 8h..8h+7 of the group.
template <int64_t TYPE, int R>
void lanes_group_avx2(const uint8_t* group, const LaneLayout& L, const QuantizedRow* const* xs,
                      const int32_t* const* sums, __m256 (&out)[R][2]) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256 acc[R][2];  // here, not in out: the compiler keeps them in registers (through out, in memory each block)
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  __m256 head_d[2] = {}, head_dmin[2] = {};  // the K-quants' super-block d (dmin), per half
  for (int64_t b = 0; b < L.blocks; ++b) {
    const uint8_t* rec = group + L.record(b);
    for (int64_t i = 0; i < L.block_bytes; i += 64)
      _mm_prefetch(reinterpret_cast<const char*>(rec + LANES_PREFETCH + i), _MM_HINT_T0);
    if constexpr (TYPE == kQ4_K || TYPE == kQ6_K) {
      if (b % 8 == 0) {
        for (int h = 0; h < 2; ++h) {
          head_d[h] = halves_at8(group + L.header(b) + 16 * h);
          if constexpr (TYPE == kQ4_K) head_dmin[h] = halves_at8(group + L.header(b) + 2 * LANES + 16 * h);
        }
      }
    }
    int32_t xw[R][8];  // x's 32 int8 of block b, four to a word
    for (int r = 0; r < R; ++r) std::memcpy(xw[r], xs[r]->q + b * QK, 32);
    for (int h = 0; h < 2; ++h) {
      if constexpr (TYPE == kQ8_0) {
        __m256i w[8], w_abs[8];
        for (int v = 0; v < 8; ++v) {
          w[v] = _mm256_xor_si256(load32(rec + 64 * v + 32 * h), _mm256_set1_epi8(static_cast<char>(0x80)));
          w_abs[v] = _mm256_abs_epi8(w[v]);  // -128 becomes 0x80: 128 as vpmaddubsw's unsigned operand
        }
        const __m256 d = halves_at8(rec + L.scales + 16 * h);
        for (int r = 0; r < R; ++r) {
          __m256i s = _mm256_setzero_si256();
          for (int v = 0; v < 8; ++v)
            s = _mm256_add_epi32(s, dot4(w_abs[v], _mm256_sign_epi8(_mm256_set1_epi32(xw[r][v]), w[v])));
          acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d, _mm256_set1_ps(xs[r]->d[b])), acc[r][h]);
        }
      } else if constexpr (TYPE == kQ6_K) {
        __m256i w[8];
        for (int v = 0; v < 8; ++v) w[v] = load32(rec + 64 * v + 32 * h);
        const __m256 d0 = _mm256_mul_ps(head_d[h], bytes_as_floats8(rec + L.scales + 8 * h, true));
        const __m256 d1 = _mm256_mul_ps(head_d[h], bytes_as_floats8(rec + L.scales + LANES + 8 * h, true));
        for (int r = 0; r < R; ++r) {
          auto pair = [&](int v) {  // vectors v and v + 1, added in int16, widened
            return widen_pairs(_mm256_add_epi16(_mm256_maddubs_epi16(w[v], _mm256_set1_epi32(xw[r][v])),
                                                _mm256_maddubs_epi16(w[v + 1], _mm256_set1_epi32(xw[r][v + 1]))));
          };
          const int32_t* hs = sums[r] + 2 * b;
          const __m256i lo = _mm256_sub_epi32(_mm256_add_epi32(pair(0), pair(2)), _mm256_set1_epi32(32 * hs[0]));
          const __m256i hi = _mm256_sub_epi32(_mm256_add_epi32(pair(4), pair(6)), _mm256_set1_epi32(32 * hs[1]));
          const __m256 dx = _mm256_set1_ps(xs[r]->d[b]);
          acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), _mm256_mul_ps(d0, dx), acc[r][h]);
          acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi), _mm256_mul_ps(d1, dx), acc[r][h]);
        }
      } else {
        __m256i lo[4], hi[4];
        for (int v = 0; v < 4; ++v) {
          const __m256i w = load32(rec + 64 * v + 32 * h);
          lo[v] = _mm256_and_si256(w, low4);
          hi[v] = _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);
          if constexpr (TYPE == kQ5_0) {  // 16 more where the fifth bit is set: this half's 32 bits of each mask
            uint32_t bits[2];
            std::memcpy(&bits[0], rec + L.q_bytes + 16 * v + 4 * h, 4);
            std::memcpy(&bits[1], rec + L.q_bytes + 16 * v + 8 + 4 * h, 4);
            lo[v] = _mm256_or_si256(lo[v], fifth_bits(bits[0]));
            hi[v] = _mm256_or_si256(hi[v], fifth_bits(bits[1]));
          }
        }
        __m256 d, m;  // w = d q + m
        if constexpr (TYPE == kQ4_K) {
          d = _mm256_mul_ps(head_d[h], bytes_as_floats8(rec + L.scales + 8 * h, false));
          const __m256 dmin_m = _mm256_mul_ps(head_dmin[h], bytes_as_floats8(rec + L.scales + LANES + 8 * h, false));
          m = _mm256_sub_ps(_mm256_setzero_ps(), dmin_m);
        } else {
          d = halves_at8(rec + L.scales + 16 * h);
          m = TYPE == kQ4_1 ? halves_at8(rec + L.scales + 2 * LANES + 16 * h)
                            : _mm256_mul_ps(d, _mm256_set1_ps(TYPE == kQ5_0 ? -16.0f : -8.0f));
        }
        for (int r = 0; r < R; ++r) {
          __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();  // int16: low nibbles, high ones
          for (int v = 0; v < 4; ++v) {
            s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(lo[v], _mm256_set1_epi32(xw[r][2 * v])));
            s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(hi[v], _mm256_set1_epi32(xw[r][2 * v + 1])));
          }
          const __m256 f = _mm256_cvtepi32_ps(_mm256_add_epi32(widen_pairs(s0), widen_pairs(s1)));
          acc[r][h] = _mm256_fmadd_ps(f, _mm256_mul_ps(d, _mm256_set1_ps(xs[r]->d[b])), acc[r][h]);
          acc[r][h] = _mm256_fmadd_ps(m, _mm256_set1_ps(xs[r]->s[b]), acc[r][h]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) out[r][0] = acc[r][0], out[r][1] = acc[r][1];
}

// y = x W^T over the lanes layout, on torch's threads (a task: whole groups), with the VNNI loop (Isa Vnni)
// or the AVX2 one (Avx2).
template <typename Isa, typename T, int64_t TYPE>
void lanes_impl(const at::Tensor& x, const at::Tensor& lanes, int64_t N, int64_t K, at::Tensor& y,
                std::optional<int64_t> second_thread_weights) {
  const RowLayout RL(kQ8_0, K);  // x's blocks in their natural order (the padding block, if any, is never read)
  const LaneLayout L(TYPE, N, K);
  const int64_t M = x.size(0);
  T* y0 = y.data_ptr<T>();
  const uint8_t* w0 = lanes.data_ptr<uint8_t>();
  QuantizedRows xq = quantize_rows<T>(Isa{}, x, K, RL, false);  // the same bytes whichever loop rounds them
  auto row_of = [&](int64_t m) { return xq.row(m); };
  std::vector<int32_t> sums;  // the byte-weight formats: sum qx per 16 values, two a block
  if constexpr (byte_weights(TYPE)) {
    sums.resize(M * 2 * L.blocks);
    for (int64_t m = 0; m < M; ++m) {
      const int8_t* q = row_of(m).q;
      for (int64_t h = 0; h < 2 * L.blocks; ++h)
        sums[m * 2 * L.blocks + h] = std::accumulate(q + 16 * h, q + 16 * h + 16, 0);
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
        const int32_t* hs[R];
        for (int r = 0; r < R; ++r) {
          xr[r] = row_of(m + r), xs[r] = &xr[r];
          hs[r] = sums.empty() ? nullptr : sums.data() + (m + r) * 2 * L.blocks;
        }
        alignas(64) float out[R][LANES];
#if defined(PAGED_QUANT_VNNI)
        if constexpr (std::is_same_v<Isa, Vnni>) {
          __m512 acc[R];
          lanes_group<TYPE, R>(group, L, xs, hs, acc);
          for (int r = 0; r < R; ++r) _mm512_store_ps(out[r], acc[r]);
        }
#endif
        if constexpr (std::is_same_v<Isa, Avx2>) {
          __m256 acc[R][2];
          lanes_group_avx2<TYPE, R>(group, L, xs, hs, acc);
          for (int r = 0; r < R; ++r) _mm256_store_ps(out[r], acc[r][0]), _mm256_store_ps(out[r] + 8, acc[r][1]);
        }
        for (int r = 0; r < R; ++r)
          for (int64_t c = 0; c < cols; ++c) y0[(m + r) * N + n0 + c] = static_cast<T>(out[r][c]);
      };
      int64_t m = 0;
      for (; m + 2 <= M; m += 2) run(m, std::integral_constant<int, 2>{});  // a group's records read once for two rows
      if (m < M) run(m, std::integral_constant<int, 1>{});
    }
  });
}

#endif  // PAGED_QUANT_AVX2
