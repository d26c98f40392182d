"""Files the tool writes (reports, histories, repro files, plots): each path is checked before
any long work starts, and each file is written whole or not at all.

``check_output(flag, path)`` raises ``OutputError`` (one line naming the flag and the path) when
the file could not be written: its folder is missing or not a folder, the path is a folder or
some other thing that is not a plain file, the file is read-only, or a file cannot be made in
the folder. That last one is proved, not asked: the check makes (and removes) a temporary file
beside the target, the same kind of file the write makes, because permission bits do not say
it (``os.access`` tells root it may write in ``/proc``, where no file can be made).

``write_with(path, write)`` and ``write_atomic(path, text)`` write a temporary file beside the
target and rename it over the target, so an interrupted run leaves either the old file or the
new one, never half of one. An ``OSError`` on the way (a full disk, a filesystem that refuses)
removes the temporary file, leaves the old file as it was and is raised as ``OutputError``.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO


class OutputError(Exception):
    """An output path that cannot be written (a usage error: exit 2)."""


def _folder(path: Path) -> Path:
    return path.parent if str(path.parent) else Path(".")


def _temporary(target: Path) -> tuple[int, str]:
    """A new temporary file beside ``target`` (its descriptor and path), named after it."""
    return tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=str(_folder(target)))


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def check_output(flag: str, path: str) -> None:
    """Raise ``OutputError`` unless ``path`` can be written as a file."""
    p = Path(path)
    if p.is_dir():
        raise OutputError(f"{flag} {path}: is a directory, not a file")
    folder = _folder(p)
    if not folder.exists():
        raise OutputError(f"{flag} {path}: no such directory {str(folder)!r}")
    if not folder.is_dir():
        raise OutputError(f"{flag} {path}: {str(folder)!r} is not a directory")
    if p.exists():
        mode = p.stat().st_mode
        if not stat.S_ISREG(mode):  # a device or a pipe: renaming over it would replace it
            raise OutputError(f"{flag} {path}: exists and is not a plain file")
        if not mode & 0o222:
            raise OutputError(f"{flag} {path}: the file exists and is read-only")
    try:
        fd, tmp = _temporary(p)
    except OSError as exc:
        raise OutputError(
            f"{flag} {path}: cannot write in {str(folder)!r} ({_reason(exc)})"
        ) from None
    os.close(fd)
    os.unlink(tmp)


def check_directory(flag: str, path: str) -> None:
    """Raise ``OutputError`` unless ``path`` is (or can be made) a directory a file can be
    written in; makes it."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise OutputError(f"{flag} {path}: not a directory")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{flag} {path}: cannot create it ({_reason(exc)})") from None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".kvgate.", suffix=".tmp", dir=str(p))
    except OSError as exc:
        raise OutputError(f"{flag} {path}: cannot write in it ({_reason(exc)})") from None
    os.close(fd)
    os.unlink(tmp)


def write_with(
    path: str | Path, write: Callable[[IO], object], binary: bool = False, flag: str = ""
) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, then rename it to ``path``.
    Any exception removes the temporary file first; an ``OSError`` is raised as one
    ``OutputError`` line (``flag``, when given, names the option the path came from)."""
    target = Path(path)
    tmp = None
    try:
        fd, tmp = _temporary(target)
        with os.fdopen(fd, "wb" if binary else "w") as out:
            write(out)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException as exc:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        if isinstance(exc, OSError):
            kept = "the old file is left as it was" if target.exists() else "nothing written"
            raise OutputError(
                f"{flag + ' ' if flag else ''}{path}: writing failed ({_reason(exc)}); {kept}"
            ) from None
        raise


def write_atomic(path: str | Path, text: str, flag: str = "") -> None:
    write_with(path, lambda out: out.write(text), flag=flag)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
