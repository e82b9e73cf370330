// CUDA kernels of dense bit packing (layout: bitpack.h): one thread per output byte when packing (no atomics),
// one per code when unpacking. Each op runs its prologue (prologue/pack.h), then launches on the current stream
// under a device guard.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../bitpack.h"
#include "../prologue/pack.h"
#include "device_utils.cuh"
#include "row_kernels.cuh"

namespace kvstats {
namespace {

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

at::Tensor pack_bits_cuda(const at::Tensor& codes, int64_t bits) {
  const BitPackArgs a = pack_bits_prologue(codes, bits);
  const c10::cuda::CUDAGuard guard(a.codes.device());
  cuda::pack_codes(a.codes, bits, a.packed);
  return a.packed;
}

at::Tensor unpack_bits_cuda(const at::Tensor& packed, int64_t bits, int64_t d) {
  const BitPackArgs a = unpack_bits_prologue(packed, bits, d);
  const c10::cuda::CUDAGuard guard(a.packed.device());
  if (a.n * d == 0) return a.codes;
  unpack_bits_kernel<<<cuda::blocks_for(a.n * d), cuda::kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
      a.packed.const_data_ptr<uint8_t>(), a.codes.mutable_data_ptr<uint8_t>(), a.n, d, bits);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return a.codes;
}

}  // namespace

namespace cuda {

void pack_codes(const at::Tensor& codes, int64_t bits, const at::Tensor& out) {
  const int64_t n = codes.size(0), d = codes.size(1), nb = out.size(1);
  if (n * nb == 0) return;
  pack_bits_kernel<<<blocks_for(n * nb), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
      codes.const_data_ptr<uint8_t>(), out.mutable_data_ptr<uint8_t>(), n, d, bits);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace cuda

TORCH_LIBRARY_IMPL(kvstats, CUDA, m) {
  m.impl("pack_bits", &pack_bits_cuda);
  m.impl("unpack_bits", &unpack_bits_cuda);
}

}  // namespace kvstats
