// The kvstats_shared backend's Walsh–Hadamard transform (common_shared.h): math::fwht_row with one serial
// lane per row, as the CUDA kernel with one thread block per row (cuda/fwht_cuda.cu).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include <vector>

#include "../prologue/fwht.h"
#include "common_shared.h"

namespace kvstats {
namespace shared {
namespace {

at::Tensor fwht(const at::Tensor& x) {
  const FwhtArgs a = fwht_prologue(x);
  const int64_t d = a.d;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.x.scalar_type(), "fwht_shared", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = a.x.const_data_ptr<scalar_t>();
    scalar_t* yp = a.y.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, a.rows, row_grain(d), [&](int64_t begin, int64_t end) {
      std::vector<acc_t> buf(d);
      for (int64_t r = begin; r < end; ++r) math::fwht_row(xp + r * d, yp + r * d, d, buf.data(), Lane{});
    });
  });
  return a.y;
}

}  // namespace
}  // namespace shared

TORCH_LIBRARY_IMPL(kvstats_shared, CPU, m) { m.impl("fwht", &shared::fwht); }

}  // namespace kvstats
