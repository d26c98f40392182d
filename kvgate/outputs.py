"""Files the tool writes (reports, histories, repro files, plots): each path is checked before
any long work starts, and each file is written whole or not at all.

``check_output(flag, path)`` raises ``OutputError`` (one line naming the flag and the path) when
the file could not be written: its folder is missing or not a folder, the path is a folder, or
the folder is not writable. ``write_atomic(path, text)`` writes a temporary file beside the
target and renames it over the target, so an interrupted run leaves either the old file or the
new one, never half of one.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO


class OutputError(Exception):
    """An output path that cannot be written (a usage error: exit 2)."""


def check_output(flag: str, path: str) -> None:
    """Raise ``OutputError`` unless ``path`` can be written as a file."""
    p = Path(path)
    if p.is_dir():
        raise OutputError(f"{flag} {path}: is a directory, not a file")
    folder = p.parent if str(p.parent) else Path(".")
    if not folder.exists():
        raise OutputError(f"{flag} {path}: no such directory {str(folder)!r}")
    if not folder.is_dir():
        raise OutputError(f"{flag} {path}: {str(folder)!r} is not a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"{flag} {path}: cannot write in {str(folder)!r} (permission denied)")
    if p.exists() and not os.access(p, os.W_OK):
        raise OutputError(f"{flag} {path}: the file exists and is not writable")


def check_directory(flag: str, path: str) -> None:
    """Raise ``OutputError`` unless ``path`` is (or can be made) a writable directory; makes it."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise OutputError(f"{flag} {path}: not a directory")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{flag} {path}: cannot create it ({exc.strerror or exc})") from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise OutputError(f"{flag} {path}: cannot write in it (permission denied)")


def write_with(path: str | Path, write: Callable[[IO], None], binary: bool = False) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, then rename it to ``path``."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp",
                               dir=str(target.parent) if str(target.parent) else ".")
    try:
        with os.fdopen(fd, "wb" if binary else "w") as out:
            write(out)
        mode = 0o666 & ~_umask()
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_atomic(path: str | Path, text: str) -> None:
    write_with(path, lambda out: out.write(text))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
