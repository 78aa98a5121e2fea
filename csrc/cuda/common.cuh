// Device helpers shared by the kernels of csrc/cuda: element conversions,
// vectorised loads, warp reductions and the compile-time dispatch over dtypes.
//
// The device-emulation build (PAGED_CUDA_EMULATION, a host compiler; see
// emulation/emulation.h) compiles these same files for the CPU: it supplies what
// CUDA's headers would, and its own PAGED_LAUNCH and PAGED_TRACE_VISIT.
#pragma once

#ifdef PAGED_CUDA_EMULATION
#include "emulation/emulation.h"
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

// A kernel launch, kernel<<<grid, block, 0, stream>>>(args...), written so a host
// compiler can read it too (the kernel comes last: its template arguments hold commas).
#define PAGED_LAUNCH(grid, block, stream, ...) __VA_ARGS__<<<grid, block, 0, stream>>>
// The emulation's tracer records which logical block each warp visits; nothing here.
#define PAGED_TRACE_VISIT(logical_block, physical_block) static_cast<void>(0)
#endif

#include <cstdint>
#include <type_traits>

#include "ops.h"

namespace paged_cuda {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// An unsigned word of exactly `Bytes` bytes: one load instruction of that width.
template <int Bytes> struct Word;
template <> struct Word<1> { using type = uint8_t; };
template <> struct Word<2> { using type = uint16_t; };
template <> struct Word<4> { using type = uint32_t; };
template <> struct Word<8> { using type = uint2; };
template <> struct Word<16> { using type = uint4; };

// Load N consecutive elements with one N * sizeof(T)-byte load (the address must
// be aligned to that size) and widen them to float.
template <typename T, int N>
__device__ __forceinline__ void load_as_float(const T* __restrict__ p, float (&out)[N]) {
  using W = typename Word<N * static_cast<int>(sizeof(T))>::type;
  const W w = *reinterpret_cast<const W*>(p);
  const T* e = reinterpret_cast<const T*>(&w);
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = to_float(e[i]);
}

// Sum over aligned groups of WIDTH lanes (a power of two <= 32); every lane of a
// group gets its group's total.
template <int WIDTH>
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int offset = WIDTH / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(kFullMask, x, offset);
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    x = fmaxf(x, __shfl_xor_sync(kFullMask, x, offset));
  return x;
}

constexpr int pow2_floor(int x) { return x >= 2 ? 2 * pow2_floor(x / 2) : 1; }
constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Compile-time dispatch: call f(TypeTag<T>{}) with the element type of `dtype`.
template <typename T> struct TypeTag { using type = T; };

template <typename F>
cudaError_t dispatch_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32: return f(TypeTag<float>{});
    case DType::kFloat16: return f(TypeTag<__half>{});
    case DType::kBFloat16: return f(TypeTag<__nv_bfloat16>{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace paged_cuda
