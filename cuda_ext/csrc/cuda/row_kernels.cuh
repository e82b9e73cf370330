// The CUDA kernels that several op families launch, with their host launchers: the Lloyd–Max encode (lloyd,
// turbo_prod), the scores (lloyd, qjl, turbo_prod), the weighted sums (lloyd, qjl, minmax), the QJL per-key
// weights and the sign packing (qjl, turbo_prod), the code packing (pack, minmax). The arithmetic is
// quant_math.h's; this header maps it to threads and blocks. Each family's ops are in cuda/<family>_cuda.cu.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "../bitpack.h"
#include "../quant_math.h"
#include "device_utils.cuh"

namespace kvstats {
namespace cuda {

// ----------------------------------------------------------------------------------------- Lloyd encode
// One block per row: math::encode_params_row. Shared memory: d accumulators, 32 reduction slots, d codes.
template <typename scalar_t, typename acc_t>
__global__ void lloyd_encode_kernel(const math::LloydEncodeParams<scalar_t, acc_t> p) {
  extern __shared__ unsigned char smem_raw[];
  acc_t* buf = reinterpret_cast<acc_t*>(smem_raw);
  acc_t* scratch = buf + p.d;
  uint8_t* codes = reinterpret_cast<uint8_t*>(scratch + 32);
  math::encode_params_row(p, static_cast<int64_t>(blockIdx.x), buf, codes, BlockLanes<acc_t>{scratch});
}

inline size_t encode_smem(int64_t d, size_t acc_size) { return (d + 32) * acc_size + d; }

// Launches the encode kernel over rows [0, p.n) of p.
template <typename scalar_t, typename acc_t>
void launch_encode(const math::LloydEncodeParams<scalar_t, acc_t>& p, cudaStream_t stream) {
  const size_t smem = encode_smem(p.d, sizeof(acc_t));
  auto kernel = lloyd_encode_kernel<scalar_t, acc_t>;
  ensure_smem(reinterpret_cast<const void*>(kernel), smem);
  kernel<<<static_cast<unsigned int>(p.n), threads_for(p.d), smem, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// ------------------------------------------------------------------------------------------------ scores
// Grid (ceil(n_k / kThreads), n_q, G); one thread per key: math::score_one. The query (and its sketch)
// and the codebook levels are staged in shared memory.
template <typename acc_t>
__global__ void scores_kernel(const math::ScoreParams<acc_t> p) {
  extern __shared__ unsigned char smem_raw[];
  acc_t* sq = reinterpret_cast<acc_t*>(smem_raw);
  acc_t* slv = sq + (p.codes ? p.d : 0);
  acc_t* sqs = slv + (p.codes ? (int64_t{1} << p.bits) : 0);
  const int64_t g = blockIdx.z, i = blockIdx.y;
  if (p.codes) {
    for (int64_t t = threadIdx.x; t < p.d; t += blockDim.x) sq[t] = p.q[(g * p.nq + i) * p.d + t];
    for (int64_t t = threadIdx.x; t < (int64_t{1} << p.bits); t += blockDim.x) slv[t] = p.levels[t];
  }
  if (p.signs)
    for (int64_t t = threadIdx.x; t < p.m; t += blockDim.x) sqs[t] = p.qs[(g * p.nq + i) * p.m + t];
  __syncthreads();
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= p.nk) return;
  math::ScoreParams<acc_t> staged = p;
  staged.levels = slv;
  p.out[(g * p.nq + i) * p.nk + j] = math::score_one(staged, sq, sqs, g, j);
}

template <typename acc_t>
void launch_scores(const math::ScoreParams<acc_t>& p) {
  TORCH_CHECK_VALUE(p.G <= 65535 && p.nq <= 65535, "scores: G and n_q must be at most 65535 on CUDA, got ", p.G,
                    ", ", p.nq);
  const size_t smem = ((p.codes ? p.d + (int64_t{1} << p.bits) : 0) + (p.signs ? p.m : 0)) * sizeof(acc_t);
  auto kernel = scores_kernel<acc_t>;
  ensure_smem(reinterpret_cast<const void*>(kernel), smem);
  const dim3 grid(blocks_for(p.nk), static_cast<unsigned int>(p.nq), static_cast<unsigned int>(p.G));
  kernel<<<grid, kThreads, smem, at::cuda::getCurrentCUDAStream()>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// w = scale · norm per key (math::qjl_key_weight), in dtype.
template <typename acc_t>
__global__ void qjl_weights_kernel(const acc_t* __restrict__ norm, int64_t n, acc_t scale, acc_t* __restrict__ w) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t < n) w[t] = math::qjl_key_weight(norm[t], scale);
}

// The per-key weights of a sign part (KeyWeightsFn, prologue/qjl.h): run by the prologue, so it takes its own
// device guard (norm's device: the op's, once the checks passed).
inline at::Tensor qjl_weights(const at::Tensor& norm, at::ScalarType dtype, double scale) {
  const c10::cuda::CUDAGuard guard(norm.device());
  const at::Tensor nc = norm.to(dtype).contiguous();
  at::Tensor w = at::empty_like(nc);
  if (nc.numel() == 0) return w;
  AT_DISPATCH_FLOATING_TYPES(dtype, "qjl_weights_cuda", [&] {
    qjl_weights_kernel<scalar_t><<<blocks_for(nc.numel()), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        nc.const_data_ptr<scalar_t>(), nc.numel(), static_cast<scalar_t>(scale), w.mutable_data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return w;
}

// ----------------------------------------------------------------------------------------- weighted sums
// One thread per output element (g, i, t): math::weighted_sum_one, the keys in key order. Consecutive threads
// take consecutive t of one (g, i), so w[g, i, j] is a broadcast read and the codes of key j are adjacent.
template <typename acc_t>
__global__ void weighted_sum_kernel(const math::WeightedSumParams<acc_t> p) {
  const int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (e >= p.G * p.nq * p.d) return;
  const int64_t t = e % p.d, gi = e / p.d;
  p.out[e] = math::weighted_sum_one(p, p.levels, gi / p.nq, gi % p.nq, t);
}

template <typename acc_t>
void launch_weighted_sum(const math::WeightedSumParams<acc_t>& p) {
  weighted_sum_kernel<acc_t><<<blocks_for(p.G * p.nq * p.d), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// ------------------------------------------------------------------------------------------------ packing
// Sign bits of proj [n, m] (math::sign_bit), one thread per output byte.
template <typename acc_t>
__global__ void pack_signs_kernel(const acc_t* __restrict__ proj, uint8_t* __restrict__ out, int64_t n, int64_t m) {
  const int64_t mb = packed_bytes(m, 1);
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= n * mb) return;
  const int64_t r = t / mb, k = t % mb;
  const acc_t* row = proj + r * m;
  auto sign_at = [&](int64_t i) { return math::sign_bit(row[i]); };
  out[t] = pack_byte(sign_at, m, 1, k);
}

// The packed sign bits [n, ceil(m/8)] of proj [n, m] (contiguous, the accumulation dtype).
inline at::Tensor pack_signs(const at::Tensor& proj) {
  const int64_t n = proj.size(0), m = proj.size(1), mb = packed_bytes(m, 1);
  at::Tensor out = at::empty({n, mb}, proj.options().dtype(at::kByte));
  if (n == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(proj.scalar_type(), "pack_signs_cuda", [&] {
    pack_signs_kernel<scalar_t><<<blocks_for(n * mb), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        proj.const_data_ptr<scalar_t>(), out.mutable_data_ptr<uint8_t>(), n, m);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

// Packs codes [n, d] (one byte per code, masked to `bits` bits) into out [n, ceil(d·bits/8)], one thread per
// output byte (cuda/pack_cuda.cu).
void pack_codes(const at::Tensor& codes, int64_t bits, const at::Tensor& out);

}  // namespace cuda
}  // namespace kvstats
