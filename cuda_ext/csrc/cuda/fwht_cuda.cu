// CUDA kernel of the orthonormal fast Walsh–Hadamard transform, registered under the same op name
// as the CPU kernel. One thread block per vector: the vector is staged in shared memory in the
// accumulation type (fp32, fp64 for double), transformed by log2(d) butterfly stages separated by
// __syncthreads, scaled by 1/sqrt(d) and written back in the input dtype.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cmath>

#include "../kernels.h"
#include "device_utils.cuh"

namespace kvstats {
namespace {

template <typename scalar_t, typename acc_t>
__global__ void fwht_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ y, int64_t d,
                            acc_t scale) {
  extern __shared__ unsigned char smem_raw[];
  acc_t* buf = reinterpret_cast<acc_t*>(smem_raw);
  const int64_t row = blockIdx.x;
  const scalar_t* xr = x + row * d;
  scalar_t* yr = y + row * d;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) buf[j] = static_cast<acc_t>(xr[j]);
  __syncthreads();
  cuda::smem_butterfly(buf, d);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) yr[j] = static_cast<scalar_t>(buf[j] * scale);
}

at::Tensor fwht_cuda(const at::Tensor& x) {
  check_fwht_input(x);
  TORCH_CHECK(x.is_cuda(), "fwht_cuda: x must be a CUDA tensor, got ", x.device());
  const c10::cuda::CUDAGuard device_guard(x.device());
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty_like(xc, at::MemoryFormat::Contiguous);
  const int64_t d = xc.size(-1);
  const int64_t rows = xc.numel() / d;
  if (rows == 0) return y;
  TORCH_CHECK(rows <= std::numeric_limits<int32_t>::max(), "fwht_cuda: too many vectors (", rows, ")");
  const int threads = static_cast<int>(std::min<int64_t>(std::max<int64_t>(d / 2, 32), 512));
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "fwht_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const size_t smem = static_cast<size_t>(d) * sizeof(acc_t);
    auto kernel = fwht_kernel<scalar_t, acc_t>;
    if (smem > 48 * 1024) {
      C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
    }
    const acc_t scale = acc_t(1) / std::sqrt(static_cast<acc_t>(d));
    kernel<<<static_cast<unsigned int>(rows), threads, smem, stream>>>(
        xc.const_data_ptr<scalar_t>(), y.mutable_data_ptr<scalar_t>(), d, scale);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(kvstats, CUDA, m) { m.impl("fwht", &fwht_cuda); }

}  // namespace kvstats
