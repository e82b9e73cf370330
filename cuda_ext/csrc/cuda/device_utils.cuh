// Device helpers shared by the CUDA kernels: block reductions and the randomized-Hadamard rotation of a
// vector staged in shared memory (the same operations, in the same order, as the CPU kernels).
#pragma once

#include <cuda_runtime.h>

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

// Unnormalised Sylvester–Hadamard transform of buf[0..n) in shared memory, n a power of two.
template <typename acc_t>
__device__ __forceinline__ void smem_butterfly(acc_t* buf, int64_t n) {
  const int64_t half = n >> 1;
  for (int64_t h = 1; h < n; h <<= 1) {
    for (int64_t p = threadIdx.x; p < half; p += blockDim.x) {
      const int64_t i = (p / h) * 2 * h + (p % h);
      const acc_t a = buf[i];
      const acc_t b = buf[i + h];
      buf[i] = a + b;
      buf[i + h] = a - b;
    }
    __syncthreads();
  }
}

// Randomized Hadamard rotation (kvstats.rotations.RandomizedHadamard) of buf[0..d) in shared memory:
// `passes` (0, 1, 3) of signs, butterflies, scale 1/sqrt(block), over blocks at 0, d - block, 0.
template <typename acc_t>
__device__ void smem_rotate_forward(acc_t* buf, int64_t d, const acc_t* signs, int64_t passes, int64_t block) {
  const acc_t scale = acc_t(1) / sqrt(static_cast<acc_t>(block));
  for (int64_t k = 0; k < passes; ++k) {
    acc_t* span = buf + (k == 1 ? d - block : 0);
    const acc_t* s = signs + k * block;
    for (int64_t j = threadIdx.x; j < block; j += blockDim.x) span[j] *= s[j];
    __syncthreads();
    smem_butterfly(span, block);
    for (int64_t j = threadIdx.x; j < block; j += blockDim.x) span[j] *= scale;
    __syncthreads();
  }
}

template <typename acc_t>
__device__ void smem_rotate_inverse(acc_t* buf, int64_t d, const acc_t* signs, int64_t passes, int64_t block) {
  const acc_t scale = acc_t(1) / sqrt(static_cast<acc_t>(block));
  for (int64_t k = passes - 1; k >= 0; --k) {
    acc_t* span = buf + (k == 1 ? d - block : 0);
    const acc_t* s = signs + k * block;
    smem_butterfly(span, block);
    for (int64_t j = threadIdx.x; j < block; j += blockDim.x) span[j] = span[j] * scale * s[j];
    __syncthreads();
  }
}

inline int threads_for(int64_t d) {
  int64_t t = 32;
  while (t < d / 2 && t < 512) t <<= 1;
  return static_cast<int>(t);
}

}  // namespace cuda
}  // namespace kvstats
