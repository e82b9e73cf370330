// CUDA kernel of the orthonormal fast Walsh–Hadamard transform, registered under the same op name
// as the CPU kernel. One thread block per vector, staged in shared memory in the accumulation type
// (fp32, fp64 for double); the arithmetic (butterfly stages, 1/sqrt(d)) is math::fwht_row.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <limits>

#include "../prologue/fwht.h"
#include "../quant_math.h"
#include "device_utils.cuh"

namespace kvstats {
namespace {

// One block per row: math::fwht_row (quant_math.h) with the block's threads as lanes.
template <typename scalar_t, typename acc_t>
__global__ void fwht_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ y, int64_t d) {
  extern __shared__ unsigned char smem_raw[];
  acc_t* buf = reinterpret_cast<acc_t*>(smem_raw);
  const int64_t row = blockIdx.x;
  math::fwht_row(x + row * d, y + row * d, d, buf, cuda::BlockLanes<acc_t>{nullptr});
}

at::Tensor fwht_cuda(const at::Tensor& x) {
  const FwhtArgs a = fwht_prologue(x);
  TORCH_CHECK_VALUE(x.is_cuda(), "fwht_cuda: x must be a CUDA tensor, got ", x.device());
  const c10::cuda::CUDAGuard device_guard(a.x.device());
  const int64_t d = a.d, rows = a.rows;
  if (rows == 0) return a.y;
  TORCH_CHECK_VALUE(rows <= std::numeric_limits<int32_t>::max(), "fwht_cuda: too many vectors (", rows, ")");
  const int threads = cuda::threads_for(d);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.x.scalar_type(), "fwht_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const size_t smem = static_cast<size_t>(d) * sizeof(acc_t);
    auto kernel = fwht_kernel<scalar_t, acc_t>;
    cuda::ensure_smem(reinterpret_cast<const void*>(kernel), smem);
    kernel<<<static_cast<unsigned int>(rows), threads, smem, stream>>>(a.x.const_data_ptr<scalar_t>(),
                                                                        a.y.mutable_data_ptr<scalar_t>(), d);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return a.y;
}

}  // namespace

TORCH_LIBRARY_IMPL(kvstats, CUDA, m) { m.impl("fwht", &fwht_cuda); }

}  // namespace kvstats
