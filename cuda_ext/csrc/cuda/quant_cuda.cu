// CUDA kernels of the quantizer ops, registered under the same names as the CPU kernels.
// Layout of packed codes: bitpack.h. Rotation: device_utils.cuh. Each op checks its inputs with the
// shared check_* functions, runs under a device guard on the current stream, and allocates its outputs
// from the inputs' options.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include "../bitpack.h"
#include "../kernels.h"
#include "device_utils.cuh"

namespace kvstats {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunkRows = 65536;  // rows per chunk where a scratch residual is needed

unsigned int blocks_for(int64_t n, int threads = kThreads) {
  return static_cast<unsigned int>((n + threads - 1) / threads);
}

// v rounded to the precision it is stored in (0: fp32, 1: fp16, 2: bf16, 3: keep).
template <typename acc_t>
__device__ __forceinline__ acc_t round_stored(acc_t v, int mode) {
  if (mode == 0) return static_cast<acc_t>(static_cast<float>(v));
  if (mode == 1) return static_cast<acc_t>(static_cast<float>(c10::Half(static_cast<float>(v))));
  if (mode == 2) return static_cast<acc_t>(static_cast<float>(c10::BFloat16(static_cast<float>(v))));
  return v;
}

int round_mode(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return 0;
    case at::kHalf: return 1;
    case at::kBFloat16: return 2;
    default: return 3;
  }
}

// ------------------------------------------------------------------------------------------ packing
// One thread per output byte: no atomics, codes read from a [rows, d] array (global or shared).
template <typename CodeFn>
__device__ __forceinline__ void pack_row(uint8_t* out, int64_t d, int64_t bits, const CodeFn& code_at) {
  const int64_t nb = packed_bytes(d, bits);
  for (int64_t k = threadIdx.x; k < nb; k += blockDim.x) out[k] = pack_byte(code_at, d, bits, k);
}

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

// Sign bits of proj [n, m] (bit 1 for >= 0), one thread per output byte.
template <typename acc_t>
__global__ void pack_signs_kernel(const acc_t* __restrict__ proj, uint8_t* __restrict__ out, int64_t n, int64_t m) {
  const int64_t mb = packed_bytes(m, 1);
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= n * mb) return;
  const int64_t r = t / mb, k = t % mb;
  const acc_t* row = proj + r * m;
  auto sign_at = [&](int64_t i) { return static_cast<uint32_t>(row[i] >= acc_t(0)); };
  out[t] = pack_byte(sign_at, m, 1, k);
}

// --------------------------------------------------------------------------------- Lloyd encode/decode
// One block per row. Shared memory: d accumulators, d code bytes, 32 reduction slots.
// With residual != nullptr (TurboQuant_prod) it also writes r = Pi x − |x|_stored·levels[codes] and |r|.
template <typename scalar_t, typename acc_t>
__global__ void lloyd_encode_kernel(const scalar_t* __restrict__ x, int64_t d, const acc_t* __restrict__ signs,
                                    int64_t passes, int64_t block, const acc_t* __restrict__ thresholds, int64_t bits,
                                    uint8_t* __restrict__ packed, acc_t* __restrict__ norm_out,
                                    const acc_t* __restrict__ levels, int mode, acc_t* __restrict__ residual,
                                    acc_t* __restrict__ gamma_out) {
  extern __shared__ unsigned char smem_raw[];
  acc_t* buf = reinterpret_cast<acc_t*>(smem_raw);
  acc_t* scratch = buf + d;
  uint8_t* codes = reinterpret_cast<uint8_t*>(scratch + 32);
  const int64_t row = blockIdx.x;
  const scalar_t* xr = x + row * d;
  acc_t partial = 0;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const acc_t v = static_cast<acc_t>(xr[j]);
    buf[j] = v;
    partial += v * v;
  }
  const acc_t norm = sqrt(cuda::block_sum(partial, scratch));
  __syncthreads();
  cuda::smem_rotate_forward(buf, d, signs, passes, block);
  const acc_t denom = norm > 0 ? norm : acc_t(1);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
    codes[j] = static_cast<uint8_t>(cell_index(buf[j] / denom, thresholds, bits));
  __syncthreads();
  auto code_at = [&](int64_t i) { return static_cast<uint32_t>(codes[i]); };
  pack_row(packed + row * packed_bytes(d, bits), d, bits, code_at);
  if (threadIdx.x == 0) norm_out[row] = norm;
  if (residual == nullptr) return;
  const acc_t stored = round_stored(norm, mode);
  acc_t rr = 0;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const acc_t r = buf[j] - levels[codes[j]] * stored;
    residual[row * d + j] = r;
    rr += r * r;
  }
  const acc_t g = sqrt(cuda::block_sum(rr, scratch));
  if (threadIdx.x == 0) gamma_out[row] = g;
}

template <typename acc_t>
__global__ void lloyd_decode_kernel(const uint8_t* __restrict__ packed, const acc_t* __restrict__ norm, int64_t d,
                                    int64_t bits, const acc_t* __restrict__ signs, int64_t passes, int64_t block,
                                    const acc_t* __restrict__ levels, acc_t* __restrict__ out) {
  extern __shared__ unsigned char smem_raw[];
  acc_t* buf = reinterpret_cast<acc_t*>(smem_raw);
  const int64_t row = blockIdx.x, nb = packed_bytes(d, bits);
  const uint8_t* pr = packed + row * nb;
  const acc_t nr = norm[row];
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) buf[j] = levels[unpack_code(pr, nb, bits, j)] * nr;
  __syncthreads();
  cuda::smem_rotate_inverse(buf, d, signs, passes, block);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) out[row * d + j] = buf[j];
}

size_t encode_smem(int64_t d, size_t acc_size) { return (d + 32) * acc_size + d; }

void ensure_smem(const void* kernel, size_t smem) {
  if (smem > 48 * 1024)
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
}

std::tuple<at::Tensor, at::Tensor> lloyd_encode_cuda(const at::Tensor& x, const at::Tensor& signs,
                                                     const at::Tensor& thresholds, int64_t bits,
                                                     at::ScalarType norm_dtype) {
  check_lloyd_encode_input(x, signs, thresholds, bits);
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xc = x.contiguous(), sg = signs.contiguous(), th = thresholds.contiguous();
  const int64_t n = xc.size(0), d = xc.size(1), nb = packed_bytes(d, bits);
  const int64_t passes = sg.size(0), block = passes > 0 ? sg.size(1) : 0;
  at::Tensor packed = at::empty({n, nb}, xc.options().dtype(at::kByte));
  at::Tensor norm = at::empty({n}, xc.options().dtype(th.scalar_type()));
  if (n == 0) return {packed, norm.to(storage_dtype(x, norm_dtype))};
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "lloyd_encode_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const size_t smem = encode_smem(d, sizeof(acc_t));
    auto kernel = lloyd_encode_kernel<scalar_t, acc_t>;
    ensure_smem(reinterpret_cast<const void*>(kernel), smem);
    kernel<<<static_cast<unsigned int>(n), cuda::threads_for(d), smem, stream>>>(
        xc.const_data_ptr<scalar_t>(), d, sg.const_data_ptr<acc_t>(), passes, block, th.const_data_ptr<acc_t>(), bits,
        packed.mutable_data_ptr<uint8_t>(), norm.mutable_data_ptr<acc_t>(), nullptr, 3, nullptr, nullptr);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
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
  const int64_t passes = sg.size(0), block = passes > 0 ? sg.size(1) : 0;
  at::Tensor out = at::empty({n, d}, lv.options());
  if (n == 0) return out;
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(lv.scalar_type(), "lloyd_decode_cuda", [&] {
    const size_t smem = d * sizeof(scalar_t);
    auto kernel = lloyd_decode_kernel<scalar_t>;
    ensure_smem(reinterpret_cast<const void*>(kernel), smem);
    kernel<<<static_cast<unsigned int>(n), cuda::threads_for(d), smem, stream>>>(
        pc.const_data_ptr<uint8_t>(), nc.const_data_ptr<scalar_t>(), d, bits, sg.const_data_ptr<scalar_t>(), passes,
        block, lv.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

// --------------------------------------------------------------------------------------------- scores
// Grid (ceil(n_k / kThreads), n_q, G); one thread per key. The query (and its sketch) and the
// codebook levels are staged in shared memory; each thread walks its key's packed codes.
template <typename acc_t>
__global__ void scores_kernel(const acc_t* __restrict__ q, const uint8_t* __restrict__ packed,
                              const acc_t* __restrict__ mse_w, const acc_t* __restrict__ levels, int64_t bits,
                              const acc_t* __restrict__ qs, const uint8_t* __restrict__ sign_packed,
                              const acc_t* __restrict__ qjl_w, int64_t m, int64_t nq, int64_t nk, int64_t d,
                              acc_t* __restrict__ out) {
  extern __shared__ unsigned char smem_raw[];
  acc_t* sq = reinterpret_cast<acc_t*>(smem_raw);
  acc_t* slv = sq + d;
  acc_t* sqs = slv + (packed ? (int64_t{1} << bits) : 0);
  const int64_t g = blockIdx.z, i = blockIdx.y;
  if (packed) {
    for (int64_t t = threadIdx.x; t < d; t += blockDim.x) sq[t] = q[(g * nq + i) * d + t];
    for (int64_t t = threadIdx.x; t < (int64_t{1} << bits); t += blockDim.x) slv[t] = levels[t];
  }
  if (qs) for (int64_t t = threadIdx.x; t < m; t += blockDim.x) sqs[t] = qs[(g * nq + i) * m + t];
  __syncthreads();
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= nk) return;
  acc_t s = 0;
  if (packed) {
    const int64_t nb = packed_bytes(d, bits);
    const uint8_t* row = packed + (g * nk + j) * nb;
    for (int64_t t = 0; t < d; ++t) s += sq[t] * slv[unpack_code(row, nb, bits, t)];
    s *= mse_w[g * nk + j];
  }
  if (qs) {
    const int64_t mb = packed_bytes(m, 1);
    const uint8_t* row = sign_packed + (g * nk + j) * mb;
    acc_t t_sum = 0;
    for (int64_t t = 0; t < m; ++t) t_sum += ((row[t >> 3] >> (t & 7)) & 1) ? sqs[t] : -sqs[t];
    s += qjl_w[g * nk + j] * t_sum;
  }
  out[(g * nq + i) * nk + j] = s;
}

template <typename acc_t>
void launch_scores(const acc_t* q, const uint8_t* packed, const acc_t* mse_w, const acc_t* levels, int64_t bits,
                   const acc_t* qs, const uint8_t* sign_packed, const acc_t* qjl_w, int64_t m, int64_t G, int64_t nq,
                   int64_t nk, int64_t d, acc_t* out) {
  TORCH_CHECK(G <= 65535 && nq <= 65535, "scores: G and n_q must be at most 65535 on CUDA, got ", G, ", ", nq);
  const size_t smem = ((packed ? d + (int64_t{1} << bits) : 0) + (qs ? m : 0)) * sizeof(acc_t);
  auto kernel = scores_kernel<acc_t>;
  ensure_smem(reinterpret_cast<const void*>(kernel), smem);
  const dim3 grid(blocks_for(nk), static_cast<unsigned int>(nq), static_cast<unsigned int>(G));
  kernel<<<grid, kThreads, smem, at::cuda::getCurrentCUDAStream()>>>(q, packed, mse_w, levels, bits, qs, sign_packed,
                                                                      qjl_w, m, nq, nk, d, out);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor lloyd_scores_cuda(const at::Tensor& q, const at::Tensor& packed, const at::Tensor& norm,
                             const at::Tensor& levels, int64_t bits) {
  check_lloyd_scores_input(q, packed, norm, levels, bits);
  const c10::cuda::CUDAGuard guard(q.device());
  const at::Tensor qc = q.contiguous(), pc = packed.contiguous(), lv = levels.contiguous();
  const at::Tensor nc = norm.to(qc.scalar_type()).contiguous();
  const int64_t G = qc.size(0), nq = qc.size(1), d = qc.size(2), nk = pc.size(1);
  at::Tensor out = at::empty({G, nq, nk}, qc.options());
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(qc.scalar_type(), "lloyd_scores_cuda", [&] {
    launch_scores<scalar_t>(qc.const_data_ptr<scalar_t>(), pc.const_data_ptr<uint8_t>(), nc.const_data_ptr<scalar_t>(),
                            lv.const_data_ptr<scalar_t>(), bits, nullptr, nullptr, nullptr, 0, G, nq, nk, d,
                            out.mutable_data_ptr<scalar_t>());
  });
  return out;
}

at::Tensor qjl_scores_cuda(const at::Tensor& q_sketch, const at::Tensor& packed, const at::Tensor& norm,
                           double scale) {
  check_qjl_scores_input(q_sketch, packed, norm);
  const c10::cuda::CUDAGuard guard(q_sketch.device());
  const at::Tensor qc = q_sketch.contiguous(), pc = packed.contiguous();
  const at::Tensor wc = (norm.to(qc.scalar_type()) * scale).contiguous();
  const int64_t G = qc.size(0), nq = qc.size(1), m = qc.size(2), nk = pc.size(1);
  at::Tensor out = at::empty({G, nq, nk}, qc.options());
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(qc.scalar_type(), "qjl_scores_cuda", [&] {
    launch_scores<scalar_t>(nullptr, nullptr, nullptr, nullptr, 1, qc.const_data_ptr<scalar_t>(),
                            pc.const_data_ptr<uint8_t>(), wc.const_data_ptr<scalar_t>(), m, G, nq, nk, 0,
                            out.mutable_data_ptr<scalar_t>());
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
  const at::Tensor gc = (gamma.to(qc.scalar_type()) * scale).contiguous();
  const int64_t G = qc.size(0), nq = qc.size(1), d = qc.size(2), nk = pc.size(1), m = qsc.size(2);
  at::Tensor out = at::empty({G, nq, nk}, qc.options());
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(qc.scalar_type(), "turbo_prod_scores_cuda", [&] {
    launch_scores<scalar_t>(qc.const_data_ptr<scalar_t>(), pc.const_data_ptr<uint8_t>(), nc.const_data_ptr<scalar_t>(),
                            lv.const_data_ptr<scalar_t>(), bits, qsc.const_data_ptr<scalar_t>(),
                            spc.const_data_ptr<uint8_t>(), gc.const_data_ptr<scalar_t>(), m, G, nq, nk, d,
                            out.mutable_data_ptr<scalar_t>());
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
  return {packed, at::linalg_vector_norm(xa, 2, {1}).to(storage_dtype(x, norm_dtype))};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> turbo_prod_encode_cuda(
    const at::Tensor& x, const at::Tensor& signs, const at::Tensor& thresholds, const at::Tensor& levels,
    int64_t bits, const at::Tensor& sketch, at::ScalarType norm_dtype) {
  check_turbo_prod_encode_input(x, signs, thresholds, levels, bits, sketch);
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xc = x.contiguous(), sg = signs.contiguous(), th = thresholds.contiguous();
  const at::Tensor lv = levels.contiguous(), sk = sketch.contiguous();
  const int64_t n = xc.size(0), d = xc.size(1), nb = packed_bytes(d, bits), mb = packed_bytes(sk.size(0), 1);
  const int64_t passes = sg.size(0), block = passes > 0 ? sg.size(1) : 0;
  const at::ScalarType stored = storage_dtype(x, norm_dtype);
  at::Tensor packed = at::empty({n, nb}, xc.options().dtype(at::kByte));
  at::Tensor sign_packed = at::empty({n, mb}, xc.options().dtype(at::kByte));
  at::Tensor norm = at::empty({n}, xc.options().dtype(th.scalar_type()));
  at::Tensor gamma = at::empty({n}, xc.options().dtype(th.scalar_type()));
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "turbo_prod_encode_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const size_t smem = encode_smem(d, sizeof(acc_t));
    auto kernel = lloyd_encode_kernel<scalar_t, acc_t>;
    ensure_smem(reinterpret_cast<const void*>(kernel), smem);
    // The residual of one chunk at a time: extra memory bounded by kChunkRows * (d + m) values.
    at::Tensor residual = at::empty({std::min(n, kChunkRows), d}, th.options());
    for (int64_t c0 = 0; c0 < n; c0 += kChunkRows) {
      const int64_t rows = std::min(kChunkRows, n - c0);
      kernel<<<static_cast<unsigned int>(rows), cuda::threads_for(d), smem, stream>>>(
          xc.const_data_ptr<scalar_t>() + c0 * d, d, sg.const_data_ptr<acc_t>(), passes, block,
          th.const_data_ptr<acc_t>(), bits, packed.mutable_data_ptr<uint8_t>() + c0 * nb,
          norm.mutable_data_ptr<acc_t>() + c0, lv.const_data_ptr<acc_t>(), round_mode(stored),
          residual.mutable_data_ptr<acc_t>(), gamma.mutable_data_ptr<acc_t>() + c0);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      sign_packed.narrow(0, c0, rows).copy_(pack_signs(at::matmul(residual.narrow(0, 0, rows), sk.t()).contiguous()));
    }
  });
  return {packed, norm.to(stored), sign_packed, gamma.to(stored)};
}

// -------------------------------------------------------------------------------------------- min-max
// One thread per group: min, max, stored offset and step, codes into a [n, d] byte array; then packing.
template <typename scalar_t, typename acc_t>
__global__ void minmax_codes_kernel(const scalar_t* __restrict__ x, int64_t n, int64_t d, int64_t group, int64_t bits,
                                    int mode, uint8_t* __restrict__ codes, acc_t* __restrict__ lo_out,
                                    acc_t* __restrict__ step_out) {
  const int64_t ng = d / group;
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= n * ng) return;
  const scalar_t* gx = x + (t / ng) * d + (t % ng) * group;
  acc_t lo = static_cast<acc_t>(gx[0]), hi = lo;
  for (int64_t j = 1; j < group; ++j) {
    const acc_t v = static_cast<acc_t>(gx[j]);
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  const acc_t top = static_cast<acc_t>((int64_t{1} << bits) - 1);
  const acc_t lo_s = round_stored(lo, mode);
  const acc_t step = round_stored((hi - lo) / top, mode);
  uint8_t* gc = codes + (t / ng) * d + (t % ng) * group;
  for (int64_t j = 0; j < group; ++j) {
    acc_t c = 0;
    if (step > 0) {
      c = nearbyint((static_cast<acc_t>(gx[j]) - lo_s) / step);
      c = c < 0 ? acc_t(0) : (c > top ? top : c);
    }
    gc[j] = static_cast<uint8_t>(c);
  }
  lo_out[t] = lo_s;
  step_out[t] = step;
}

template <typename acc_t>
__global__ void minmax_decode_kernel(const uint8_t* __restrict__ packed, const acc_t* __restrict__ lo,
                                     const acc_t* __restrict__ step, int64_t n, int64_t d, int64_t group,
                                     int64_t bits, acc_t* __restrict__ out) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= n * d) return;
  const int64_t r = t / d, j = t % d, nb = packed_bytes(d, bits), gi = r * (d / group) + j / group;
  out[t] = lo[gi] + step[gi] * static_cast<acc_t>(unpack_code(packed + r * nb, nb, bits, j));
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
          xc.const_data_ptr<scalar_t>(), n, d, group, bits, round_mode(side), codes.mutable_data_ptr<uint8_t>(),
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
}

}  // namespace kvstats
