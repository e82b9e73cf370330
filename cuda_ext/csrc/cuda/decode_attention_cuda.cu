// decode_attention on CUDA tensors: the composition (decode_attention.h) of the CUDA kernels, each launched
// on the current stream by its own op; nothing here runs on the device itself.
#include <torch/library.h>

#include "../decode_attention.h"

namespace kvstats {

TORCH_LIBRARY_IMPL(kvstats, CUDA, m) { m.impl("decode_attention", &decode_attention<OpNamespace::kFast>); }

}  // namespace kvstats
