// CUDA kernel of the sign decode from byte tables: one thread block per row, one thread per column (at most
// kThreads), each summing its column of the row's table rows (math::sign_decode_row): the reads of a table row
// are coalesced. The op runs its prologue (prologue/sign_decode.h), then launches on the current stream under a
// device guard.
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>

#include "../prologue/sign_decode.h"
#include "../quant_math.h"
#include "device_utils.cuh"

namespace kvstats {
namespace {

// One block per row: math::sign_decode_row, one thread per column (coalesced reads of each table row).
template <typename acc_t>
__global__ void sign_decode_kernel(const uint8_t* __restrict__ packed, int64_t mb, const acc_t* __restrict__ tables,
                                   int64_t d, const acc_t* __restrict__ weight, const acc_t* __restrict__ base,
                                   acc_t* __restrict__ out) {
  const int64_t row = blockIdx.x;
  math::sign_decode_row(packed + row * mb, mb, tables, d, weight[row], base == nullptr ? nullptr : base + row * d,
                        out + row * d, cuda::BlockLanes<acc_t>{nullptr});
}

at::Tensor sign_decode_cuda(const at::Tensor& packed, const at::Tensor& tables, const at::Tensor& weight,
                            const std::optional<at::Tensor>& base) {
  const SignDecodeArgs a = sign_decode_prologue(packed, tables, weight, base);
  const c10::cuda::CUDAGuard guard(a.packed.device());
  const int64_t d = a.d;
  if (a.n == 0) return a.out;
  const int threads = static_cast<int>(std::min<int64_t>(cuda::kThreads, (d + 31) / 32 * 32));
  AT_DISPATCH_FLOATING_TYPES(a.tables.scalar_type(), "sign_decode_cuda", [&] {
    sign_decode_kernel<scalar_t><<<static_cast<unsigned int>(a.n), threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        a.packed.const_data_ptr<uint8_t>(), a.mb, a.tables.const_data_ptr<scalar_t>(), d,
        a.weight.const_data_ptr<scalar_t>(), a.base.defined() ? a.base.const_data_ptr<scalar_t>() : nullptr,
        a.out.mutable_data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return a.out;
}

}  // namespace

TORCH_LIBRARY_IMPL(kvstats, CUDA, m) { m.impl("sign_decode", &sign_decode_cuda); }

}  // namespace kvstats
