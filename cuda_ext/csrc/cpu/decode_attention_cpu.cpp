// decode_attention on the CPU: the composition (decode_attention.h) of the fast CPU kernels.
#include <torch/library.h>

#include "../decode_attention.h"

namespace kvstats {

TORCH_LIBRARY_IMPL(kvstats, CPU, m) { m.impl("decode_attention", &decode_attention<OpNamespace::kFast>); }

}  // namespace kvstats
