// CUDA kernel of the orthonormal fast Walsh–Hadamard transform, registered under the same op name
// as the CPU kernel. One thread block per vector, staged in shared memory in the accumulation type
// (fp32, fp64 for double); the arithmetic (butterfly stages, 1/sqrt(d)) is math::fwht_row.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cmath>

#include "../checks/fwht.h"
#include "../kernels.h"
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
  check_fwht_input(x);
  TORCH_CHECK_VALUE(x.is_cuda(), "fwht_cuda: x must be a CUDA tensor, got ", x.device());
  const c10::cuda::CUDAGuard device_guard(x.device());
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty_like(xc, at::MemoryFormat::Contiguous);
  const int64_t d = xc.size(-1);
  const int64_t rows = xc.numel() / d;
  if (rows == 0) return y;
  TORCH_CHECK_VALUE(rows <= std::numeric_limits<int32_t>::max(), "fwht_cuda: too many vectors (", rows, ")");
  const int threads = cuda::threads_for(d);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "fwht_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const size_t smem = static_cast<size_t>(d) * sizeof(acc_t);
    auto kernel = fwht_kernel<scalar_t, acc_t>;
    if (smem > 48 * 1024) {
      C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
    }
    kernel<<<static_cast<unsigned int>(rows), threads, smem, stream>>>(xc.const_data_ptr<scalar_t>(),
                                                                        y.mutable_data_ptr<scalar_t>(), d);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(kvstats, CUDA, m) { m.impl("fwht", &fwht_cuda); }

}  // namespace kvstats
