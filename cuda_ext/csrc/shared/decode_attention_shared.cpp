// decode_attention on the kvstats_shared backend: the composition (decode_attention.h) of the GPU's row programs
// run on the CPU, so that a test on the CPU checks the ops the CUDA registration calls.
#include <torch/library.h>

#include "../decode_attention.h"

namespace kvstats {

TORCH_LIBRARY_IMPL(kvstats_shared, CPU, m) { m.impl("decode_attention", &decode_attention<OpNamespace::kShared>); }

}  // namespace kvstats
