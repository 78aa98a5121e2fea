// Device emulation: what the kernels of csrc/cuda use from CUDA, for a host compiler.
//
// common.cuh includes this header instead of <cuda_runtime.h>, <cuda_fp16.h> and
// <cuda_bf16.h> when PAGED_CUDA_EMULATION is defined (paged/kernels/cuda_emulated.py
// builds that way with g++), so the SAME .cu files run on the CPU, the way nvcc's
// old device-emulation mode ran a kernel on the host:
//
//   * a launch `PAGED_LAUNCH(grid, block, stream, kernel)(args...)` runs the grid
//     thread block by thread block (several CPU threads take different thread
//     blocks); inside a thread block every CUDA thread is a fiber (its own stack),
//     and the fibers of a block take turns on one CPU thread (runtime.cpp);
//   * threadIdx / blockIdx / blockDim / gridDim are per fiber, set at each switch;
//   * `__shared__` variables are `static thread_local`: one copy per CPU thread,
//     hence shared by the fibers of the thread block it is running;
//   * __syncthreads() waits until every thread of the block has arrived; the warp
//     operations (__syncwarp, __shfl_sync, __shfl_xor_sync) wait until every lane
//     of their mask has arrived, then exchange values with CUDA's lane and width
//     rules. A fiber switches only there, so everything between two of them runs
//     as one uninterrupted step of one thread;
//   * a barrier that cannot complete (a thread exited, or waits elsewhere) fails
//     the launch with cudaErrorLaunchFailure and a message naming the threads;
//     so do lanes that disagree on the mask or the operation, and a shuffle that
//     reads a lane outside its mask (undefined on a GPU). Nothing hangs.
//   * __half / __nv_bfloat16 are 16-bit structs with round-to-nearest-even
//     conversions, bit for bit as CUDA's (and torch's) conversions.
//
// Limits: one warp-wide exchange at a time per warp (lanes of one warp shuffling
// with two disjoint masks at once are reported as a disagreement), 32-bit shuffle
// types, at most 1024 threads per block. Floating point runs without contraction
// (no fused multiply-add), so results differ from a GPU's in the last bits, within
// the tolerances the tests use for either.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "runtime_api.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static thread_local

// ---- vector and index types -------------------------------------------------
struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(8) uint2 {
  unsigned x, y;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};

extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;

inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

// ---- half and bfloat16 ------------------------------------------------------
struct __half {
  uint16_t bits;
};
struct __nv_bfloat16 {
  uint16_t bits;
};

namespace paged_emu {
inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace paged_emu

inline float __half2float(__half h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1fu, mant = h.bits & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
    const float f = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -f : f;
  }
  if (exp == 31)  // inf; a NaN keeps its payload and comes out quiet, as the hardware converts it
    return paged_emu::bits_float(sign | 0x7f800000u | (mant << 13) | (mant ? 0x00400000u : 0u));
  return paged_emu::bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline __half __float2half_rn(float f) {
  const uint32_t u = paged_emu::float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return __half{static_cast<uint16_t>(sign | 0x7e00u)};  // NaN
  if (a >= 0x477ff000u) return __half{static_cast<uint16_t>(sign | 0x7c00u)};  // rounds to inf
  if (a < 0x38800000u) {  // below 2^-14: a subnormal half, |f| * 2^24 rounded to an integer
    const float scaled = paged_emu::bits_float(a) * 16777216.0f;  // exact: a power of two
    return __half{static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(scaled)))};
  }
  // Rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even.
  const uint32_t r = a + 0xc8000fffu + ((a >> 13) & 1u);
  return __half{static_cast<uint16_t>(sign | (r >> 13))};
}

inline float __bfloat162float(__nv_bfloat16 b) { return paged_emu::bits_float(static_cast<uint32_t>(b.bits) << 16); }

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  const uint32_t u = paged_emu::float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{static_cast<uint16_t>((u >> 16) | 0x40u)};  // NaN
  return __nv_bfloat16{static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}

// ---- barriers and warp exchanges (runtime.cpp) ------------------------------
namespace paged_emu {

enum class WarpOp : int { kSyncWarp, kShfl, kShflXor };

void sync_threads();
// Every lane of `mask` arrives with `value`; returns the value of the lane that
// `op` and `arg` (a source lane, or a lane mask to xor with) select, within
// aligned segments of `width` lanes.
uint32_t warp_exchange(WarpOp op, unsigned mask, uint32_t value, int arg, int width);
// The tracer: lane 0 of each warp reports every logical KV block it attends
// (paged_attention.cuh calls it through PAGED_TRACE_VISIT; nothing on a GPU).
void trace_visit(int logical_block, int64_t physical_block);

template <typename T>
T shuffle(WarpOp op, unsigned mask, T var, int arg, int width) {
  static_assert(sizeof(T) == 4 && std::is_trivially_copyable_v<T>, "the emulation shuffles 32-bit values");
  uint32_t u;
  std::memcpy(&u, &var, 4);
  u = warp_exchange(op, mask, u, arg, width);
  T out;
  std::memcpy(&out, &u, 4);
  return out;
}

// Runs `body` once per thread of every thread block of the grid.
cudaError_t run_grid(dim3 grid, dim3 block, const std::function<void()>& body);

// The object PAGED_LAUNCH makes: called with the kernel's arguments, it converts
// them to the parameter types (as a launch does) and runs the grid.
template <typename... P>
struct Launch {
  dim3 grid, block;
  void (*kernel)(P...);
  template <typename... A>
  void operator()(A&&... args) const {
    const std::tuple<P...> params(std::forward<A>(args)...);
    const auto fn = kernel;
    run_grid(grid, block, [&params, fn] { std::apply(fn, params); });
  }
};

template <typename... P>
Launch<P...> launch(dim3 grid, dim3 block, void (*kernel)(P...)) {
  return Launch<P...>{grid, block, kernel};
}

}  // namespace paged_emu

#define PAGED_LAUNCH(grid, block, stream, ...) \
  (static_cast<void>(stream), ::paged_emu::launch(dim3(grid), dim3(block), &__VA_ARGS__))
#define PAGED_TRACE_VISIT(logical_block, physical_block) ::paged_emu::trace_visit(logical_block, physical_block)

inline void __syncthreads() { paged_emu::sync_threads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  paged_emu::warp_exchange(paged_emu::WarpOp::kSyncWarp, mask, 0u, 0, 32);
}
template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
  return paged_emu::shuffle(paged_emu::WarpOp::kShfl, mask, var, src_lane, width);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
  return paged_emu::shuffle(paged_emu::WarpOp::kShflXor, mask, var, lane_mask, width);
}
