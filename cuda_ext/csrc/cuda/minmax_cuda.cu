// CUDA kernels of KIVI-style min-max: encode one thread per group (math::minmax_group) into a byte per code,
// then packing (row_kernels.cuh); decode one thread per element (math::minmax_value); weighted sums one thread
// per output element. Each op runs its prologue (prologue/minmax.h), then launches on the current stream under
// a device guard.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../bitpack.h"
#include "../prologue/minmax.h"
#include "../quant_math.h"
#include "device_utils.cuh"
#include "row_kernels.cuh"

namespace kvstats {
namespace {

// One thread per group: math::minmax_group writes its codes into a [n, d] byte array; then packing.
template <typename scalar_t, typename acc_t>
__global__ void minmax_codes_kernel(const scalar_t* __restrict__ x, int64_t n, int64_t d, int64_t group, int64_t bits,
                                    math::Stored stored, uint8_t* __restrict__ codes, acc_t* __restrict__ lo_out,
                                    acc_t* __restrict__ step_out) {
  const int64_t ng = d / group;
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= n * ng) return;
  const int64_t offset = (t / ng) * d + (t % ng) * group;
  const math::MinMaxParams<acc_t> p = math::minmax_group<scalar_t, acc_t>(x + offset, group, bits, stored, codes + offset);
  lo_out[t] = p.lo;
  step_out[t] = p.step;
}

template <typename acc_t>
__global__ void minmax_decode_kernel(const uint8_t* __restrict__ packed, const acc_t* __restrict__ lo,
                                     const acc_t* __restrict__ step, int64_t n, int64_t d, int64_t group,
                                     int64_t bits, acc_t* __restrict__ out) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= n * d) return;
  const int64_t r = t / d, j = t % d, nb = packed_bytes(d, bits), gi = r * (d / group) + j / group;
  out[t] = math::minmax_value(lo[gi], step[gi], unpack_code(packed + r * nb, nb, bits, j));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> minmax_encode_cuda(const at::Tensor& x, int64_t group, int64_t bits,
                                                                  at::ScalarType side_dtype) {
  const MinMaxEncodeArgs a = minmax_encode_prologue(x, group, bits, side_dtype);
  const c10::cuda::CUDAGuard guard(a.x.device());
  const int64_t n = a.n, d = a.d;
  const at::Tensor codes = at::empty({n, d}, a.x.options().dtype(at::kByte));  // a byte per code, then packed
  if (n > 0) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.x.scalar_type(), "minmax_encode_cuda", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      minmax_codes_kernel<scalar_t, acc_t>
          <<<cuda::blocks_for(n * a.ng), cuda::kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
              a.x.const_data_ptr<scalar_t>(), n, d, group, bits, stored_of(a.side), codes.mutable_data_ptr<uint8_t>(),
              a.lo.mutable_data_ptr<acc_t>(), a.step.mutable_data_ptr<acc_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }
  cuda::pack_codes(codes, bits, a.packed);
  return a.result();
}

at::Tensor minmax_decode_cuda(const at::Tensor& packed, const at::Tensor& lo, const at::Tensor& scale, int64_t group,
                              int64_t bits, int64_t d) {
  const MinMaxDecodeArgs a = minmax_decode_prologue(packed, lo, scale, group, bits, d);
  const c10::cuda::CUDAGuard guard(a.packed.device());
  if (a.n == 0) return a.out;
  AT_DISPATCH_FLOATING_TYPES(a.lo.scalar_type(), "minmax_decode_cuda", [&] {
    minmax_decode_kernel<scalar_t><<<cuda::blocks_for(a.n * d), cuda::kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        a.packed.const_data_ptr<uint8_t>(), a.lo.const_data_ptr<scalar_t>(), a.step.const_data_ptr<scalar_t>(), a.n, d,
        group, bits, a.out.mutable_data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return a.out;
}

at::Tensor minmax_weighted_sum_cuda(const at::Tensor& w, const at::Tensor& packed, const at::Tensor& lo,
                                    const at::Tensor& scale, int64_t group, int64_t bits, int64_t d) {
  const MinMaxWeightedSumArgs a = minmax_weighted_sum_prologue(w, packed, lo, scale, group, bits, d);
  const c10::cuda::CUDAGuard guard(a.w.device());
  if (a.out.numel() == 0) return a.out;
  AT_DISPATCH_FLOATING_TYPES(a.w.scalar_type(), "minmax_weighted_sum_cuda", [&] {
    cuda::launch_weighted_sum(a.params<scalar_t>());
  });
  return a.out;
}

}  // namespace

TORCH_LIBRARY_IMPL(kvstats, CUDA, m) {
  m.impl("minmax_encode", &minmax_encode_cuda);
  m.impl("minmax_decode", &minmax_decode_cuda);
  m.impl("minmax_weighted_sum", &minmax_weighted_sum_cuda);
}

}  // namespace kvstats
