"""The code a study's numbers come from, as one digest (issue 50, item 4).

    code_fingerprint("studies.nova")       # '3f1c…': the sources it imports, the extension, the numeric libraries

A study's cells are keyed by its fingerprint (:class:`kvstats.study.protocol.StudyRun`), so a cell computed by
other code is computed again, and its claims record it, so a report assembled from claims that other code wrote
says so (:func:`kvstats.study.report.build_report`). The digest covers

* the source of every module the study imports, followed statically through ``import`` / ``from … import``
  statements anywhere in a module (functions' lazy imports included) within the packages ``kvstats`` and
  ``studies``, with each module's parent packages (run on import) and the modules a package's lazy attributes load
  where they are used (``from kvstats import scheme`` or ``kvstats.scheme(...)`` → ``kvstats.quant.schemes``);
* the data files shipped inside ``kvstats`` (the texts the real-model studies read);
* the compiled extension as loaded: the build record setup.py wrote beside the library (what it compiled: the
  sources' sha256, flags, torch's and the compiler's versions), else the library's bytes (or that none is loaded);
* the versions of the libraries that compute (torch, numpy, scipy, statsmodels, pandas, transformers,
  safetensors) and of Python.

Sources are named by their place in the package (``kvstats/...``, the studies as ``kvstats/studies/...``), so a
checkout and an installed copy of the same code give the same fingerprint.

What it does not see, by design: code reached only through a name built at run time (a user's ``module:Class``
quantizer), and files outside the package a study reads (a model's weights: their own checksums key them).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.metadata
import importlib.util
import platform
import sys
from collections.abc import Iterable
from pathlib import Path

__all__ = ["BUILD_RECORD", "ROOTS", "code_fingerprint", "extension_identity", "function_fingerprint", "import_closure",
           "module_path", "package_data", "study_fingerprint"]

#: the top-level packages whose modules a fingerprint follows (the studies also import as ``kvstats.studies``)
ROOTS = ("kvstats", "studies")
#: libraries whose version can move a number
LIBRARIES = ("torch", "numpy", "scipy", "statsmodels", "pandas", "transformers", "safetensors")
_SOURCE_SUFFIXES = {".py", ".pyc", ".pyo", ".pyd", ".so"}


@functools.cache
def module_path(name: str) -> Path | None:
    """The source file of module ``name`` (a package's ``__init__.py``) within :data:`ROOTS`, or None when there is
    no such module (a name that is an attribute, not a module)."""
    if name.split(".")[0] not in ROOTS:
        return None
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a parent that is not a package, or no spec
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin)


def _is_package(name: str) -> bool:
    path = module_path(name)
    return path is not None and path.name == "__init__.py"


@functools.cache
def _lazy_table(package: str) -> tuple[dict[str, str], tuple[str, ...]]:
    """A package's lazy attributes (PEP 562 ``__getattr__``): ({name: module} from the dict literals of its
    ``__init__`` that map names to modules of :data:`ROOTS`, the other module names its ``__init__`` spells as
    strings — where any attribute may come from)."""
    path = module_path(package)
    if path is None or path.name != "__init__.py":
        return {}, ()
    table, loose = {}, set()
    tree = ast.parse(path.read_bytes(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if (isinstance(key, ast.Constant) and isinstance(value, ast.Constant) and isinstance(key.value, str)
                        and isinstance(value.value, str) and module_path(value.value) is not None):
                    table[key.value] = value.value
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and module_path(node.value) is not None:
            loose.add(node.value)
    return table, tuple(sorted(loose - set(table.values())))


def _member(package: str, attribute: str) -> set[str]:
    """The modules ``package.attribute`` can load: the submodule of that name, else the package's lazy table entry
    (or, for a package that computes it, every module its ``__init__`` names)."""
    if module_path(f"{package}.{attribute}") is not None:
        return {f"{package}.{attribute}"}
    table, loose = _lazy_table(package)
    return {table[attribute]} if attribute in table else set(loose)


def _imports(name: str, path: Path, package: str | None = None) -> set[str]:
    """The modules of :data:`ROOTS` that module ``name`` (source at ``path``; "" for a file outside them, whose
    relative imports are not followed) imports, or loads through a package's lazy attributes
    (``from kvstats import scheme``, ``kvstats.quantizer(...)``)."""
    tree = ast.parse(path.read_bytes(), filename=str(path))
    if package is None:  # the package relative imports start from (given for a file found by its path)
        package = name if _is_package(name) else name.rpartition(".")[0]
    found: set[str] = set()
    bound: dict[str, str] = {}  # names bound to modules by ``import a.b`` (a) or ``import a.b as c`` (c)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(alias.name)
                bound[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else \
                    alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level and not package:  # a file outside the packages: its relative imports are its own
                continue
            if node.level:  # relative: from the module's package, up level − 1 packages
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            if base.split(".")[0] in ROOTS and module_path(base) is not None:
                for alias in node.names:
                    members = _member(base, alias.name)
                    found.update(members)
                    if len(members) == 1 and f"{base}.{alias.name}" in members:
                        bound[alias.asname or alias.name] = f"{base}.{alias.name}"
    for node in ast.walk(tree):  # attributes of bound modules: kvstats.scheme(...), kvstats.evaluation.sensitivity
        chain = []
        while isinstance(node, ast.Attribute):
            chain.append(node.attr)
            node = node.value
        if not chain or not isinstance(node, ast.Name) or node.id not in bound:
            continue
        module = bound[node.id]
        for attr in reversed(chain):  # down the chain while it names packages
            if module.split(".")[0] not in ROOTS or not _is_package(module):
                break
            found.update(_member(module, attr))
            module = f"{module}.{attr}"
    return {m for m in found if m and m.split(".")[0] in ROOTS and module_path(m) is not None}


@functools.cache
def _closure(start: tuple[str, ...]) -> tuple[str, ...]:
    seen: set[str] = set()
    todo = list(start)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = module_path(name)
        if path is None:
            raise ValueError(f"module {name!r} is not a module of {list(ROOTS)} with a Python source")
        seen.add(name)
        parents = [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]
        todo += [p for p in parents if p not in seen] + sorted(_imports(name, path) - seen)
    return tuple(sorted(seen))


def import_closure(modules: str | Iterable[str]) -> list[str]:
    """Every module of :data:`ROOTS` that importing and running ``modules`` can execute, by the static rule of the
    module docstring: the modules themselves, their parent packages, and what they import or name, transitively.

    Raises ValueError naming a start module that is not a module of :data:`ROOTS` with a Python source."""
    start = (modules,) if isinstance(modules, str) else tuple(modules)
    if not start or not all(isinstance(m, str) and m for m in start):
        raise ValueError(f"modules must be module names like 'studies.nova', got {modules!r}")
    return list(_closure(tuple(sorted(set(start)))))


def package_data() -> list[Path]:
    """The files inside the kvstats package that are not code (the shipped texts, tables), sorted."""
    root = module_path("kvstats").parent
    return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix not in _SOURCE_SUFFIXES
                  and "__pycache__" not in p.parts)


#: The record setup.py writes beside the library it builds: what that build was made from (setup.py, build_record).
BUILD_RECORD = "_C.build.json"


def extension_identity() -> bytes:
    """The compiled extension as it runs here: the build record beside the loaded library ``kvstats._C`` — the
    sha256 of the sources that build compiled, its flags, torch's and the compiler's versions (written by setup.py
    when it built that library, so sources edited but not rebuilt still name the old build) — else the library's
    bytes (a build without a record; they embed the checkout's absolute paths, so two checkouts of one commit
    differ), or a marker when it is not loaded (the pure-torch references then run: other float rounding)."""
    from kvstats.quant import ops

    library = getattr(sys.modules.get("kvstats._C"), "__file__", None)
    if not ops.HAS_EXTENSION or not library:
        return b"no compiled extension: the pure-torch references"
    record = Path(library).with_name(BUILD_RECORD)
    if record.is_file():
        return b"kvstats._C built from " + record.read_bytes()
    return Path(library).read_bytes()


def _label(path: Path) -> str:
    """A source's name in the fingerprint, the same in a checkout and in an installed copy: its path inside the
    kvstats package (``kvstats/quant/...``), the shipped studies as ``kvstats/studies/...`` (a checkout's
    ``studies/``), anything else by its absolute path."""
    for package in ("kvstats.studies", "kvstats"):
        init = module_path(package)
        if init is not None and path.is_relative_to(init.parent.resolve()):
            return "/".join((*package.split("."), *path.relative_to(init.parent.resolve()).parts))
    return str(path)


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def code_fingerprint(modules: str | Iterable[str] = (), files: Iterable[str | Path] = ()) -> str:
    """The sha256 (24 hex digits) of the code that running ``modules`` (and the source ``files`` outside the
    packages, e.g. a user's study script) can execute: the sources of :func:`import_closure` of the modules and of
    what the files import, the files themselves, kvstats' data files, the loaded extension library
    (:func:`extension_identity`) and the computing libraries' versions. Equal fingerprints: the same code on the same
    libraries; any edit of a file in the closure changes it."""
    start = [modules] if isinstance(modules, str) else list(modules)
    paths = [Path(f) for f in files]
    for path in paths:
        if not path.is_file():
            raise ValueError(f"files: {str(path)!r} is not a file")
        start += sorted(_imports("", path))
    if not start and not paths:
        raise ValueError("code_fingerprint needs modules or files to fingerprint, got neither")
    digest = hashlib.sha256()
    repository = module_path("kvstats").parent.parent.resolve()

    def add(label: str, data: bytes) -> None:
        digest.update(f"{label}\0{len(data)}\0".encode())
        digest.update(data)

    # by file, not by name: a study's modules import under two names (studies.nova, kvstats.studies.nova) and a study
    # script also runs as __main__ (given here as a file), and the same code must give the same fingerprint whichever
    # way it ran: every source is labelled by its place in the package (_label), and a file inside one of the
    # packages brings its parent packages' __init__.py and what they import, as its module's import would
    files_here = set()
    for path in (p.resolve() for p in paths):
        files_here.add(path)
        if path.is_relative_to(repository) and path.relative_to(repository).parts[0] in ROOTS:
            for parent in path.parents:
                init = parent / "__init__.py"
                if parent != repository and parent.is_relative_to(repository) and init.is_file():
                    package = ".".join(parent.relative_to(repository).parts)
                    files_here.add(init)
                    start += sorted(_imports(package, init, package))
    sources = files_here | {module_path(name).resolve() for name in (import_closure(start) if start else [])}
    for path in sorted(sources):
        add(f"source:{_label(path)}", path.read_bytes())
    for path in package_data():
        add(f"data:{_label(path.resolve())}", path.read_bytes())
    add("extension", extension_identity())
    for name in LIBRARIES:
        add(f"library:{name}", _version(name).encode())
    add("python", platform.python_version().encode())
    return digest.hexdigest()[:24]


def function_fingerprint(fn) -> str:
    """:func:`code_fingerprint` of the module that defines ``fn`` (a study's cell function): by name within
    :data:`ROOTS`, else by its source file (a script run as ``__main__``, a user's own module)."""
    import inspect

    module = getattr(fn, "__module__", None)
    if isinstance(module, str) and module != "__main__" and module_path(module) is not None:
        return code_fingerprint(module)
    try:
        source = inspect.getsourcefile(inspect.unwrap(fn))
    except TypeError:
        source = None
    if source is None:
        raise ValueError(f"cannot fingerprint {fn!r}: it has no module within {list(ROOTS)} and no source file")
    # a study script run as __main__ gets, by its file, the fingerprint its module has (code_fingerprint labels
    # sources by their place in the package and brings a file's parent packages)
    return code_fingerprint(files=[Path(source)])


def study_fingerprint(study: str) -> str | None:
    """:func:`code_fingerprint` of the shipped study ``studies.<study>`` (its cells, analysis and claims), or None
    for a study that is not one of the shipped ones (a user's own script)."""
    for name in (f"kvstats.studies.{study}", f"studies.{study}"):  # installed, or from the repository's root
        if module_path(name) is not None:
            return code_fingerprint(name)
    return None
