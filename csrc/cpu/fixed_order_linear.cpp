// A dense linear layer whose every output is summed in one order fixed by K:
// y = x · wᵀ (+ bias), x [M, K], w [N, K], float32 or bfloat16.
//
// Why. In batch-invariant mode a row of x must get the same bits whatever the
// row count of the call (one sequence decoding alone, or beside 63 others, or
// inside a 256-token prompt chunk). A BLAS picks its kernel, its blocking and
// so its summation order by the shape, so a row's bits can move with M; the
// stock path pads a lone row to two (layers.gemm) because from two rows up
// the bits it saw held still. On a CPU without bfloat16 dot-product
// instructions (AVX2 only) that stock bfloat16 GEMM is also slow: about 20
// GFLOP/s at any row count, so a 256-token chunk of SmolLM2-135M took 2.7 s.
// This kernel is the other way: the order is written down, so no row count,
// tiling or thread split can change it, and it runs at the speed of the FMA
// units (prefill) or of reading the weights once (decode).
//
// The order, for one output y[m, n]:
//   lane[l] = 0                       l = 0 .. 7
//   for k0 = 0, 8, 16, ... while k0 + 8 <= K:
//       lane[l] = fma(x[m, k0 + l], w[n, k0 + l], lane[l])
//   tail: lane[l] = fma(x[m, K8 + l], w[n, K8 + l], lane[l])  for K8 + l < K
//   tree: lane[l] += lane[l + 4] (l < 4); lane[l] += lane[l + 2] (l < 2);
//         lane[0] += lane[1]
//   y[m, n] = round_to_dtype(lane[0] + bias[n])
// with every value in float32 (bfloat16 inputs widened exactly; one rounding
// per fma). The AVX2 loop keeps the 8 lanes in one register per output; the
// scalar loop (a CPU without AVX2 + FMA) does the same operations one lane at
// a time, so both give the same bits. tests/kernels/test_fixed_order_linear.py
// checks a row's bits against the same row computed alone, and the sums
// against a float64 product.
//
// Speed layout: a tile of MR = 4 rows of x times NR = 3 rows of w keeps 12
// accumulators in registers, loading each w vector once for 4 rows and each x
// vector once for 3 columns (a lone row, as in decoding, takes 8 columns at a
// time: 8 independent chains of multiply-adds); threads split the columns (a call too small to pay
// for waking a second thread stays on one); rows go in chunks of 64 so a chunk
// of x stays in L2 while w streams past it, and a tile asks for the next tile's
// rows of w while it multiplies. A bfloat16 tile of w
// met by more than one tile of rows is widened to float32 once (exactly) and
// then read as float32, instead of being widened again for every 4 rows; a
// bfloat16 tile of 4 rows alone takes its 3 columns 2 and 1 at a time (tile_rows).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#define PAGED_FIXED_AVX2 1
#include <immintrin.h>

#include "lane_tree.h"
#endif

#include "fixed_order_linear.h"

namespace paged {
namespace {

constexpr int kLanes = 8;
constexpr int kMR = 4;       // rows of x per tile
constexpr int kNR = 3;       // rows of w (output columns) per tile
constexpr int kNR1 = 8;      // rows of w per tile for a lone row of x (row_avx2; within kMR * kNR)
constexpr int64_t kMC = 64;  // rows of x per chunk
constexpr int64_t kPrefetchTiles = 1;  // a thread prefetches the tile of w this many ahead (speed only)

inline float widen(float v) { return v; }
inline float widen(c10::BFloat16 v) { return static_cast<float>(v); }

// The lanes of one output over the whole 8-wide part of K, one lane at a time.
template <typename T>
void lanes_scalar(const float* x, const T* w, int64_t K, float* lane) {
  for (int l = 0; l < kLanes; ++l) lane[l] = 0.f;
  for (int64_t k = 0; k + kLanes <= K; k += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] = std::fma(x[k + l], widen(w[k + l]), lane[l]);
}

// The tail of K past its last full group of 8, then the tree: the output's sum.
template <typename T>
float finish(float* lane, const float* x, const T* w, int64_t K) {
  const int64_t k = K - K % kLanes;
  for (int64_t l = 0; k + l < K; ++l) lane[l] = std::fma(x[k + l], widen(w[k + l]), lane[l]);
  for (int half = kLanes / 2; half > 0; half /= 2)
    for (int l = 0; l < half; ++l) lane[l] += lane[l + half];
  return lane[0];
}

#ifdef PAGED_FIXED_AVX2
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {  // bfloat16 is float32's top half: widen exactly
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// Speed only: tells the compiler that v is a register value it may not re-read from memory. Without
// it GCC folds the loads into the multiply-adds (the 12 accumulators leave 4 of AVX2's 16 registers),
// reading each w vector again for every row or each x vector again for every column: a step of K
// loads 15 or 16 vectors instead of 7, and the loop waits on the load ports, not the FMA units
// (measured on a Zen 3 core, a 4 x 3 tile over K = 576 in L2: 46 -> 86 GFLOP/s). Only where w is
// float32 (a float32 layer, or a bfloat16 tile widened for many rows): a bfloat16 w is widened in
// registers anyway, and there the hint made GCC's code slower (a lone row's LM head 1.7 -> 2.1 ms).
inline void keep_in_register(__m256& v) {
#if defined(__GNUC__)
  asm("" : "+x"(v));
#endif
}

// Speed only: two cache lines of `ahead` (a later tile of w) asked for, until its `ahead_bytes` are: called
// once per step of K, so the requests are spread over the loop rather than all made at its start.
inline void ask_ahead(const char* ahead, int64_t ahead_bytes, int64_t& asked) {
  if (asked < ahead_bytes) {
    __builtin_prefetch(ahead + asked);
    __builtin_prefetch(ahead + asked + 64);
    asked += 128;
  }
}

// x rows i times w rows j over the 8-wide part of K: where K has no tail, the finished sums
// sums[i * ld + j] (the tree taken in registers); else the 8 lanes lanes[i * ld + j], for finish.
// Speed only: `ahead` (a later tile of w) is asked for while the tile is multiplied (ask_ahead).
template <typename T, int MR, int NR>
void tile_avx2(const float* x, const T* w, int64_t K, float (*lanes)[kLanes], float* sums, int ld, const char* ahead,
               int64_t ahead_bytes) {
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  int64_t asked = 0;
  for (int64_t k = 0; k + kLanes <= K; k += kLanes) {
    ask_ahead(ahead, ahead_bytes, asked);
    __m256 wv[NR];
    for (int j = 0; j < NR; ++j) {
      wv[j] = load8(w + j * K + k);
      if constexpr (std::is_same_v<T, float>) keep_in_register(wv[j]);
    }
    for (int i = 0; i < MR; ++i) {
      __m256 xv = _mm256_loadu_ps(x + i * K + k);
      if constexpr (std::is_same_v<T, float>) keep_in_register(xv);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      if (K % kLanes == 0)
        sums[i * ld + j] = lane_tree8(acc[i][j]);  // the tree of the order above
      else
        _mm256_storeu_ps(lanes[i * ld + j], acc[i][j]);
    }
}

// One row of x times NR rows of w: tile_avx2's loop for a lone row (the same operations per output, so the
// same bits), each w vector widened and multiplied at once, so NR accumulators need NR + 2 registers.
// Speed only: an output's lanes are one chain of fused multiply-adds over K, each waiting for the last
// (4 cycles on a Zen 3), so 3 outputs at a time left the FMA units idle most of the time; 8 chains
// keep them busy.
template <typename T, int NR>
void row_avx2(const float* x, const T* w, int64_t K, float (*lanes)[kLanes], float* sums, const char* ahead,
              int64_t ahead_bytes) {
  __m256 acc[NR];
  for (int j = 0; j < NR; ++j) acc[j] = _mm256_setzero_ps();
  int64_t asked = 0;
  for (int64_t k = 0; k + kLanes <= K; k += kLanes) {
    ask_ahead(ahead, ahead_bytes, asked);
    const __m256 xv = _mm256_loadu_ps(x + k);
    for (int j = 0; j < NR; ++j) acc[j] = _mm256_fmadd_ps(xv, load8(w + j * K + k), acc[j]);
  }
  for (int j = 0; j < NR; ++j) {
    if (K % kLanes == 0)
      sums[j] = lane_tree8(acc[j]);
    else
      _mm256_storeu_ps(lanes[j], acc[j]);
  }
}

template <typename T, int MR>
void tile_rows(const float* x, const T* w, int nr, int64_t K, float (*lanes)[kLanes], float* sums, const char* ahead,
               int64_t ahead_bytes) {
  if constexpr (MR == 1) {  // a lone row: its columns 8 at a time (row_avx2), the rest 4, 2, 1
    for (int j0 = 0; j0 < nr;) {
      const T* wj = w + j0 * K;
      const char* a = j0 == 0 ? ahead : nullptr;
      const int64_t a_bytes = j0 == 0 ? ahead_bytes : 0;
      const int left = nr - j0;
      const int take = left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
      switch (take) {
        case 8: row_avx2<T, 8>(x, wj, K, lanes + j0, sums + j0, a, a_bytes); break;
        case 4: row_avx2<T, 4>(x, wj, K, lanes + j0, sums + j0, a, a_bytes); break;
        case 2: row_avx2<T, 2>(x, wj, K, lanes + j0, sums + j0, a, a_bytes); break;
        default: row_avx2<T, 1>(x, wj, K, lanes + j0, sums + j0, a, a_bytes); break;
      }
      j0 += take;
    }
    return;
  }
  // Speed only: the columns go in groups whose accumulators, w vectors and x vector fit in AVX2's 16
  // registers. A bfloat16 w widened in registers takes one more, so 4 x 3 would need 17, and GCC kept
  // an accumulator in memory (a store and a load on its chain every step of K); 4 rows take their
  // columns 2 and then 1 (an AVX2 CPU, SmolLM2's linears at 4 rows 24.8, 23.0 -> 18.7, 19.0 ms a
  // pass; docs/benchmarks.md). The first group asks for `ahead`.
  constexpr int kFit = (std::is_same_v<T, c10::BFloat16> && MR == 4) ? 2 : kNR;
  for (int j0 = 0; j0 < nr; j0 += kFit) {
    const T* wj = w + j0 * K;
    const char* a = j0 == 0 ? ahead : nullptr;
    const int64_t a_bytes = j0 == 0 ? ahead_bytes : 0;
    switch (std::min(kFit, nr - j0)) {
      case 3: tile_avx2<T, MR, 3>(x, wj, K, lanes + j0, sums + j0, nr, a, a_bytes); break;
      case 2: tile_avx2<T, MR, 2>(x, wj, K, lanes + j0, sums + j0, nr, a, a_bytes); break;
      default: tile_avx2<T, MR, 1>(x, wj, K, lanes + j0, sums + j0, nr, a, a_bytes); break;
    }
  }
}
#endif

// sums[i * nr + j] <- x row i · w row j (before bias) for an mr x nr tile, in the order above, by
// whichever loop was compiled in (the same bits); the AVX2 loop prefetches ahead_bytes of ahead.
template <typename T>
void tile_sums(const float* x, int mr, const T* w, int nr, int64_t K, float* sums, const char* ahead,
               int64_t ahead_bytes) {
  float lanes[kMR * kNR][kLanes];
#ifdef PAGED_FIXED_AVX2
  switch (mr) {
    case 4: tile_rows<T, 4>(x, w, nr, K, lanes, sums, ahead, ahead_bytes); break;
    case 3: tile_rows<T, 3>(x, w, nr, K, lanes, sums, ahead, ahead_bytes); break;
    case 2: tile_rows<T, 2>(x, w, nr, K, lanes, sums, ahead, ahead_bytes); break;
    default: tile_rows<T, 1>(x, w, nr, K, lanes, sums, ahead, ahead_bytes); break;
  }
  if (K % kLanes == 0) return;  // the tree was taken in registers
#else
  (void)ahead, (void)ahead_bytes;
  for (int i = 0; i < mr; ++i)
    for (int j = 0; j < nr; ++j) lanes_scalar(x + i * K, w + j * K, K, lanes[i * nr + j]);
#endif
  for (int i = 0; i < mr; ++i)
    for (int j = 0; j < nr; ++j) sums[i * nr + j] = finish(lanes[i * nr + j], x + i * K, w + j * K, K);
}

// Outputs n0 .. n0 + nr of x rows m0 .. m_end: w holds those nr rows of the weight (K apart), as
// stored (W = T) or widened to float32 (exact: the same products). The first tile of rows
// prefetches ahead_bytes of ahead (speed only).
template <typename W, typename T>
void rows_times_tile(const float* x, int64_t m0, int64_t m_end, const W* w, int64_t n0, int nr, int64_t N,
                     int64_t K, const T* bias, T* y, const char* ahead, int64_t ahead_bytes) {
  float sums[kMR * kNR];
  for (int64_t m = m0; m < m_end; m += kMR) {
    const int mr = static_cast<int>(std::min<int64_t>(kMR, m_end - m));
    tile_sums(x + m * K, mr, w, nr, K, sums, ahead, m == m0 ? ahead_bytes : 0);
    for (int i = 0; i < mr; ++i)
      for (int j = 0; j < nr; ++j) {
        float sum = sums[i * nr + j];
        if (bias != nullptr) sum += widen(bias[n0 + j]);
        y[(m + i) * N + n0 + j] = static_cast<T>(sum);
      }
  }
}

template <typename T>
void linear_impl(const float* x, int64_t M, const T* w, int64_t N, int64_t K, const T* bias, T* y,
                 int64_t second_thread_bytes) {
  const int nr_tile = M == 1 ? kNR1 : kNR;  // a lone row takes its columns 8 at a time (row_avx2)
  const int64_t tiles = (N + nr_tile - 1) / nr_tile;
  // A second thread only for a call of at least second_thread_bytes of work (the caller's choice,
  // layers.SECOND_THREAD_BYTES): waking a sleeping thread costs tens of microseconds, so with the
  // idle threads asleep (paged's default wait policy) that is 2 MB (an AVX2 CPU, one bfloat16 row,
  // `python -m paged.bench linear_kernel --rows 1 --threads 1|2`: 576 x 576 took 0.033 ms on one
  // thread, 0.092 on two); where they spin, a much smaller call gains from the second thread.
  // A tile's work is the bytes of w it reads or half its multiply-adds, whichever is more, so a
  // few rows count little more than one: w is read once for all of them. Set by measuring (the
  // same AVX2 CPU, SmolLM2 in bfloat16 decoding 4 sequences: 92.1, 90.3 -> 96.5, 94.9 tokens/s
  // against counting every multiply-add as a byte of w; docs/benchmarks.md).
  const int64_t tile_work = std::max<int64_t>(nr_tile * K * static_cast<int64_t>(sizeof(T)), M * K * nr_tile / 2);
  const int64_t grain = std::max<int64_t>(1, second_thread_bytes / std::max<int64_t>(1, tile_work));
  at::parallel_for(0, tiles, grain, [&](int64_t t0, int64_t t1) {
    std::vector<float> wide;  // a bfloat16 tile's w rows widened once for a chunk of many x rows
    for (int64_t m0 = 0; m0 < M; m0 += kMC) {
      const int64_t m_end = std::min(M, m0 + kMC);
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t n0 = t * nr_tile;
        const int nr = static_cast<int>(std::min<int64_t>(nr_tile, N - n0));
        // a later tile's rows of w, asked for while this one is multiplied: memory answers late
        const bool later = t + kPrefetchTiles < t1;
        const char* ahead = later ? reinterpret_cast<const char*>(w + (n0 + kPrefetchTiles * nr_tile) * K) : nullptr;
        const int64_t ahead_bytes = later ? nr_tile * K * static_cast<int64_t>(sizeof(T)) : 0;
        if (std::is_same_v<T, c10::BFloat16> && m_end - m0 > kMR) {  // w read by several tiles of x rows
          wide.resize(static_cast<size_t>(nr * K));
          for (int64_t i = 0; i < nr * K; ++i) wide[i] = widen(w[n0 * K + i]);
          rows_times_tile(x, m0, m_end, wide.data(), n0, nr, N, K, bias, y, ahead, ahead_bytes);
        } else {
          rows_times_tile(x, m0, m_end, w + n0 * K, n0, nr, N, K, bias, y, ahead, ahead_bytes);
        }
      }
    }
  });
}

}  // namespace

at::Tensor fixed_order_linear(const at::Tensor& x_in, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                              int64_t second_thread_bytes) {
  TORCH_CHECK_VALUE(x_in.device().is_cpu() && w.device().is_cpu(), "x and w must be on the CPU, got ",
                    x_in.device(), " and ", w.device());
  TORCH_CHECK_TYPE(x_in.scalar_type() == at::kFloat || x_in.scalar_type() == at::kBFloat16,
                   "x must be float32 or bfloat16, got ", x_in.scalar_type());
  TORCH_CHECK_TYPE(w.scalar_type() == x_in.scalar_type(), "w must have x's dtype ", x_in.scalar_type(), ", got ",
                   w.scalar_type());
  TORCH_CHECK_VALUE(x_in.dim() == 2 && w.dim() == 2 && x_in.size(1) == w.size(1),
                    "x must be [M, K] and w [N, K] with the same K, got shapes ", x_in.sizes(), " and ", w.sizes());
  TORCH_CHECK_VALUE(w.is_contiguous(), "w must be contiguous, got strides ", w.strides());
  const int64_t M = x_in.size(0), K = x_in.size(1), N = w.size(0);
  if (bias.has_value()) {
    TORCH_CHECK_TYPE(bias->scalar_type() == x_in.scalar_type(), "bias must have x's dtype ", x_in.scalar_type(),
                     ", got ", bias->scalar_type());
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == N && bias->is_contiguous() && bias->device().is_cpu(),
                      "bias must be a contiguous CPU [", N, "], got shape ", bias->sizes());
  }
  at::Tensor y = at::empty({M, N}, x_in.options());
  if (M == 0 || N == 0) return y;
  const at::Tensor x = x_in.contiguous();
  if (x.scalar_type() == at::kFloat) {
    linear_impl<float>(x.data_ptr<float>(), M, w.data_ptr<float>(), N, K,
                       bias.has_value() ? bias->data_ptr<float>() : nullptr, y.data_ptr<float>(), second_thread_bytes);
  } else {
    std::vector<float> xf(static_cast<size_t>(M * K));  // x widened once (exact), read by every tile
    const c10::BFloat16* xb = x.data_ptr<c10::BFloat16>();
    at::parallel_for(0, M, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0 * K; i < r1 * K; ++i) xf[i] = static_cast<float>(xb[i]);
    });
    linear_impl<c10::BFloat16>(xf.data(), M, w.data_ptr<c10::BFloat16>(), N, K,
                               bias.has_value() ? bias->data_ptr<c10::BFloat16>() : nullptr,
                               y.data_ptr<c10::BFloat16>(), second_thread_bytes);
  }
  return y;
}

bool fixed_order_avx2_compiled() {
#ifdef PAGED_FIXED_AVX2
  return true;
#else
  return false;
#endif
}

}  // namespace paged
