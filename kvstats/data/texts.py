"""The texts kvstats ships: public-domain documents of varied genre, for captures and model evaluations whose
units must come from independent documents.

    docs = documents()                  # {title: text}: 25 documents, the title line first in each
    docs["Ozymandias"][:40]

* the five texts of the United States government in ``kvstats/texts/public_domain.txt`` (the Declaration of
  Independence, the Preamble to the Constitution, the Bill of Rights, the Gettysburg Address, Lincoln's Second
  Inaugural Address), the default text of ``kvstats capture``;
* twenty shorter documents in ``kvstats/texts/documents/``: poetry, prose fiction, scripture, natural science,
  mathematics, philosophy, law, and four pieces written for kvstats and dedicated to the public domain (a recipe,
  a technical explanation, fables, a letter). Each file's comment header (lines starting with '#') names its
  author, year, genre and status.

Every text is reproduced from memory or written for kvstats; the wording may differ in places from
authoritative editions. Each file's header says which.
"""

from __future__ import annotations

from pathlib import Path

from kvstats._validation import check_int_range

__all__ = ["GOVERNMENT_TITLES", "TEXTS", "document_files", "documents", "read_documents", "split_titled"]

#: The folder of the shipped texts.
TEXTS = Path(__file__).resolve().parent.parent / "texts"
#: The title lines of the documents in ``public_domain.txt``, in order.
GOVERNMENT_TITLES = ("The Declaration of Independence", "The Preamble to the Constitution", "The Bill of Rights",
                     "The Gettysburg Address", "Second Inaugural Address of Abraham Lincoln")


def _body(path: Path) -> str:
    lines = path.read_text(encoding="utf-8").splitlines()
    return "\n".join(line for line in lines if not line.startswith("#")).strip()


def split_titled(text: str, titles) -> dict[str, str]:
    """``text`` cut at its title lines: ``{title: document text, title included}``, in the order of ``titles``;
    ValueError unless each title starts exactly one line and they appear in that order."""
    lines = text.splitlines()
    starts = []
    for title in titles:
        found = [i for i, line in enumerate(lines) if line.startswith(title)]
        if len(found) != 1:
            raise ValueError(f"the text must hold the title line {title!r} once, found it {len(found)} times")
        starts.append(found[0])
    if starts != sorted(starts):
        raise ValueError(f"the documents must appear in the order {tuple(titles)}")
    ends = starts[1:] + [len(lines)]
    return {t: "\n".join(lines[a:b]).strip() for t, a, b in zip(titles, starts, ends)}


def document_files() -> list[Path]:
    """The twenty document files of ``kvstats/texts/documents``, in their numbered order."""
    return sorted((TEXTS / "documents").glob("*.txt"))


def documents(count: int | None = None) -> dict[str, str]:
    """Every shipped document, ``{title: text}``: the five of ``public_domain.txt``, then the twenty files (title =
    the first line of the text); with ``count``, the first ``count`` of them."""
    out = split_titled(_body(TEXTS / "public_domain.txt"), GOVERNMENT_TITLES)
    for path in document_files():
        body = _body(path)
        title = body.splitlines()[0].strip()
        if title in out:
            raise ValueError(f"{path.name}: the title {title!r} is already used by another document")
        out[title] = body
    if count is None:
        return out
    check_int_range(count, "count", 1, len(out))
    return dict(list(out.items())[:count])


def read_documents(paths, *, name: str = "--text") -> dict[str, str]:
    """A user's documents, ``{title: text}``, one per text file: each of ``paths`` a file, or a folder whose ``*.txt``
    files are read in sorted order; the title is the file's name. UTF-8 text, each non-empty (after stripping),
    each file once. What cannot be read so is refused naming ``name`` (the option or argument) and the path."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    files: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            found = sorted(path.glob("*.txt"))
            if not found:
                raise ValueError(f"{name} {str(given)!r} is a folder with no .txt files")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise ValueError(f"{name} {str(given)!r}: no such file or folder")
    out: dict[str, str] = {}
    seen: set[Path] = set()
    for path in files:
        if path.resolve() in seen:
            raise ValueError(f"{name} names {str(path)!r} twice: each document once (they are the independent units)")
        seen.add(path.resolve())
        try:
            text = path.read_text(encoding="utf-8").strip()
        except UnicodeDecodeError as exc:
            raise ValueError(f"{name} {str(path)!r} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        if not text:
            raise ValueError(f"{name} {str(path)!r} is empty")
        title = path.name if path.name not in out else str(path)
        out[title] = text
    if not out:
        raise ValueError(f"{name} names no documents")
    return out
