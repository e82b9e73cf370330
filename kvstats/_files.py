"""Output files that destroy nothing: an output path is checked before any work and written without replacing
what is not a regular file.

    path = check_output_path(out, "--out", force=False, inputs=[capture])   # before the work
    write_output(path, text.encode())                                       # after it

Rules (docs/evaluate.md, "Where results go"):

* a folder, a path whose parent is a file, or a folder that cannot be written is refused;
* an input of the run (``inputs``) is never the output, also not through a symlink or a hard link;
* an existing regular file is refused unless ``force`` (then it is replaced atomically: a temporary file in
  its folder, then a rename, keeping its permission bits);
* a symlink is followed: its target is written (the link stays a link);
* a character device, a FIFO or a socket (``/dev/null``, a named pipe) is written through — opened and written
  like a stream, never replaced by a file (``os.replace`` over ``/dev/null`` as root would turn the device node
  into a JSON file);
* an open file descriptor (``/dev/stdout``, ``/dev/stderr``, ``/dev/fd/N``, ``/proc/<pid>/fd/N``) is written
  through, appended to whatever it is (a pipe, a terminal, the file the shell redirected it to), never truncated
  nor replaced: the shell still holds it;
* anything else that exists (a block device) is refused.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = ["check_output_path", "is_stream", "write_output"]


def _streams_into(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode)


def _is_descriptor(path: str | os.PathLike) -> bool:
    """Whether ``path`` names an open file descriptor (``/dev/stdout``, ``/dev/fd/1``, ``/proc/self/fd/1``, ...)."""
    text = os.path.abspath(path)
    if text in ("/dev/stdin", "/dev/stdout", "/dev/stderr") or text.startswith("/dev/fd/"):
        return True
    parts = Path(text).parts
    return len(parts) >= 5 and parts[1] == "proc" and parts[3] == "fd"


def _own_descriptor(path: str | os.PathLike) -> int | None:
    """The number of this process's file descriptor that ``path`` names (``/dev/stdout`` -> 1, ``/dev/fd/3`` -> 3,
    ``/proc/self/fd/2`` -> 2, ``/proc/<this pid>/fd/N`` -> N), or None."""
    text = os.path.abspath(path)
    named = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
    if text in named:
        return named[text]
    parts = Path(text).parts
    if text.startswith("/dev/fd/") and len(parts) == 4 and parts[3].isdigit():
        return int(parts[3])
    if len(parts) == 5 and parts[1] == "proc" and parts[3] == "fd" and parts[4].isdigit() and \
            parts[2] in ("self", "thread-self", str(os.getpid())):
        return int(parts[4])
    return None


def is_stream(path: str | os.PathLike) -> bool:
    """Whether ``path`` is written through rather than replaced: an open file descriptor, or (followed through
    symlinks) a character device, a FIFO or a socket."""
    if _is_descriptor(path):
        return True
    try:
        return _streams_into(os.stat(path))
    except OSError:
        return False


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_output_path(path: str | os.PathLike, name: str = "out", *, force: bool = True,
                      inputs: Iterable[str | os.PathLike] = ()) -> Path:
    """Check, before any work, that ``path`` can be written under the rules of the module doc; return it.

    Args:
        path: the output path.
        name: the argument's name, for the messages (``"--out"``, ``"out"``).
        force: whether an existing regular file may be replaced (True keeps the historical behaviour of
            :func:`kvstats.data.io.save_qkv`; ``kvstats evaluate`` passes False unless ``--force``).
        inputs: files the run reads; none of them may be the output.

    Raises:
        TypeError: ``path`` is not a path.
        FileExistsError: an existing regular file without ``force``.
        ValueError: any other refusal, naming ``name`` and the path.
    """
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)) or not str(path):
        raise TypeError(f"{name} must be a file path, got {path!r}")
    path = Path(path)
    for source in inputs:
        if source is not None and Path(source).exists() and path.exists() and _same_file(path, Path(source)):
            raise ValueError(f"{name} {str(path)!r} is the input {str(source)!r}: writing there would destroy it; "
                             "give another output path")
    if path.is_dir():
        example = str(path / "results.json")
        raise ValueError(f"{name} {str(path)!r} is a folder; give a file path such as {example!r}")
    if is_stream(path):
        return path  # written through: nothing to replace, nothing to check further
    target = Path(os.path.realpath(path))
    if target.exists():
        st = os.stat(target)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{name} {str(path)!r} exists and is neither a regular file nor a device or FIFO to "
                             "write through; give another output path")
        if not force:
            raise FileExistsError(f"{name} {str(path)!r} exists; pass --force (force=True) to replace it, or give "
                                  "another path")
    parent = target.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{name} {str(path)!r}: {str(parent)!r} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{name} {str(path)!r}: folder {str(parent)!r} is not writable")
    return path


def write_output(path: str | os.PathLike, content: bytes | Callable[[Path], None]) -> Path:
    """Write ``content`` (bytes, or ``writer(tmp_path)`` that writes a file) to ``path`` under the module's rules.

    A regular or new file is written to a temporary file beside it and renamed over it (never half written);
    a device or FIFO is opened and written through; a symlink's target is what gets written. Returns ``path``.
    """
    path = Path(path)
    stream = is_stream(path)
    target = path if stream else Path(os.path.realpath(path))
    if not stream:
        target.parent.mkdir(parents=True, exist_ok=True)
    folder = tempfile.gettempdir() if stream else target.parent
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        if callable(content):
            content(tmp)
        else:
            tmp.write_bytes(content)
        fd = _own_descriptor(path) if stream else None
        if fd is not None:  # the very descriptor (its offset shared with what this process prints to it)
            import sys

            for handle in (sys.stdout, sys.stderr):
                if handle is not None and hasattr(handle, "fileno") and _fileno(handle) == fd:
                    handle.flush()
            data = tmp.read_bytes()
            while data:
                data = data[os.write(fd, data):]
        elif stream:  # appended: a stream or another process's descriptor, never truncated
            with open(target, "ab") as sink, open(tmp, "rb") as source:  # noqa: PTH123 - a stream, not a file
                while chunk := source.read(1 << 20):
                    sink.write(chunk)
        else:
            mode = os.stat(target).st_mode & 0o777 if target.exists() else 0o666 & ~_umask()
            os.chmod(tmp, mode)
            os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _fileno(handle) -> int | None:
    try:
        return handle.fileno()
    except (OSError, ValueError):  # a replaced stream (pytest's capture) has no descriptor
        return None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
