// CUDA kernels of TurboQuant_prod: encode with lloyd's one-block-per-row kernel writing the residual too, then
// a GEMM and one thread per output byte of signs per chunk of rows; scores one thread per key (row_kernels.cuh);
// decode one block per row (math::decode_lloyd_row, then math::sign_decode_row in place). Each op runs its
// prologue (prologue/turbo_prod.h), then launches on the current stream under a device guard.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>

#include "../bitpack.h"
#include "../prologue/turbo_prod.h"
#include "../quant_math.h"
#include "device_utils.cuh"
#include "row_kernels.cuh"

namespace kvstats {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> turbo_prod_encode_cuda(
    const at::Tensor& x, const at::Tensor& signs, const at::Tensor& thresholds, const at::Tensor& levels,
    int64_t bits, const at::Tensor& sketch, at::ScalarType norm_dtype) {
  const TurboProdEncodeArgs a = turbo_prod_encode_prologue(x, signs, thresholds, levels, bits, sketch, norm_dtype);
  const c10::cuda::CUDAGuard guard(a.x.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.x.scalar_type(), "turbo_prod_encode_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    // The residual of one chunk at a time: extra memory bounded by kChunkRows * (d + m) values. It is
    // kept scaled by 2^-e per row (quant_math.h), which leaves its sign bits unchanged.
    at::Tensor residual = at::empty({std::min(a.n, cuda::kChunkRows), a.d}, a.thresholds.options());
    for (int64_t c0 = 0; c0 < a.n; c0 += cuda::kChunkRows) {
      auto p = a.params<scalar_t, acc_t>(c0, std::min(cuda::kChunkRows, a.n - c0));
      p.residual = residual.mutable_data_ptr<acc_t>();
      cuda::launch_encode(p, stream);
      a.sign_packed.narrow(0, c0, p.n).copy_(
          cuda::pack_signs(at::matmul(residual.narrow(0, 0, p.n), a.sketch.t()).contiguous()));
    }
  });
  return a.result();
}

at::Tensor turbo_prod_scores_cuda(const at::Tensor& q, const at::Tensor& q_sketch, const at::Tensor& packed,
                                  const at::Tensor& norm, const at::Tensor& levels, int64_t bits,
                                  const at::Tensor& signs_packed, const at::Tensor& gamma, double scale) {
  const TurboProdScoresArgs a = turbo_prod_scores_prologue(q, q_sketch, packed, norm, levels, bits, signs_packed,
                                                           gamma, scale, &cuda::qjl_weights);
  const c10::cuda::CUDAGuard guard(a.q.device());
  if (a.out.numel() == 0) return a.out;
  AT_DISPATCH_FLOATING_TYPES(a.q.scalar_type(), "turbo_prod_scores_cuda", [&] {
    cuda::launch_scores(a.params<scalar_t>());
  });
  return a.out;
}

// One block per row: math::decode_lloyd_row into the output row, then math::sign_decode_row adds the sign
// part in place (each thread re-reads only the columns it wrote).
template <typename acc_t>
__global__ void turbo_prod_decode_kernel(const uint8_t* __restrict__ packed, const acc_t* __restrict__ norm, int64_t d,
                                         int64_t bits, const math::Rotation rot, const acc_t* __restrict__ levels,
                                         const uint8_t* __restrict__ signs_packed, int64_t mb,
                                         const acc_t* __restrict__ tables, const acc_t* __restrict__ weight,
                                         acc_t* out) {
  extern __shared__ unsigned char smem_raw[];
  acc_t* buf = reinterpret_cast<acc_t*>(smem_raw);
  const int64_t row = blockIdx.x;
  const cuda::BlockLanes<acc_t> lanes{nullptr};
  math::decode_lloyd_row(packed + row * packed_bytes(d, bits), norm[row], levels, bits, d, rot, buf, out + row * d,
                         lanes);
  math::sign_decode_row(signs_packed + row * mb, mb, tables, d, weight[row], out + row * d, out + row * d, lanes);
}

at::Tensor turbo_prod_decode_cuda(const at::Tensor& packed, const at::Tensor& norm, const at::Tensor& signs,
                                  const at::Tensor& levels, int64_t bits, int64_t d, const at::Tensor& signs_packed,
                                  const at::Tensor& tables, const at::Tensor& weight) {
  const TurboProdDecodeArgs a =
      turbo_prod_decode_prologue(packed, norm, signs, levels, bits, d, signs_packed, tables, weight);
  const c10::cuda::CUDAGuard guard(a.packed.device());
  if (a.n == 0) return a.out;
  AT_DISPATCH_FLOATING_TYPES(a.levels.scalar_type(), "turbo_prod_decode_cuda", [&] {
    const size_t smem = d * sizeof(scalar_t);
    auto kernel = turbo_prod_decode_kernel<scalar_t>;
    cuda::ensure_smem(reinterpret_cast<const void*>(kernel), smem);
    kernel<<<static_cast<unsigned int>(a.n), cuda::threads_for(d), smem, at::cuda::getCurrentCUDAStream()>>>(
        a.packed.const_data_ptr<uint8_t>(), a.norm.const_data_ptr<scalar_t>(), d, bits, a.rotation(),
        a.levels.const_data_ptr<scalar_t>(), a.signs_packed.const_data_ptr<uint8_t>(), a.mb,
        a.tables.const_data_ptr<scalar_t>(), a.weight.const_data_ptr<scalar_t>(), a.out.mutable_data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return a.out;
}

}  // namespace

TORCH_LIBRARY_IMPL(kvstats, CUDA, m) {
  m.impl("turbo_prod_encode", &turbo_prod_encode_cuda);
  m.impl("turbo_prod_scores", &turbo_prod_scores_cuda);
  m.impl("turbo_prod_decode", &turbo_prod_decode_cuda);
}

}  // namespace kvstats
