// CUDA kernels of the QJL sketch: encode by a GEMM per chunk of rows, then one thread per output byte of
// signs and one block per row for the norms; scores one thread per key and weighted sums one thread per
// output element (row_kernels.cuh). Each op runs its prologue (prologue/qjl.h), then launches on the current
// stream under a device guard.
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>

#include "../prologue/qjl.h"
#include "../quant_math.h"
#include "device_utils.cuh"
#include "row_kernels.cuh"

namespace kvstats {
namespace {

// ‖x_r‖ without overflow (math::load_scaled), one block per row. Shared memory: d values, 32 slots.
template <typename acc_t>
__global__ void row_norm_kernel(const acc_t* __restrict__ x, int64_t d, acc_t* __restrict__ norm) {
  extern __shared__ unsigned char smem_raw[];
  acc_t* buf = reinterpret_cast<acc_t*>(smem_raw);
  const cuda::BlockLanes<acc_t> lanes{buf + d};
  const math::RowNorm<acc_t> rn = math::load_scaled(x + blockIdx.x * d, d, buf, lanes);
  if (threadIdx.x == 0) norm[blockIdx.x] = rn.norm();
}

// norm[r] = ‖x_r‖ for x [n, d] contiguous in norm's dtype.
void row_norms(const at::Tensor& x, const at::Tensor& norm) {
  const int64_t n = x.size(0), d = x.size(1);
  if (n == 0) return;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "row_norms_cuda", [&] {
    const size_t smem = (d + 32) * sizeof(scalar_t);
    auto kernel = row_norm_kernel<scalar_t>;
    cuda::ensure_smem(reinterpret_cast<const void*>(kernel), smem);
    kernel<<<static_cast<unsigned int>(n), cuda::threads_for(d), smem, at::cuda::getCurrentCUDAStream()>>>(
        x.const_data_ptr<scalar_t>(), d, norm.mutable_data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

std::tuple<at::Tensor, at::Tensor> qjl_encode_cuda(const at::Tensor& x, const at::Tensor& sketch,
                                                   at::ScalarType norm_dtype) {
  const QjlEncodeArgs a = qjl_encode_prologue(x, sketch, norm_dtype);
  const c10::cuda::CUDAGuard guard(a.x.device());
  const at::Tensor xa = a.x_in_sketch_dtype();
  for (int64_t c0 = 0; c0 < a.n; c0 += cuda::kChunkRows) {
    const int64_t rows = std::min(cuda::kChunkRows, a.n - c0);
    a.packed.narrow(0, c0, rows).copy_(cuda::pack_signs(at::matmul(xa.narrow(0, c0, rows), a.sketch.t()).contiguous()));
  }
  row_norms(xa, a.norm);
  return a.result();
}

at::Tensor qjl_scores_cuda(const at::Tensor& q_sketch, const at::Tensor& packed, const at::Tensor& norm,
                           double scale) {
  const QjlScoresArgs a = qjl_scores_prologue(q_sketch, packed, norm, scale, &cuda::qjl_weights);
  const c10::cuda::CUDAGuard guard(a.q_sketch.device());
  if (a.out.numel() == 0) return a.out;
  AT_DISPATCH_FLOATING_TYPES(a.q_sketch.scalar_type(), "qjl_scores_cuda", [&] {
    cuda::launch_scores(a.params<scalar_t>());
  });
  return a.out;
}

at::Tensor qjl_weighted_sum_cuda(const at::Tensor& w, const at::Tensor& packed, const at::Tensor& norm, double scale,
                                 int64_t m) {
  const QjlWeightedSumArgs a = qjl_weighted_sum_prologue(w, packed, norm, scale, m, &cuda::qjl_weights);
  const c10::cuda::CUDAGuard guard(a.w.device());
  if (a.out.numel() == 0) return a.out;
  AT_DISPATCH_FLOATING_TYPES(a.w.scalar_type(), "qjl_weighted_sum_cuda", [&] {
    cuda::launch_weighted_sum(a.params<scalar_t>());
  });
  return a.out;
}

}  // namespace

TORCH_LIBRARY_IMPL(kvstats, CUDA, m) {
  m.impl("qjl_encode", &qjl_encode_cuda);
  m.impl("qjl_scores", &qjl_scores_cuda);
  m.impl("qjl_weighted_sum", &qjl_weighted_sum_cuda);
}

}  // namespace kvstats
