// CPU kernels of the QJL sketch: encode (norm, S x by GEMM per block of rows, signs packed 8 per byte)
// and scores straight from the packed signs (score_codes.h).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

#include "../bitpack.h"
#include "../prologue/qjl.h"
#include "common_cpu.h"
#include "score_codes.h"

namespace kvstats {

std::tuple<at::Tensor, at::Tensor> qjl_encode_cpu(const at::Tensor& x, const at::Tensor& sketch,
                                                  at::ScalarType norm_dtype) {
  const QjlEncodeArgs a = qjl_encode_prologue(x, sketch, norm_dtype);
  const int64_t n = a.n, d = a.d, m = a.m, mb = a.mb;
  const int64_t blocks = (n + cpu::kSketchBlock - 1) / cpu::kSketchBlock;
  AT_DISPATCH_FLOATING_TYPES(a.sketch.scalar_type(), "qjl_encode_cpu", [&] {
    uint8_t* pp = a.packed.mutable_data_ptr<uint8_t>();
    scalar_t* np = a.norm.mutable_data_ptr<scalar_t>();
    // Per task: a block of rows in the sketch's dtype and its projection; nothing of size n is allocated.
    // The workers run ATen ops (conversion, BLAS), so they take the caller's thread-local state.
    cpu::parallel_for_tls(0, blocks, 1, [&](int64_t begin, int64_t end) {
      at::Tensor proj = at::empty({std::min(n, cpu::kSketchBlock), m}, a.sketch.options());
      std::vector<scalar_t> buf(d);
      for (int64_t b = begin; b < end; ++b) {
        const int64_t r0 = b * cpu::kSketchBlock, k = std::min(cpu::kSketchBlock, n - r0);
        const at::Tensor y = a.x.narrow(0, r0, k).to(a.sketch.scalar_type()).contiguous();
        const scalar_t* yp = y.const_data_ptr<scalar_t>();
        // ‖x‖ without overflow (scaled by 2^-e before squaring): math::load_scaled, as the GPU.
        for (int64_t r = 0; r < k; ++r) np[r0 + r] = math::load_scaled(yp + r * d, d, buf.data(), math::SerialLanes{}).norm();
        cpu::sketch_signs_block<scalar_t>(y, a.sketch, proj, pp + r0 * mb);
      }
    });
  });
  return a.result();
}

at::Tensor qjl_scores_cpu(const at::Tensor& q_sketch, const at::Tensor& packed, const at::Tensor& norm,
                          double scale) {
  const QjlScoresArgs a = qjl_scores_prologue(q_sketch, packed, norm, scale, &qjl_weights_cpu);
  AT_DISPATCH_FLOATING_TYPES(a.q_sketch.scalar_type(), "qjl_scores_cpu", [&] {
    const auto keys = cpu::with_signs(cpu::PackedKeys<scalar_t>{}, a.packed, a.key_w, a.q_sketch.size(2));
    cpu::score_packed(keys, at::Tensor(), a.q_sketch, a.out);
  });
  return a.out;
}

TORCH_LIBRARY_IMPL(kvstats, CPU, m) {
  m.impl("qjl_encode", &qjl_encode_cpu);
  m.impl("qjl_scores", &qjl_scores_cpu);
}

}  // namespace kvstats
