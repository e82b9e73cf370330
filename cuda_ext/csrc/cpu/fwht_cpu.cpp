// CPU kernel of the orthonormal fast Walsh–Hadamard transform (Sylvester order).
// One vector per task: load into an fp32 (fp64 for double) buffer, log2(d) in-place butterfly stages,
// scale by 1/sqrt(d), store in the input dtype. Vectors are independent, so at::parallel_for splits
// the batch across OpenMP threads.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

#include "../prologue/fwht.h"
#include "wht.h"

namespace kvstats {
namespace {

template <typename scalar_t>
void fwht_rows(const scalar_t* x, scalar_t* y, int64_t rows, int64_t d) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t scale = math::wht_scale<acc_t>(d);
  // Grain: about 16K elements per task so small batches stay on one thread.
  const int64_t grain = std::max<int64_t>(1, 16384 / d);
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> buf(d);
    for (int64_t r = begin; r < end; ++r) {
      const scalar_t* xr = x + r * d;
      scalar_t* yr = y + r * d;
      for (int64_t j = 0; j < d; ++j) buf[j] = static_cast<acc_t>(xr[j]);
      cpu::butterfly_inplace(buf.data(), d);
      for (int64_t j = 0; j < d; ++j) yr[j] = static_cast<scalar_t>(buf[j] * scale);
    }
  });
}

}  // namespace

at::Tensor fwht_cpu(const at::Tensor& x) {
  const FwhtArgs a = fwht_prologue(x);
  TORCH_CHECK_VALUE(x.device().is_cpu(), "fwht_cpu: x must be a CPU tensor, got ", x.device());
  if (a.rows == 0) return a.y;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.x.scalar_type(), "fwht_cpu", [&] {
    fwht_rows<scalar_t>(a.x.const_data_ptr<scalar_t>(), a.y.mutable_data_ptr<scalar_t>(), a.rows, a.d);
  });
  return a.y;
}

TORCH_LIBRARY_IMPL(kvstats, CPU, m) {
  m.impl("fwht", &fwht_cpu);
}

}  // namespace kvstats
