// Device helpers shared by the CUDA kernels: block reductions and BlockLanes, the thread block as the
// `Lanes` of the row programs in quant_math.h (the arithmetic itself lives there, shared with the CPU), and
// the launch geometry every family's kernels use.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kvstats {
namespace cuda {

// Sum of `v` over the thread block; every thread gets the result. `scratch` holds 32 values.
template <typename acc_t>
__device__ __forceinline__ acc_t block_sum(acc_t v, acc_t* scratch) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  acc_t total = 0;
  for (int w = 0; w < warps; ++w) total += scratch[w];
  return total;
}

// Maximum of `v` over the thread block; every thread gets the result. `scratch` holds 32 values.
template <typename acc_t>
__device__ __forceinline__ acc_t block_max(acc_t v, acc_t* scratch) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const acc_t o = __shfl_down_sync(0xffffffffu, v, offset);
    v = o > v ? o : v;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  acc_t m = scratch[0];
  for (int w = 1; w < warps; ++w) m = scratch[w] > m ? scratch[w] : m;
  return m;
}

// The threads of one block cooperating on one row (blockDim.x a multiple of 32); scratch: 32 values
// of acc_t in shared memory for the reductions.
template <typename acc_t>
struct BlockLanes {
  acc_t* scratch;
  __device__ int64_t id() const { return threadIdx.x; }
  __device__ int64_t count() const { return blockDim.x; }
  __device__ void sync() const { __syncthreads(); }
  __device__ acc_t sum(acc_t v) const { return block_sum(v, scratch); }
  __device__ acc_t max(acc_t v) const { return block_max(v, scratch); }
};

// Threads per block for rows of d values: a power of two in [32, 512], about d/2 (one butterfly each).
inline int threads_for(int64_t d) {
  int64_t t = 32;
  while (t < d / 2 && t < 512) t <<= 1;
  return static_cast<int>(t);
}

// Threads per block of the one-thread-per-item kernels (keys, bytes, groups, elements).
constexpr int kThreads = 256;
// Rows per chunk where a scratch residual or projection is needed (turbo_prod and qjl encode).
constexpr int64_t kChunkRows = 65536;

inline unsigned int blocks_for(int64_t n, int threads = kThreads) {
  return static_cast<unsigned int>((n + threads - 1) / threads);
}

// Lets `kernel` take `smem` bytes of dynamic shared memory where that is above the default 48 KiB.
inline void ensure_smem(const void* kernel, size_t smem) {
  if (smem > 48 * 1024)
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
}

}  // namespace cuda
}  // namespace kvstats
