// Small kernels that probe the CUDA device emulation (csrc/cuda/emulation), for
// tests/kernels/test_cuda_emulation.py: barriers, divergence, warp
// shuffles and the half / bfloat16 conversions. Built there with the host
// compiler, without torch, and called through ctypes.
#include <cstring>

#include "emulation/emulation.h"

namespace {

// Thread t writes t to shared memory, waits, reads its right neighbour's slot:
// right only if the barrier orders the writes before the reads, per thread block.
__global__ void neighbour_kernel(int* out) {
  __shared__ int slots[1024];
  const int t = static_cast<int>(threadIdx.x), n = static_cast<int>(blockDim.x);
  slots[t] = t + 1000 * static_cast<int>(blockIdx.x);
  __syncthreads();
  out[blockIdx.x * blockDim.x + t] = slots[(t + 1) % n];
}

// Threads from `first_exit` on return before a barrier the others wait at.
__global__ void divergent_barrier_kernel(int first_exit) {
  if (static_cast<int>(threadIdx.x) >= first_exit) return;
  __syncthreads();
}

// Lane `missing` returns before a full-mask shuffle.
__global__ void missing_lane_kernel(int missing) {
  if (static_cast<int>(threadIdx.x) == missing) return;
  __shfl_xor_sync(0xffffffffu, 1.f, 1);
}

// Even lanes shuffle while odd lanes wait at __syncwarp: they disagree.
__global__ void mismatched_ops_kernel() {
  if (threadIdx.x % 2 == 0) __shfl_sync(0xffffffffu, 1.f, 0);
  else __syncwarp();
}

__global__ void shfl_xor_kernel(int* out, int lane_mask, int width) {
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<int>(threadIdx.x), lane_mask, width);
}

__global__ void shfl_kernel(int* out, int src_lane, int width) {
  out[threadIdx.x] = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x), src_lane, width);
}

void copy_error(cudaError_t err, char* msg, int len) {
  std::strncpy(msg, cudaGetErrorString(err), static_cast<size_t>(len) - 1);
  msg[len - 1] = '\0';
}

}  // namespace

extern "C" {

int probe_neighbours(int* out, int blocks, int threads) {
  PAGED_LAUNCH(static_cast<unsigned>(blocks), static_cast<unsigned>(threads), nullptr, neighbour_kernel)(out);
  return cudaGetLastError();
}

int probe_divergent_barrier(int threads, int first_exit, char* msg, int len) {
  PAGED_LAUNCH(1, static_cast<unsigned>(threads), nullptr, divergent_barrier_kernel)(first_exit);
  const cudaError_t err = cudaGetLastError();
  copy_error(err, msg, len);
  return err;
}

int probe_missing_lane(int missing, char* msg, int len) {
  PAGED_LAUNCH(1, 32, nullptr, missing_lane_kernel)(missing);
  const cudaError_t err = cudaGetLastError();
  copy_error(err, msg, len);
  return err;
}

int probe_mismatched_ops(char* msg, int len) {
  PAGED_LAUNCH(1, 32, nullptr, mismatched_ops_kernel)();
  const cudaError_t err = cudaGetLastError();
  copy_error(err, msg, len);
  return err;
}

int probe_shfl_xor(int* out, int lane_mask, int width) {
  PAGED_LAUNCH(1, 32, nullptr, shfl_xor_kernel)(out, lane_mask, width);
  return cudaGetLastError();
}

int probe_shfl(int* out, int src_lane, int width) {
  PAGED_LAUNCH(1, 32, nullptr, shfl_kernel)(out, src_lane, width);
  return cudaGetLastError();
}

void half_to_float(const uint16_t* in, float* out, int n) {
  for (int i = 0; i < n; ++i) out[i] = __half2float(__half{in[i]});
}
void float_to_half(const float* in, uint16_t* out, int n) {
  for (int i = 0; i < n; ++i) out[i] = __float2half_rn(in[i]).bits;
}
void bfloat16_to_float(const uint16_t* in, float* out, int n) {
  for (int i = 0; i < n; ++i) out[i] = __bfloat162float(__nv_bfloat16{in[i]});
}
void float_to_bfloat16(const float* in, uint16_t* out, int n) {
  for (int i = 0; i < n; ++i) out[i] = __float2bfloat16_rn(in[i]).bits;
}

}  // extern "C"
