// CUDA kernels of rotation + Lloyd–Max (lloyd, turbo_mse): encode and decode one thread block per row
// (BlockLanes, the row in shared memory), scores one thread per key, weighted sums one thread per output
// element (row_kernels.cuh). Each op runs its prologue (prologue/lloyd.h), then launches on the current stream
// under a device guard.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../bitpack.h"
#include "../prologue/lloyd.h"
#include "../quant_math.h"
#include "device_utils.cuh"
#include "row_kernels.cuh"

namespace kvstats {
namespace {

// One block per row: math::decode_lloyd_row. Shared memory: d values.
template <typename acc_t>
__global__ void lloyd_decode_kernel(const uint8_t* __restrict__ packed, const acc_t* __restrict__ norm, int64_t d,
                                    int64_t bits, const math::Rotation rot, const acc_t* __restrict__ levels,
                                    acc_t* __restrict__ out) {
  extern __shared__ unsigned char smem_raw[];
  acc_t* buf = reinterpret_cast<acc_t*>(smem_raw);
  const int64_t row = blockIdx.x;
  math::decode_lloyd_row(packed + row * packed_bytes(d, bits), norm[row], levels, bits, d, rot, buf, out + row * d,
                         cuda::BlockLanes<acc_t>{nullptr});
}

std::tuple<at::Tensor, at::Tensor> lloyd_encode_cuda(const at::Tensor& x, const at::Tensor& signs,
                                                     const at::Tensor& thresholds, int64_t bits,
                                                     at::ScalarType norm_dtype) {
  const LloydEncodeArgs a = lloyd_encode_prologue(x, signs, thresholds, bits, norm_dtype);
  const c10::cuda::CUDAGuard guard(a.x.device());
  if (a.n == 0) return a.result();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.x.scalar_type(), "lloyd_encode_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    cuda::launch_encode(a.params<scalar_t, acc_t>(), at::cuda::getCurrentCUDAStream());
  });
  return a.result();
}

at::Tensor lloyd_decode_cuda(const at::Tensor& packed, const at::Tensor& norm, const at::Tensor& signs,
                             const at::Tensor& levels, int64_t bits, int64_t d) {
  const LloydDecodeArgs a = lloyd_decode_prologue(packed, norm, signs, levels, bits, d);
  const c10::cuda::CUDAGuard guard(a.packed.device());
  if (a.n == 0) return a.out;
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(a.levels.scalar_type(), "lloyd_decode_cuda", [&] {
    const size_t smem = d * sizeof(scalar_t);
    auto kernel = lloyd_decode_kernel<scalar_t>;
    cuda::ensure_smem(reinterpret_cast<const void*>(kernel), smem);
    kernel<<<static_cast<unsigned int>(a.n), cuda::threads_for(d), smem, stream>>>(
        a.packed.const_data_ptr<uint8_t>(), a.norm.const_data_ptr<scalar_t>(), d, bits, a.rotation(),
        a.levels.const_data_ptr<scalar_t>(), a.out.mutable_data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return a.out;
}

at::Tensor lloyd_scores_cuda(const at::Tensor& q, const at::Tensor& packed, const at::Tensor& norm,
                             const at::Tensor& levels, int64_t bits) {
  const LloydScoresArgs a = lloyd_scores_prologue(q, packed, norm, levels, bits);
  const c10::cuda::CUDAGuard guard(a.q.device());
  if (a.out.numel() == 0) return a.out;
  AT_DISPATCH_FLOATING_TYPES(a.q.scalar_type(), "lloyd_scores_cuda", [&] {
    cuda::launch_scores(a.params<scalar_t>());
  });
  return a.out;
}

at::Tensor lloyd_weighted_sum_cuda(const at::Tensor& w, const at::Tensor& packed, const at::Tensor& norm,
                                   const at::Tensor& levels, int64_t bits, int64_t d) {
  const LloydWeightedSumArgs a = lloyd_weighted_sum_prologue(w, packed, norm, levels, bits, d);
  const c10::cuda::CUDAGuard guard(a.w.device());
  if (a.out.numel() == 0) return a.out;
  AT_DISPATCH_FLOATING_TYPES(a.w.scalar_type(), "lloyd_weighted_sum_cuda", [&] {
    cuda::launch_weighted_sum(a.params<scalar_t>());
  });
  return a.out;
}

}  // namespace

TORCH_LIBRARY_IMPL(kvstats, CUDA, m) {
  m.impl("lloyd_encode", &lloyd_encode_cuda);
  m.impl("lloyd_decode", &lloyd_decode_cuda);
  m.impl("lloyd_scores", &lloyd_scores_cuda);
  m.impl("lloyd_weighted_sum", &lloyd_weighted_sum_cuda);
}

}  // namespace kvstats
