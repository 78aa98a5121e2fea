// A bfloat16 linear layer whose every output is summed in one order fixed by K, on a CPU with
// bfloat16 dot-product instructions (AVX512_BF16: AMD Zen 4 and 5, Intel Sapphire Rapids and later):
// y = x · wᵀ (+ bias), x [M, K], w [N, K], all bfloat16.
//
// Why a second fixed-order linear. fixed_order_linear.cpp widens bfloat16 to float32 and multiplies
// with float32 FMAs, the fastest there is on an AVX2-only CPU. A CPU with AVX512_BF16 multiplies
// bfloat16 pairs straight into float32 sums (VDPBF16PS: 32 products per instruction), as its oneDNN
// GEMM does, at about 2.5 times the float32 loop's speed from 64 rows up; but that GEMM, like any
// BLAS, picks its kernel by the row count, so batch-invariant mode pads a lone row to two, and a
// one-row decode step pays for a GEMM of two. This kernel uses the same instruction in an order
// written down, so a row gets the same bits at every row count and needs no padding.
//
// The order ("pair order"), for one output y[m, n]: one running float32 sum over K, a pair of
// positions at a time, the odd position first (x[m, K] = w[n, K] = 0 when K is odd):
//   s = 0
//   for p = 0, 1, ..., ceil(K / 2) - 1:
//       s = s + x[m, 2p + 1] · w[n, 2p + 1]
//       s = s + x[m, 2p]     · w[n, 2p]
//   y[m, n] = round_to_bfloat16(s + bias[n])
// each addition rounded once to nearest even (a product of two bfloat16 values is exact in float32);
// in the loop a bfloat16 input below float32's normal range counts as 0 and a sum that lands there
// becomes 0. The two lines of the loop are one lane of one VDPBF16PS as Intel's manual defines it;
// tests/kernels/test_pair_order_linear.py replays the order in torch and checks the kernel's bits
// against it, and a row's bits alone against the same row among others.
//
// The layout: each lane of a vector is one output column, so w is read as pairs of K for 16 columns
// side by side, [ceil(N / 16)][ceil(K / 2)][16 columns][2], which pair_order_pack writes once when
// serving starts (zeros past N and K); a step of K is then one contiguous 64-byte load of w per 16
// columns, and x's pair is one 4-byte value broadcast to every lane. No lanes to add up at the end.
//
// Speed layout: a tile of MR = 6 rows of x times NV = 4 vectors (64 columns) keeps 24 accumulators
// (32 registers leave room for the 4 w vectors and a broadcast x pair); threads split the column
// blocks; each thread multiplies every row by one block of w before the next, so the block (64
// columns x K) stays in L2 while the rows pass, and packed w streams from memory once.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "fixed_order_linear.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
#define PAGED_PAIRS_AVX512 1
#include <immintrin.h>
#endif

namespace paged {
namespace {

constexpr int64_t kCols = 16;  // output columns per vector (one per float32 lane)
constexpr int kMR = 6;         // rows of x per tile
constexpr int kNV = 4;         // vectors of 16 columns per tile

int64_t pairs_of(int64_t K) { return (K + 1) / 2; }

#ifdef PAGED_PAIRS_AVX512
// x's pair p (positions 2p, 2p + 1) in every lane.
inline __m512bh pair_broadcast(const c10::BFloat16* x, int64_t p) {
  uint32_t bits;
  std::memcpy(&bits, x + 2 * p, 4);
  return (__m512bh)_mm512_set1_epi32(static_cast<int>(bits));
}

// The last pair of an odd K: x[K - 1] and a 0 at position K.
inline __m512bh last_broadcast(const c10::BFloat16* x, int64_t K) {
  uint16_t bits;
  std::memcpy(&bits, x + K - 1, 2);
  return (__m512bh)_mm512_set1_epi32(static_cast<int>(bits));
}

// sums[i * 16 * nv + c] <- x row i (rows K apart) · column c of the nv packed vectors at w (packed
// blocks `block` apart), over the pairs of K in the order above.
template <int MR, int NV>
void tile(const c10::BFloat16* x, int64_t K, const c10::BFloat16* w, int64_t block, float* sums) {
  __m512 acc[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_setzero_ps();
  const int64_t pairs = pairs_of(K);
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh wv[NV];
    for (int v = 0; v < NV; ++v) wv[v] = (__m512bh)_mm512_loadu_si512(w + v * block + p * 2 * kCols);
    const bool last_of_odd = 2 * p + 1 == K;
    for (int i = 0; i < MR; ++i) {
      const __m512bh xp = last_of_odd ? last_broadcast(x + i * K, K) : pair_broadcast(x + i * K, p);
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], xp, wv[v]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(sums + (i * NV + v) * kCols, acc[i][v]);
}

template <int MR>
void tile_vectors(const c10::BFloat16* x, int64_t K, const c10::BFloat16* w, int64_t block, int nv, float* sums) {
  switch (nv) {
    case 4: tile<MR, 4>(x, K, w, block, sums); break;
    case 3: tile<MR, 3>(x, K, w, block, sums); break;
    case 2: tile<MR, 2>(x, K, w, block, sums); break;
    default: tile<MR, 1>(x, K, w, block, sums); break;
  }
}

void tile_sums(const c10::BFloat16* x, int mr, int64_t K, const c10::BFloat16* w, int64_t block, int nv,
               float* sums) {
  switch (mr) {
    case 6: tile_vectors<6>(x, K, w, block, nv, sums); break;
    case 5: tile_vectors<5>(x, K, w, block, nv, sums); break;
    case 4: tile_vectors<4>(x, K, w, block, nv, sums); break;
    case 3: tile_vectors<3>(x, K, w, block, nv, sums); break;
    case 2: tile_vectors<2>(x, K, w, block, nv, sums); break;
    default: tile_vectors<1>(x, K, w, block, nv, sums); break;
  }
}

void linear_pairs(const c10::BFloat16* x, int64_t M, const c10::BFloat16* packed, int64_t N, int64_t K,
                  const c10::BFloat16* bias, c10::BFloat16* y, int64_t second_thread_bytes) {
  const int64_t block = pairs_of(K) * 2 * kCols;   // one packed vector of 16 columns: all of K
  const int64_t vectors = (N + kCols - 1) / kCols;
  const int64_t tiles = (vectors + kNV - 1) / kNV;
  // A second thread from second_thread_bytes of work, a tile's work counted as in fixed_order_linear.cpp
  // (the bytes of w it reads or half its multiply-adds, whichever is more). Speed only.
  const int64_t tile_work = std::max<int64_t>(kNV * block * 2, M * K * kNV * kCols / 2);
  const int64_t grain = std::max<int64_t>(1, second_thread_bytes / std::max<int64_t>(1, tile_work));
  at::parallel_for(0, tiles, grain, [&](int64_t t0, int64_t t1) {
    float sums[kMR * kNV * kCols];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t v0 = t * kNV;
      const int nv = static_cast<int>(std::min<int64_t>(kNV, vectors - v0));
      const int64_t n0 = v0 * kCols;
      const int64_t cols = std::min<int64_t>(nv * kCols, N - n0);
      for (int64_t m = 0; m < M; m += kMR) {
        const int mr = static_cast<int>(std::min<int64_t>(kMR, M - m));
        tile_sums(x + m * K, mr, K, packed + v0 * block, block, nv, sums);
        for (int i = 0; i < mr; ++i)
          for (int64_t c = 0; c < cols; ++c) {
            float sum = sums[i * nv * kCols + c];
            if (bias != nullptr) sum += static_cast<float>(bias[n0 + c]);
            y[(m + i) * N + n0 + c] = static_cast<c10::BFloat16>(sum);
          }
      }
    }
  });
}
#endif

}  // namespace

at::Tensor pair_order_pack(const at::Tensor& w) {
  TORCH_CHECK_VALUE(w.device().is_cpu() && w.dim() == 2, "w must be a CPU [N, K] tensor, got ", w.sizes(), " on ",
                    w.device());
  TORCH_CHECK_TYPE(w.scalar_type() == at::kBFloat16, "w must be bfloat16, got ", w.scalar_type());
  const int64_t N = w.size(0), K = w.size(1), pairs = pairs_of(K);
  const int64_t vectors = (N + kCols - 1) / kCols;
  at::Tensor packed = at::zeros({vectors, pairs, kCols, 2}, w.options());
  const at::Tensor src = w.contiguous();
  const c10::BFloat16* s = src.data_ptr<c10::BFloat16>();
  c10::BFloat16* d = packed.data_ptr<c10::BFloat16>();
  at::parallel_for(0, vectors, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t c = 0; c < kCols && b * kCols + c < N; ++c)
        for (int64_t k = 0; k < K; ++k) d[((b * pairs + k / 2) * kCols + c) * 2 + k % 2] = s[(b * kCols + c) * K + k];
  });
  return packed;
}

at::Tensor pair_order_linear(const at::Tensor& x_in, const at::Tensor& packed, int64_t N,
                             const std::optional<at::Tensor>& bias, int64_t second_thread_bytes) {
  TORCH_CHECK(pair_order_compiled(), "pair_order_linear: this build has no AVX512_BF16 loop (the CPU that built it "
              "lacks AVX512_BF16); use fixed_order_linear");
  TORCH_CHECK_TYPE(x_in.scalar_type() == at::kBFloat16 && packed.scalar_type() == at::kBFloat16,
                   "x and packed w must be bfloat16, got ", x_in.scalar_type(), " and ", packed.scalar_type());
  TORCH_CHECK_VALUE(x_in.device().is_cpu() && packed.device().is_cpu() && x_in.dim() == 2, "x must be a CPU [M, K] "
                    "tensor, got ", x_in.sizes(), " on ", x_in.device());
  const int64_t M = x_in.size(0), K = x_in.size(1);
  TORCH_CHECK_VALUE(N >= 0 && packed.is_contiguous() && packed.dim() == 4 && packed.size(0) == (N + kCols - 1) / kCols &&
                    packed.size(1) == pairs_of(K) && packed.size(2) == kCols && packed.size(3) == 2,
                    "packed w must be pair_order_pack's [ceil(N/16), ceil(K/2), 16, 2] for N = ", N, " and x's K = ", K,
                    ", got shape ", packed.sizes());
  if (bias.has_value()) {
    TORCH_CHECK_TYPE(bias->scalar_type() == at::kBFloat16, "bias must be bfloat16, got ", bias->scalar_type());
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == N && bias->is_contiguous() && bias->device().is_cpu(),
                      "bias must be a contiguous CPU [", N, "], got shape ", bias->sizes());
  }
  at::Tensor y = at::empty({M, N}, x_in.options());
  if (M == 0 || N == 0) return y;
#ifdef PAGED_PAIRS_AVX512
  const at::Tensor x = x_in.contiguous();
  linear_pairs(x.data_ptr<c10::BFloat16>(), M, packed.data_ptr<c10::BFloat16>(), N, K,
               bias.has_value() ? bias->data_ptr<c10::BFloat16>() : nullptr, y.data_ptr<c10::BFloat16>(),
               second_thread_bytes);
#else
  (void)second_thread_bytes;
#endif
  return y;
}

bool pair_order_compiled() {
#ifdef PAGED_PAIRS_AVX512
  return true;
#else
  return false;
#endif
}

}  // namespace paged
