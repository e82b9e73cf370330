// The op library: its two namespaces, both declared from the one schema list (schemas.h). Each backend's
// kernels register themselves in their own files (TORCH_LIBRARY_IMPL): the CPU fast kernels (cpu/) and
// the CUDA kernels (cuda/) under `kvstats`, the GPU's row programs run on the CPU (shared/) under
// `kvstats_shared`. Importing kvstats._C only loads this library: the module has no methods.
#include <Python.h>
#include <torch/library.h>

#include "schemas.h"

namespace kvstats {

TORCH_LIBRARY(kvstats, m) { define_ops(m); }

TORCH_LIBRARY(kvstats_shared, m) { define_ops(m); }

}  // namespace kvstats

extern "C" {
// Importing kvstats._C loads the shared object, which runs the TORCH_LIBRARY static initialisers.
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
}
