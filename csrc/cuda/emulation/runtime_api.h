// The host side of the CUDA runtime that ops.h and binding.cpp name, for the
// device-emulation build (PAGED_CUDA_EMULATION): error codes and a stream type.
// Launches run synchronously on the calling CPU thread, so there is no stream.
#pragma once

enum cudaError_t : int {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorLaunchFailure = 719,  // the emulation caught a deadlock or a bad warp exchange
};

struct CUstream_st;
using cudaStream_t = CUstream_st*;

// The last launch's error, cleared by the call (as on a GPU).
cudaError_t cudaGetLastError();
// For cudaErrorLaunchFailure: what went wrong, which thread block and threads.
const char* cudaGetErrorString(cudaError_t err);
