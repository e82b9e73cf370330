// The op library `kvstats`: schemas declared once, CPU kernels registered here; the CUDA kernels
// register the same names in csrc/cuda/*.cu. Importing kvstats._C only loads this library.
#include <Python.h>
#include <torch/library.h>

#include "kernels.h"

extern "C" {
// Importing kvstats._C loads the shared object, which runs the TORCH_LIBRARY static initialisers.
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
}

namespace kvstats {

void check_fwht_input(const at::Tensor& x) {
  TORCH_CHECK(x.dim() >= 1, "fwht: x must have at least one dimension, got a 0-d tensor");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kHalf ||
                  x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kDouble,
              "fwht: x must be float16, bfloat16, float32 or float64, got ", x.scalar_type());
  const int64_t d = x.size(-1);
  TORCH_CHECK(d >= 2 && d <= kMaxFwhtDim && (d & (d - 1)) == 0,
              "fwht: the last dimension must be a power of two in [2, ", kMaxFwhtDim, "], got ", d);
}

TORCH_LIBRARY(kvstats, m) {
  // Orthonormal Walsh–Hadamard transform along the last axis: y = x · H_d / sqrt(d).
  m.def("fwht(Tensor x) -> Tensor");
}

TORCH_LIBRARY_IMPL(kvstats, CPU, m) { m.impl("fwht", &fwht_cpu); }

}  // namespace kvstats
