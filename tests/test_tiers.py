"""The tiers of the tree (docs/design_notes.md): every import inside kvstats goes down the list — cli → evaluation →
study → hf → measure → quant → data → the private helpers — never up; no import circle, not even through an import
inside a function or between two modules of one tier; every module has one name (no import hook), and the few short
names users import (``kvstats.stats``, ``kvstats.cache``, ...) are facade modules that re-export their home's
public names and that kvstats' own code never imports."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

import kvstats

ROOT = Path(kvstats.__file__).resolve().parent
#: tier of a module by its name's prefix (longest first), lowest first
TIERS = {"base": 0, "data": 1, "quant": 2, "measure": 3, "hf": 4, "study": 5, "evaluation": 6, "cli": 7, "facade": 8}
PREFIXES = [("kvstats.data", "data"), ("kvstats.quant", "quant"), ("kvstats.measure", "measure"), ("kvstats.hf", "hf"),
            ("kvstats.study", "study"), ("kvstats.evaluation", "evaluation"), ("kvstats.cli", "cli"),
            ("kvstats", "base")]
#: the facade modules: short name -> the home whose public names they re-export
FACADES = {"kvstats.ops": "kvstats.quant.ops", "kvstats.quantizers": "kvstats.quant.quantizers",
           "kvstats.schemes": "kvstats.quant.schemes", "kvstats.metrics": "kvstats.measure.metrics",
           "kvstats.error6d": "kvstats.measure.error6d", "kvstats.inference": "kvstats.measure.inference",
           "kvstats.stats": "kvstats.measure.stats", "kvstats.testing": "kvstats.measure.testing",
           "kvstats.cache": "kvstats.hf.cache"}


def tier(module: str) -> str:
    if module in FACADES:
        return "facade"
    return next(t for prefix, t in PREFIXES if module == prefix or module.startswith(prefix + "."))


def modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = set(modules())


def _module_of(name: str) -> str:
    """The module an imported name lives in: itself when it is one, else its nearest enclosing module."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


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
                    target = kvstats._FUNCTIONS.get(name)
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
            if name in FACADES:
                continue  # a facade imports its home, in whatever tier
            if TIERS[tier(target)] > TIERS[tier(name)]:
                wrong.append(f"{path.relative_to(ROOT.parent)}:{line}: {name} ({tier(name)}) imports {target} "
                             f"({tier(target)})")
    assert not wrong, "imports that go up the tiers:\n" + "\n".join(wrong)


def test_kvstats_code_never_imports_a_facade():
    found = [f"{path.relative_to(ROOT.parent)}:{line}: {target}" for name, path in modules().items()
             for line, target in imports(path) if name not in FACADES and _module_of(target) in FACADES]
    assert not found, "kvstats' own code imports a facade (use the module's one name):\n" + "\n".join(found)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
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
        if state.get(name) is None and (cycle := visit(name, [])):
            return cycle
    return None


@pytest.mark.parametrize("top_level_only", [True, False], ids=["module level", "any import"])
def test_no_import_circle(top_level_only):
    """Not even through a function's import: two modules that need each other are one job or two in the wrong
    places. A package's ``__init__`` that re-exports its children is the package, not an edge back up."""
    graph = {}
    for name, path in modules().items():
        targets = {_module_of(t) for _, t in imports(path, top_level_only=top_level_only)}
        graph[name] = {t for t in targets if not name.startswith(t + ".")}  # a child naming its own package
    assert _cycle(graph) is None, f"import circle: {' -> '.join(_cycle(graph))}"


def test_the_circle_check_finds_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_every_module_has_one_name():
    assert not [f for f in sys.meta_path if type(f).__module__.startswith("kvstats")], "an import hook of kvstats"
    for short, home in FACADES.items():
        facade, module = importlib.import_module(short), importlib.import_module(home)
        assert facade is not module and facade.__name__ == short
        assert list(facade.__all__) == list(module.__all__)
        for name in facade.__all__:
            assert getattr(facade, name) is getattr(module, name), f"{short}.{name}"
    assert set(FACADES) == {f"kvstats.{p.stem}" for p in ROOT.glob("*.py")
                            if "A facade: the public names of" in p.read_text(encoding="utf-8")}


def test_public_names_stay_where_users_import_them():
    from kvstats.cache import KVStatsCache
    from kvstats.metrics import attention_kl
    from kvstats.quantizers import Code
    from kvstats.stats import mann_whitney

    assert KVStatsCache.__module__ == "kvstats.hf.cache" and attention_kl.__module__ == "kvstats.measure.metrics"
    assert Code.__module__ == "kvstats.quant.quantizers.base" and mann_whitney.__module__ == "kvstats.measure.stats"
    assert callable(kvstats.quantizer) and callable(kvstats.scheme) and callable(kvstats.evaluate)
    from kvstats.evaluation import evaluate

    assert evaluate is kvstats.evaluate
