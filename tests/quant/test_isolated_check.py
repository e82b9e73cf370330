"""check_quantizer(isolated=True) called from a user's script: the fresh process does not run the script again.

Three scripts, each run as ``python script.py`` in its own folder: without an ``if __name__ == "__main__"`` guard
and with the quantizer imported from a module (the check passes, the script's output appears once); without the
guard and with the quantizer defined in the script (refused, naming the guard, instead of running the script
again); with the guard and the quantizer defined in the script (the check passes through multiprocessing's spawn).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

MODULE = """
import torch
from kvstats.quant.quantizers.base import BitBudget, Code, Quantizer


class Int4(Quantizer):
    name = "user_int4"

    def _encode(self, x):
        s = x.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 7
        return Code(x.shape, x.dtype, payload={"q": torch.round(x / s).clamp(-7, 7).to(torch.int8)},
                    scalars={"s": s.squeeze(-1).to(torch.float32)})

    def _decode(self, code):
        return code.payload["q"].float() * code.scalars["s"].unsqueeze(-1)

    def bits_per_coordinate(self, n_tokens=None):
        return BitBudget(payload=8.0, side=32 / self.dim)
"""

CHECK = """
from kvstats.measure.testing import check_quantizer
print("RUN")
try:
    check_quantizer(Int4(4, 32), build=Int4, isolated=True)
    print("PASS")
except AssertionError as exc:
    print("FAIL", exc)
"""


def _run(folder, script: str) -> str:
    (folder / "script.py").write_text(textwrap.dedent(script), encoding="utf-8")
    done = subprocess.run([sys.executable, "script.py"], cwd=folder, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.slow
def test_an_unguarded_script_with_an_imported_quantizer_runs_once_and_passes(tmp_path):
    (tmp_path / "usermod.py").write_text(MODULE, encoding="utf-8")
    out = _run(tmp_path, "from usermod import Int4\n" + CHECK)
    assert out.split() == ["RUN", "PASS"]  # the script ran once: no second RUN, no spurious FAIL


@pytest.mark.slow
def test_an_unguarded_script_defining_the_quantizer_is_told_about_the_guard(tmp_path):
    out = _run(tmp_path, MODULE + CHECK)
    assert out.count("RUN") == 1 and "FAIL" in out and "PASS" not in out
    assert 'has no `if __name__ == "__main__":` guard' in out and "script.py" in out


@pytest.mark.slow
def test_a_guarded_script_defining_the_quantizer_passes(tmp_path):
    guarded = MODULE + "\n\nif __name__ == \"__main__\":\n" + textwrap.indent(textwrap.dedent(CHECK), "    ")
    out = _run(tmp_path, guarded)
    assert out.split() == ["RUN", "PASS"]
