"""The tiers of the tree (docs/design_notes.md): every import inside kvstats goes down the list — run → hf → measure →
quant → data → the private helpers — never up; no module-level import circle; kvstats' own code uses the tiered
names, and the short names users import (``kvstats.stats``, ``kvstats.cache``, ...) are the very same modules."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import kvstats

ROOT = Path(kvstats.__file__).resolve().parent
#: tier of a module by its name's prefix (longest first), lowest first
TIERS = {"base": 0, "data": 1, "quant": 2, "measure": 3, "hf": 4, "run": 5}
PREFIXES = [("kvstats.data", "data"), ("kvstats.quant", "quant"), ("kvstats.measure", "measure"), ("kvstats.hf", "hf"),
            ("kvstats.run", "run"), ("kvstats", "base")]


def tier(module: str) -> str:
    return next(t for prefix, t in PREFIXES if module == prefix or module.startswith(prefix + "."))


def modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = set(modules())


def imports(path: Path, *, top_level_only: bool = False) -> list[tuple[int, str]]:
    """(line, imported kvstats module) of every import statement (or only the module-level ones)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = []
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "kvstats":
            if node.module == "kvstats":  # from kvstats import X: X is a module or one of kvstats' lazy names
                for alias in node.names:
                    name = alias.name
                    target = kvstats._FUNCTIONS.get(name) or kvstats.SHORT_NAMES.get(f"kvstats.{name}")
                    found.append((node.lineno, target or ("kvstats" if name.startswith("_") and name != "_C"
                                                          else f"kvstats.{name}")))
            else:  # from pkg import submodule imports the submodule (the package is its parent, not its import)
                subs = [f"{node.module}.{alias.name}" for alias in node.names]
                found += [(node.lineno, sub) for sub in subs if sub in MODULES] or [(node.lineno, node.module)]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "kvstats"]
    return found


def test_every_import_goes_down_the_tiers():
    wrong = []
    for name, path in modules().items():
        for line, target in imports(path):
            if TIERS[tier(target)] > TIERS[tier(name)]:
                wrong.append(f"{path.relative_to(ROOT.parent)}:{line}: {name} ({tier(name)}) imports {target} "
                             f"({tier(target)})")
    assert not wrong, "imports that go up the tiers:\n" + "\n".join(wrong)


def test_kvstats_code_uses_the_tiered_names():
    short = [f"{path.relative_to(ROOT.parent)}:{line}: {target}" for name, path in modules().items()
             for line, target in imports(path) if any(target == s or target.startswith(s + ".")
                                                      for s in kvstats.SHORT_NAMES)]
    assert not short, "kvstats' own code imports short names:\n" + "\n".join(short)


def test_no_module_level_import_circle():
    graph = {name: {t for _, t in imports(path, top_level_only=True)} for name, path in modules().items()}
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph or nxt == node:
                continue
            if state.get(nxt) == 1:
                return stack + [node, nxt]
            if state.get(nxt) is None and (cycle := visit(nxt, stack + [node])):
                return cycle
        state[node] = 2
        return None

    for name in sorted(graph):
        if state.get(name) is None:
            cycle = visit(name, [])
            assert cycle is None, f"module-level import circle: {' -> '.join(cycle)}"


@pytest.mark.parametrize("short", sorted(kvstats.SHORT_NAMES))
def test_short_names_are_the_tiered_modules(short):
    assert importlib.import_module(short) is importlib.import_module(kvstats.SHORT_NAMES[short])


def test_public_names_stay_where_users_import_them():
    from kvstats.cache import KVStatsCache
    from kvstats.metrics import attention_kl
    from kvstats.quantizers.base import Code
    from kvstats.stats import mann_whitney

    assert KVStatsCache.__module__ == "kvstats.hf.cache" and attention_kl.__module__ == "kvstats.measure.metrics"
    assert Code.__module__ == "kvstats.quant.quantizers.base" and mann_whitney.__module__ == "kvstats.measure.stats"
    assert callable(kvstats.quantizer) and callable(kvstats.scheme) and callable(kvstats.evaluate)
