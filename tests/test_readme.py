"""The README's code runs as printed (it is what a newcomer copies first)."""

import re
from pathlib import Path


def test_readme_example_runs():
    readme = Path(__file__).resolve().parents[1] / "README.md"
    blocks = re.findall(r"```python\n(.*?)```", readme.read_text(), re.S)
    assert blocks, "README.md has no python example"
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(readme), "exec"), namespace)
    assert namespace["kl"]["kqv"].median() < namespace["kl"]["qkqv"].median()
