"""The runnable Python blocks of README.md and docs/*.md (how tests/test_docs.py and tests/test_readme.py read them)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PYTHON = {"python", "py", "python3"}
NO_RUN = re.compile(r"^<!--\s*no-run:\s*(?P<why>\S.*?)\s*-->\s*$")
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the first code line
    language: str
    code: str
    no_run: str | None  # the reason given in the no-run comment, or None


def code_blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page (CommonMark fences: ``` or ~~~, at most 3 spaces indent)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent = m["fence"], len(m["indent"])
        language = (m["info"].split() or [""])[0].lower()
        previous = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = NO_RUN.match(previous.strip())
        body, j = [], i + 1
        while j < len(lines) and not re.match(rf"^ {{0,3}}{fence[0]}{{{len(fence)},}}\s*$", lines[j]):
            line = lines[j]
            body.append(line[min(indent, len(line) - len(line.lstrip(" "))):])  # drop the fence's indent
            j += 1
        blocks.append(Block(page, i + 2, language, "\n".join(body) + "\n", marker["why"] if marker else None))
        i = j + 1
    return blocks


def python_blocks(page: Path) -> list[Block]:
    return [b for b in code_blocks(page) if b.language in PYTHON]
