"""Every Python code block of README.md and docs/*.md runs as printed.

How pages are run: the fenced blocks whose language is ``python`` (or ``py``) are executed in the order
they appear, all blocks of one page in one namespace (a page reads as one script), from a scratch working
directory. A block that is deliberately not runnable (a template with ``...`` in it, a signature summary,
a model download or a run that takes minutes) carries the HTML comment

    <!-- no-run: why it does not run -->

on the line just before its opening fence; the comment is invisible on GitHub and in the docs site, and
the reason is required. Shell blocks (``bash``, ``console``) are not run. README.md is run by
``tests/test_readme.py``, which also checks what its example computes.
"""

from __future__ import annotations

import re

import pytest
import torch

from tests.helpers.docs import PAGES, ROOT, code_blocks, python_blocks


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """A scratch directory, the global RNG and the registries restored afterwards (pages register classes)."""
    import kvstats.quant.quantizers as quantizers
    import kvstats.quant.schemes as schemes

    registries = [getattr(mod, name) for mod, names in ((quantizers, ("QUANTIZERS",)),
                                                          (schemes, ("SCHEMES", "CALIBRATED_SCHEMES")))
                  for name in names if isinstance(getattr(mod, name, None), dict)]
    saved = [dict(r) for r in registries]
    threads = torch.get_num_threads()
    monkeypatch.chdir(tmp_path)
    with torch.random.fork_rng():
        yield tmp_path
    torch.set_num_threads(threads)
    for registry, content in zip(registries, saved):
        registry.clear()
        registry.update(content)


def test_the_block_parser_finds_fences_and_markers(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("text\n```python\na = 1\n```\n\n<!-- no-run: loads a model -->\n\n```py\nb = 2\n```\n"
                    "~~~bash\nls\n~~~\n  ```python title=\"x\"\n  c = a\n  ```\n````\n```python\n````\n")
    blocks = code_blocks(page)
    assert [(b.line, b.language, b.code, b.no_run) for b in blocks] == [
        (3, "python", "a = 1\n", None), (9, "py", "b = 2\n", "loads a model"), (12, "bash", "ls\n", None),
        (15, "python", "c = a\n", None), (18, "", "```python\n", None)]


def test_every_page_is_collected_and_has_the_blocks_it_shows():
    """The harness sees the Python blocks (a broken parser would make every page trivially pass)."""
    counts = {p.name: len(python_blocks(p)) for p in PAGES}
    assert counts["README.md"] >= 1
    raw = sum(len(re.findall(r"^ {0,3}```(?:python|py)\b", p.read_text(encoding="utf-8"), re.M)) for p in PAGES)
    assert sum(counts.values()) == raw


# README.md runs in tests/test_readme.py, which also checks what its example computes.
@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in PAGES[1:] if python_blocks(p)],
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_page_code_runs(page, isolated):
    namespace: dict = {"__name__": "__docs__"}
    ran = 0
    for block in python_blocks(page):
        if block.no_run is not None:
            continue
        # Pad with blank lines so a traceback names the Markdown line of the failing statement.
        code = compile("\n" * (block.line - 1) + block.code, str(page.relative_to(ROOT)), "exec")
        exec(code, namespace)
        ran += 1
    assert ran or all(b.no_run for b in python_blocks(page))


def test_every_docs_page_is_in_the_site_nav():
    """`make docs` (strict) fails on a page missing from mkdocs.yml's nav; say so here first, by name."""
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    listed = set(re.findall(r":\s*([\w./-]+\.md)\s*$", nav, re.M))
    pages = {p.name for p in PAGES[1:]}
    assert pages - listed == set(), f"add these docs pages to the nav of mkdocs.yml: {sorted(pages - listed)}"
    assert listed - pages == set(), f"mkdocs.yml lists pages that do not exist: {sorted(listed - pages)}"
