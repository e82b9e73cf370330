import pytest
import torch

from kvstats.quant import ops


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available() and ops.HAS_EXTENSION:
        return
    reason = "needs a CUDA device and the built extension"
    for item in items:
        if "tests/gpu" in str(item.fspath):
            item.add_marker(pytest.mark.skip(reason=reason))
