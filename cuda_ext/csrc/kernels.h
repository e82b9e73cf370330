// Declarations of the kvstats kernels shared by ops.cpp (schemas + CPU registration) and the CUDA files.
#pragma once

#include <ATen/ATen.h>

namespace kvstats {

// Largest head dimension the Walsh–Hadamard kernels accept (2^15).
constexpr int64_t kMaxFwhtDim = 32768;

// Shared input checks of fwht, used by the CPU and CUDA kernels alike.
void check_fwht_input(const at::Tensor& x);

at::Tensor fwht_cpu(const at::Tensor& x);

}  // namespace kvstats
