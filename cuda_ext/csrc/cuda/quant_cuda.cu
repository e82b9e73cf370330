// CUDA kernels of the quantizer ops, registered under the same names as the CPU kernels. The
// arithmetic is quant_math.h's (shared with the CPU's kvstats_shared backend, which the CPU suite runs under
// kvstats.ops.shared_path());
// this file maps it to the GPU: one block per row for the row programs (BlockLanes, shared memory), one
// thread per key for scores, per group for min-max, per byte for packing. Each op checks its inputs with
// the shared check_* functions, runs under a device guard on the current stream, and allocates its
// outputs from the inputs' options.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../bitpack.h"
#include "../checks/fwht.h"
#include "../checks/lloyd.h"
#include "../checks/minmax.h"
#include "../checks/pack.h"
#include "../checks/qjl.h"
#include "../checks/sign_decode.h"
#include "../checks/turbo_prod.h"
#include "../kernels.h"
#include "../quant_math.h"
#include "../score_params.h"
#include "../weighted_params.h"
#include "device_utils.cuh"

namespace kvstats {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunkRows = 65536;  // rows per chunk where a scratch residual or projection is needed

unsigned int blocks_for(int64_t n, int threads = kThreads) {
  return static_cast<unsigned int>((n + threads - 1) / threads);
}

void ensure_smem(const void* kernel, size_t smem) {
  if (smem > 48 * 1024)
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
}

// ------------------------------------------------------------------------------------------ packing
// One thread per output byte: no atomics.
__global__ void pack_bits_kernel(const uint8_t* __restrict__ codes, uint8_t* __restrict__ out, int64_t n, int64_t d,
                                 int64_t bits) {
  const int64_t nb = packed_bytes(d, bits);
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= n * nb) return;
  const int64_t r = t / nb, k = t % nb;
  const uint8_t* row = codes + r * d;
  const uint32_t mask = (1u << bits) - 1u;
  auto code_at = [&](int64_t i) { return static_cast<uint32_t>(row[i]) & mask; };
  out[t] = pack_byte(code_at, d, bits, k);
}

__global__ void unpack_bits_kernel(const uint8_t* __restrict__ packed, uint8_t* __restrict__ out, int64_t n,
                                   int64_t d, int64_t bits) {
  const int64_t nb = packed_bytes(d, bits);
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= n * d) return;
  const int64_t r = t / d, i = t % d;
  out[t] = static_cast<uint8_t>(unpack_code(packed + r * nb, nb, bits, i));
}

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

// ------------------------------------------------------------------------------------------- norms
// ‖x_r‖ without overflow (math::load_scaled), one block per row. Shared memory: d values, 32 slots.
template <typename acc_t>
__global__ void row_norm_kernel(const acc_t* __restrict__ x, int64_t d, acc_t* __restrict__ norm) {
  extern __shared__ unsigned char smem_raw[];
  acc_t* buf = reinterpret_cast<acc_t*>(smem_raw);
  const cuda::BlockLanes<acc_t> lanes{buf + d};
  const math::RowNorm<acc_t> rn = math::load_scaled(x + blockIdx.x * d, d, buf, lanes);
  if (threadIdx.x == 0) norm[blockIdx.x] = rn.norm();
}

// --------------------------------------------------------------------------------- Lloyd encode/decode
// One block per row: math::encode_params_row. Shared memory: d accumulators, 32 reduction slots, d codes.
template <typename scalar_t, typename acc_t>
__global__ void lloyd_encode_kernel(const math::LloydEncodeParams<scalar_t, acc_t> p) {
  extern __shared__ unsigned char smem_raw[];
  acc_t* buf = reinterpret_cast<acc_t*>(smem_raw);
  acc_t* scratch = buf + p.d;
  uint8_t* codes = reinterpret_cast<uint8_t*>(scratch + 32);
  math::encode_params_row(p, static_cast<int64_t>(blockIdx.x), buf, codes, cuda::BlockLanes<acc_t>{scratch});
}

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

size_t encode_smem(int64_t d, size_t acc_size) { return (d + 32) * acc_size + d; }

// Launches the encode kernel over rows [0, p.n) of p.
template <typename scalar_t, typename acc_t>
void launch_encode(const math::LloydEncodeParams<scalar_t, acc_t>& p, cudaStream_t stream) {
  const size_t smem = encode_smem(p.d, sizeof(acc_t));
  auto kernel = lloyd_encode_kernel<scalar_t, acc_t>;
  ensure_smem(reinterpret_cast<const void*>(kernel), smem);
  kernel<<<static_cast<unsigned int>(p.n), cuda::threads_for(p.d), smem, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

std::tuple<at::Tensor, at::Tensor> lloyd_encode_cuda(const at::Tensor& x, const at::Tensor& signs,
                                                     const at::Tensor& thresholds, int64_t bits,
                                                     at::ScalarType norm_dtype) {
  check_lloyd_encode_input(x, signs, thresholds, bits);
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xc = x.contiguous(), sg = signs.contiguous(), th = thresholds.contiguous();
  const int64_t n = xc.size(0), d = xc.size(1), nb = packed_bytes(d, bits);
  at::Tensor packed = at::empty({n, nb}, xc.options().dtype(at::kByte));
  at::Tensor norm = at::empty({n}, xc.options().dtype(th.scalar_type()));
  if (n == 0) return {packed, norm.to(storage_dtype(x, norm_dtype))};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "lloyd_encode_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    auto p = lloyd_encode_params<scalar_t, acc_t>(xc, sg, th, bits, packed, norm);
    launch_encode(p, at::cuda::getCurrentCUDAStream());
  });
  return {packed, norm.to(storage_dtype(x, norm_dtype))};
}

at::Tensor lloyd_decode_cuda(const at::Tensor& packed, const at::Tensor& norm, const at::Tensor& signs,
                             const at::Tensor& levels, int64_t bits, int64_t d) {
  check_lloyd_decode_input(packed, norm, signs, levels, bits, d);
  const c10::cuda::CUDAGuard guard(packed.device());
  const at::Tensor pc = packed.contiguous(), sg = signs.contiguous(), lv = levels.contiguous();
  const at::Tensor nc = norm.to(lv.scalar_type()).contiguous();
  const int64_t n = pc.size(0);
  at::Tensor out = at::empty({n, d}, lv.options());
  if (n == 0) return out;
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(lv.scalar_type(), "lloyd_decode_cuda", [&] {
    const size_t smem = d * sizeof(scalar_t);
    auto kernel = lloyd_decode_kernel<scalar_t>;
    ensure_smem(reinterpret_cast<const void*>(kernel), smem);
    kernel<<<static_cast<unsigned int>(n), cuda::threads_for(d), smem, stream>>>(
        pc.const_data_ptr<uint8_t>(), nc.const_data_ptr<scalar_t>(), d, bits, rotation_of(sg),
        lv.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

// --------------------------------------------------------------------------------------------- scores
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

at::Tensor qjl_weights(const at::Tensor& norm, at::ScalarType dtype, double scale) {
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

at::Tensor lloyd_scores_cuda(const at::Tensor& q, const at::Tensor& packed, const at::Tensor& norm,
                             const at::Tensor& levels, int64_t bits) {
  check_lloyd_scores_input(q, packed, norm, levels, bits);
  const c10::cuda::CUDAGuard guard(q.device());
  const at::Tensor qc = q.contiguous(), pc = packed.contiguous(), lv = levels.contiguous();
  const at::Tensor nc = norm.to(qc.scalar_type()).contiguous();
  at::Tensor out = at::empty({qc.size(0), qc.size(1), pc.size(1)}, qc.options());
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(qc.scalar_type(), "lloyd_scores_cuda", [&] {
    auto p = score_params<scalar_t>(out);
    with_code_part(p, qc, pc, nc, lv, bits);
    launch_scores(p);
  });
  return out;
}

at::Tensor qjl_scores_cuda(const at::Tensor& q_sketch, const at::Tensor& packed, const at::Tensor& norm,
                           double scale) {
  check_qjl_scores_input(q_sketch, packed, norm);
  const c10::cuda::CUDAGuard guard(q_sketch.device());
  const at::Tensor qc = q_sketch.contiguous(), pc = packed.contiguous();
  const at::Tensor wc = qjl_weights(norm, qc.scalar_type(), scale);
  at::Tensor out = at::empty({qc.size(0), qc.size(1), pc.size(1)}, qc.options());
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(qc.scalar_type(), "qjl_scores_cuda", [&] {
    auto p = score_params<scalar_t>(out);
    with_sign_part(p, qc, pc, wc);
    launch_scores(p);
  });
  return out;
}

at::Tensor turbo_prod_scores_cuda(const at::Tensor& q, const at::Tensor& q_sketch, const at::Tensor& packed,
                                  const at::Tensor& norm, const at::Tensor& levels, int64_t bits,
                                  const at::Tensor& signs_packed, const at::Tensor& gamma, double scale) {
  check_turbo_prod_scores_input(q, q_sketch, packed, norm, levels, bits, signs_packed, gamma);
  const c10::cuda::CUDAGuard guard(q.device());
  const at::Tensor qc = q.contiguous(), pc = packed.contiguous(), lv = levels.contiguous();
  const at::Tensor qsc = q_sketch.contiguous(), spc = signs_packed.contiguous();
  const at::Tensor nc = norm.to(qc.scalar_type()).contiguous();
  const at::Tensor gc = qjl_weights(gamma, qc.scalar_type(), scale);
  at::Tensor out = at::empty({qc.size(0), qc.size(1), pc.size(1)}, qc.options());
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(qc.scalar_type(), "turbo_prod_scores_cuda", [&] {
    auto p = score_params<scalar_t>(out);
    with_code_part(p, qc, pc, nc, lv, bits);
    with_sign_part(p, qsc, spc, gc);
    launch_scores(p);
  });
  return out;
}

// ------------------------------------------------------------------------------ QJL and TurboQuant_prod
at::Tensor pack_signs(const at::Tensor& proj) {
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

at::Tensor row_norms(const at::Tensor& x) {
  const int64_t n = x.size(0), d = x.size(1);
  at::Tensor norm = at::empty({n}, x.options());
  if (n == 0) return norm;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "row_norms_cuda", [&] {
    const size_t smem = (d + 32) * sizeof(scalar_t);
    auto kernel = row_norm_kernel<scalar_t>;
    ensure_smem(reinterpret_cast<const void*>(kernel), smem);
    kernel<<<static_cast<unsigned int>(n), cuda::threads_for(d), smem, at::cuda::getCurrentCUDAStream()>>>(
        x.const_data_ptr<scalar_t>(), d, norm.mutable_data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return norm;
}

std::tuple<at::Tensor, at::Tensor> qjl_encode_cuda(const at::Tensor& x, const at::Tensor& sketch,
                                                   at::ScalarType norm_dtype) {
  check_qjl_encode_input(x, sketch);
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor sk = sketch.contiguous();
  const at::Tensor xa = x.to(sk.scalar_type()).contiguous();
  const int64_t n = xa.size(0), mb = packed_bytes(sk.size(0), 1);
  at::Tensor packed = at::empty({n, mb}, xa.options().dtype(at::kByte));
  for (int64_t c0 = 0; c0 < n; c0 += kChunkRows) {
    const int64_t rows = std::min(kChunkRows, n - c0);
    packed.narrow(0, c0, rows).copy_(pack_signs(at::matmul(xa.narrow(0, c0, rows), sk.t()).contiguous()));
  }
  return {packed, row_norms(xa).to(storage_dtype(x, norm_dtype))};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> turbo_prod_encode_cuda(
    const at::Tensor& x, const at::Tensor& signs, const at::Tensor& thresholds, const at::Tensor& levels,
    int64_t bits, const at::Tensor& sketch, at::ScalarType norm_dtype) {
  check_turbo_prod_encode_input(x, signs, thresholds, levels, bits, sketch);
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xc = x.contiguous(), sg = signs.contiguous(), th = thresholds.contiguous();
  const at::Tensor lv = levels.contiguous(), sk = sketch.contiguous();
  const int64_t n = xc.size(0), d = xc.size(1), nb = packed_bytes(d, bits), mb = packed_bytes(sk.size(0), 1);
  const at::ScalarType stored = storage_dtype(x, norm_dtype);
  at::Tensor packed = at::empty({n, nb}, xc.options().dtype(at::kByte));
  at::Tensor sign_packed = at::empty({n, mb}, xc.options().dtype(at::kByte));
  at::Tensor norm = at::empty({n}, xc.options().dtype(th.scalar_type()));
  at::Tensor gamma = at::empty({n}, xc.options().dtype(th.scalar_type()));
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "turbo_prod_encode_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    // The residual of one chunk at a time: extra memory bounded by kChunkRows * (d + m) values. It is
    // kept scaled by 2^-e per row (quant_math.h), which leaves its sign bits unchanged.
    at::Tensor residual = at::empty({std::min(n, kChunkRows), d}, th.options());
    for (int64_t c0 = 0; c0 < n; c0 += kChunkRows) {
      auto p = lloyd_encode_params<scalar_t, acc_t>(xc, sg, th, bits, packed, norm, c0,
                                                    std::min(kChunkRows, n - c0));
      p.levels = lv.const_data_ptr<acc_t>();
      p.norm_stored = stored_of(stored);
      p.residual = residual.mutable_data_ptr<acc_t>();
      p.gamma = gamma.mutable_data_ptr<acc_t>() + c0;
      launch_encode(p, stream);
      sign_packed.narrow(0, c0, p.n).copy_(pack_signs(at::matmul(residual.narrow(0, 0, p.n), sk.t()).contiguous()));
    }
  });
  return {packed, norm.to(stored), sign_packed, gamma.to(stored)};
}

// ---------------------------------------------------------------------------------------- sign decode
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
  check_sign_decode_input(packed, tables, weight, base);
  const c10::cuda::CUDAGuard guard(packed.device());
  const at::Tensor pc = packed.contiguous(), tc = tables.contiguous();
  const at::Tensor wc = weight.to(tc.scalar_type()).contiguous();
  const at::Tensor bc = base.has_value() ? base->contiguous() : at::Tensor();
  const int64_t n = pc.size(0), mb = pc.size(1), d = tc.size(1);
  at::Tensor out = at::empty({n, d}, tc.options());
  if (n == 0) return out;
  const int threads = static_cast<int>(std::min<int64_t>(kThreads, (d + 31) / 32 * 32));
  AT_DISPATCH_FLOATING_TYPES(tc.scalar_type(), "sign_decode_cuda", [&] {
    sign_decode_kernel<scalar_t><<<static_cast<unsigned int>(n), threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        pc.const_data_ptr<uint8_t>(), mb, tc.const_data_ptr<scalar_t>(), d, wc.const_data_ptr<scalar_t>(),
        bc.defined() ? bc.const_data_ptr<scalar_t>() : nullptr, out.mutable_data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

// TurboQuant_prod decode: one block per row, math::decode_lloyd_row into the output row, then
// math::sign_decode_row adds the sign part in place (each thread re-reads only the columns it wrote).
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
  check_turbo_prod_decode_input(packed, norm, signs, levels, bits, d, signs_packed, tables, weight);
  const c10::cuda::CUDAGuard guard(packed.device());
  const at::Tensor pc = packed.contiguous(), sg = signs.contiguous(), lv = levels.contiguous();
  const at::Tensor nc = norm.to(lv.scalar_type()).contiguous();
  const at::Tensor spc = signs_packed.contiguous(), tc = tables.contiguous();
  const at::Tensor wc = weight.to(tc.scalar_type()).contiguous();
  const int64_t n = pc.size(0);
  at::Tensor out = at::empty({n, d}, lv.options());
  if (n == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(lv.scalar_type(), "turbo_prod_decode_cuda", [&] {
    const size_t smem = d * sizeof(scalar_t);
    auto kernel = turbo_prod_decode_kernel<scalar_t>;
    ensure_smem(reinterpret_cast<const void*>(kernel), smem);
    kernel<<<static_cast<unsigned int>(n), cuda::threads_for(d), smem, at::cuda::getCurrentCUDAStream()>>>(
        pc.const_data_ptr<uint8_t>(), nc.const_data_ptr<scalar_t>(), d, bits, rotation_of(sg),
        lv.const_data_ptr<scalar_t>(), spc.const_data_ptr<uint8_t>(), spc.size(1), tc.const_data_ptr<scalar_t>(),
        wc.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

// -------------------------------------------------------------------------------------------- min-max
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

at::Tensor pack_bits_cuda(const at::Tensor& codes, int64_t bits);

std::tuple<at::Tensor, at::Tensor, at::Tensor> minmax_encode_cuda(const at::Tensor& x, int64_t group, int64_t bits,
                                                                  at::ScalarType side_dtype) {
  check_minmax_encode_input(x, group, bits);
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xc = x.contiguous();
  const int64_t n = xc.size(0), d = xc.size(1), ng = d / group;
  const at::ScalarType acc = xc.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::ScalarType side = storage_dtype(x, side_dtype);
  at::Tensor codes = at::empty({n, d}, xc.options().dtype(at::kByte));
  at::Tensor lo = at::empty({n, ng}, xc.options().dtype(acc));
  at::Tensor step = at::empty({n, ng}, xc.options().dtype(acc));
  if (n > 0) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "minmax_encode_cuda", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      minmax_codes_kernel<scalar_t, acc_t><<<blocks_for(n * ng), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
          xc.const_data_ptr<scalar_t>(), n, d, group, bits, stored_of(side), codes.mutable_data_ptr<uint8_t>(),
          lo.mutable_data_ptr<acc_t>(), step.mutable_data_ptr<acc_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }
  return {pack_bits_cuda(codes, bits), lo.to(side), step.to(side)};
}

at::Tensor minmax_decode_cuda(const at::Tensor& packed, const at::Tensor& lo, const at::Tensor& scale, int64_t group,
                              int64_t bits, int64_t d) {
  check_minmax_decode_input(packed, lo, scale, group, bits, d);
  const c10::cuda::CUDAGuard guard(packed.device());
  const at::ScalarType acc = lo.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor pc = packed.contiguous(), lc = lo.to(acc).contiguous(), sc = scale.to(acc).contiguous();
  const int64_t n = pc.size(0);
  at::Tensor out = at::empty({n, d}, lc.options());
  if (n == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(acc, "minmax_decode_cuda", [&] {
    minmax_decode_kernel<scalar_t><<<blocks_for(n * d), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        pc.const_data_ptr<uint8_t>(), lc.const_data_ptr<scalar_t>(), sc.const_data_ptr<scalar_t>(), n, d, group, bits,
        out.mutable_data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

at::Tensor pack_bits_cuda(const at::Tensor& codes, int64_t bits) {
  check_pack_input(codes, bits);
  const c10::cuda::CUDAGuard guard(codes.device());
  const at::Tensor c = codes.contiguous();
  const int64_t n = c.size(0), d = c.size(1), nb = packed_bytes(d, bits);
  at::Tensor out = at::empty({n, nb}, c.options());
  if (n * nb == 0) return out;
  pack_bits_kernel<<<blocks_for(n * nb), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
      c.const_data_ptr<uint8_t>(), out.mutable_data_ptr<uint8_t>(), n, d, bits);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor unpack_bits_cuda(const at::Tensor& packed, int64_t bits, int64_t d) {
  check_unpack_input(packed, bits, d);
  const c10::cuda::CUDAGuard guard(packed.device());
  const at::Tensor p = packed.contiguous();
  const int64_t n = p.size(0);
  at::Tensor out = at::empty({n, d}, p.options());
  if (n * d == 0) return out;
  unpack_bits_kernel<<<blocks_for(n * d), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
      p.const_data_ptr<uint8_t>(), out.mutable_data_ptr<uint8_t>(), n, d, bits);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

// ------------------------------------------------------------------------------------- weighted sums
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

at::Tensor lloyd_weighted_sum_cuda(const at::Tensor& w, const at::Tensor& packed, const at::Tensor& norm,
                                   const at::Tensor& levels, int64_t bits, int64_t d) {
  check_lloyd_weighted_sum_input(w, packed, norm, levels, bits, d);
  const c10::cuda::CUDAGuard guard(w.device());
  const at::Tensor wc = w.contiguous(), pc = packed.contiguous(), lv = levels.contiguous();
  const at::Tensor nc = norm.to(wc.scalar_type()).contiguous();
  at::Tensor out = at::empty({wc.size(0), wc.size(1), d}, wc.options());
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(wc.scalar_type(), "lloyd_weighted_sum_cuda", [&] {
    launch_weighted_sum(weighted_level_params<scalar_t>(wc, pc, nc, lv, bits, out));
  });
  return out;
}

at::Tensor qjl_weighted_sum_cuda(const at::Tensor& w, const at::Tensor& packed, const at::Tensor& norm, double scale,
                                 int64_t m) {
  check_qjl_weighted_sum_input(w, packed, norm, m);
  const c10::cuda::CUDAGuard guard(w.device());
  const at::Tensor wc = w.contiguous(), pc = packed.contiguous();
  const at::Tensor kw = qjl_weights(norm, wc.scalar_type(), scale);
  at::Tensor out = at::empty({wc.size(0), wc.size(1), m}, wc.options());
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(wc.scalar_type(), "qjl_weighted_sum_cuda", [&] {
    launch_weighted_sum(weighted_level_params<scalar_t>(wc, pc, kw, at::Tensor(), 1, out));
  });
  return out;
}

at::Tensor minmax_weighted_sum_cuda(const at::Tensor& w, const at::Tensor& packed, const at::Tensor& lo,
                                    const at::Tensor& scale, int64_t group, int64_t bits, int64_t d) {
  check_minmax_weighted_sum_input(w, packed, lo, scale, group, bits, d);
  const c10::cuda::CUDAGuard guard(w.device());
  const at::Tensor wc = w.contiguous(), pc = packed.contiguous();
  const at::Tensor lc = lo.to(wc.scalar_type()).contiguous(), sc = scale.to(wc.scalar_type()).contiguous();
  at::Tensor out = at::empty({wc.size(0), wc.size(1), d}, wc.options());
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(wc.scalar_type(), "minmax_weighted_sum_cuda", [&] {
    launch_weighted_sum(weighted_minmax_params<scalar_t>(wc, pc, lc, sc, group, bits, out));
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(kvstats, CUDA, m) {
  m.impl("pack_bits", &pack_bits_cuda);
  m.impl("unpack_bits", &unpack_bits_cuda);
  m.impl("lloyd_encode", &lloyd_encode_cuda);
  m.impl("lloyd_decode", &lloyd_decode_cuda);
  m.impl("lloyd_scores", &lloyd_scores_cuda);
  m.impl("qjl_encode", &qjl_encode_cuda);
  m.impl("qjl_scores", &qjl_scores_cuda);
  m.impl("turbo_prod_encode", &turbo_prod_encode_cuda);
  m.impl("turbo_prod_scores", &turbo_prod_scores_cuda);
  m.impl("minmax_encode", &minmax_encode_cuda);
  m.impl("minmax_decode", &minmax_decode_cuda);
  m.impl("sign_decode", &sign_decode_cuda);
  m.impl("turbo_prod_decode", &turbo_prod_decode_cuda);
  m.impl("lloyd_weighted_sum", &lloyd_weighted_sum_cuda);
  m.impl("qjl_weighted_sum", &qjl_weighted_sum_cuda);
  m.impl("minmax_weighted_sum", &minmax_weighted_sum_cuda);
}

}  // namespace kvstats
