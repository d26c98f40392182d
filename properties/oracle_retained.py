"""How much state a manager retains, measured from outside (spec §4.8).

``retained(manager, skip=...)`` walks the object graph reachable from a manager through its
instance attributes (``__dict__`` and ``__slots__``) and through the items of every collection
it meets, to a fixed depth, and counts the entries of the *mutable* collections on the way: the
length of every list, dict, set and deque (and of their subclasses: ``OrderedDict``,
``defaultdict``, a heap kept in a list). It needs nothing from the target's internals, so it
reads impl, every vLLM release and a user's manager alike.

What it leaves out, and why:

- values that hold nothing: ``None``, numbers, strings, bytes (a key is one value, not a
  store), enum members;
- tuples and frozensets are walked but not counted: they are records (a heap entry, a rank)
  whose size is fixed when they are made; a collection inside one is counted;
- objects shared with the rest of the process: every value bound at the top level of a loaded
  module (a registry, a logger's manager), classes, modules, functions and methods (a bound
  method leads back to its object), loggers, locks, frames, generators, and buffers (numpy
  arrays, tensors: storage sized when built, not state that grows entry by entry);
- what the harness passed in or owns: request contexts (the scheduler owns them and lets them
  go, spec §1: a record kept *in* a context is the request's, not the manager's) and any object
  named in ``skip`` (the model, the oracle, the adapter).

The walk stops at ``MAX_DEPTH`` attributes or items below the manager and after ``MAX_NODES``
objects; a truncated walk has counted part of what the manager holds, never more, so a bound
it exceeds is exceeded. A walk that fails (an attribute that raises on reading, a collection
that changes size while iterated) returns the reason instead of a number: a failure to
measure is never a verdict.
"""

from __future__ import annotations

import enum
import logging
import sys
import threading
import types
import warnings
from collections import deque
from typing import Any, NamedTuple

MAX_DEPTH = 8
MAX_NODES = 50_000
MAX_ITEMS = 20_000  # items walked into per collection (its length is counted whole)

COUNTED = (list, dict, set, deque)
WALKED = (tuple, frozenset)
_ATOMS = (type(None), bool, int, float, complex, str, bytes, bytearray, range, enum.Enum)
_OPAQUE = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.MethodWrapperType,
    types.WrapperDescriptorType,
    types.CodeType,
    types.FrameType,
    types.GeneratorType,
    types.CoroutineType,
    types.AsyncGeneratorType,
    types.TracebackType,
    logging.Logger,
    logging.Handler,
    type(threading.Lock()),
    type(threading.RLock()),
    threading.Condition,
    threading.Event,
)
_BUFFER_MODULES = ("numpy", "torch", "array")


class Retained(NamedTuple):
    """The entries counted, the largest collections as ``(path, entries)``, whether the walk
    was cut short, and why it failed (``entries`` is then 0)."""

    entries: int
    largest: tuple[tuple[str, int], ...] = ()
    truncated: bool = False
    failed: str = ""


_shared: dict[int, Any] = {}
_scanned: set[str] = set()


def _shared_ids() -> dict[int, Any]:
    """Every value bound at the top level of a loaded module, by id (the values are held, so
    an id stays theirs); the modules loaded since the last call are added."""
    if len(_scanned) != len(sys.modules):
        for name, module in list(sys.modules.items()):
            if name in _scanned:
                continue
            _scanned.add(name)
            try:
                values = list(vars(module).values())
            except TypeError:  # not a module object: nothing of its is shared
                continue
            for value in values:
                if not issubclass(type(value), _ATOMS):  # type(): no lazy proxy's __class__
                    _shared[id(value)] = value
    return _shared


def _opaque(obj: Any) -> bool:
    cls = type(obj)
    if issubclass(cls, _OPAQUE):
        return True
    module = getattr(cls, "__module__", None) or ""
    return module.partition(".")[0] in _BUFFER_MODULES


def _slots(cls: type) -> list[str]:
    names: list[str] = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and name not in names:
                names.append(name)
    return names


def _attributes(obj: Any) -> list[tuple[str, Any]]:
    """An object's instance attributes, read without running its properties or ``__getattr__``."""
    found: list[tuple[str, Any]] = []
    try:
        found.extend(object.__getattribute__(obj, "__dict__").items())
    except AttributeError:
        pass
    cls = type(obj)
    for name in _slots(cls):
        member = None
        for klass in cls.__mro__:
            member = klass.__dict__.get(name)
            if member is not None:
                break
        if isinstance(member, types.MemberDescriptorType):
            try:
                found.append((name, member.__get__(obj, cls)))
            except AttributeError:  # a slot never set
                pass
    return found


def retained(
    root: Any,
    *,
    skip: tuple[Any, ...] = (),
    skip_types: tuple[type, ...] = (),
    max_depth: int = MAX_DEPTH,
    max_nodes: int = MAX_NODES,
) -> Retained:
    """The entries of the mutable collections reachable from ``root`` (module docstring)."""
    try:
        with warnings.catch_warnings():  # reading a deprecated attribute is not a use of it
            warnings.simplefilter("ignore")
            return _walk(root, skip, skip_types, max_depth, max_nodes)
    except Exception as exc:  # any failure to read the target: a skip, never a verdict
        return Retained(0, failed=f"{type(exc).__name__}: {exc}".strip())


def _walk(root, skip, skip_types, max_depth, max_nodes) -> Retained:
    shared = _shared_ids()
    seen = {id(x) for x in skip}
    seen.add(id(root))
    sizes: list[tuple[int, str]] = []
    total = nodes = 0
    truncated = False
    stack: list[tuple[Any, str, int]] = [(root, "", 0)]
    while stack:
        obj, path, depth = stack.pop()
        nodes += 1
        if nodes > max_nodes:
            truncated = True
            break
        children: list[tuple[str, Any]]
        cls = type(obj)
        if issubclass(cls, COUNTED):
            n = len(obj)
            total += n
            if n:
                sizes.append((n, path))
            if issubclass(cls, dict):
                items = list(obj.items())[:MAX_ITEMS]
                children = [(f"[{i}]", x) for i, kv in enumerate(items) for x in kv]
            else:
                children = [(f"[{i}]", x) for i, x in enumerate(list(obj)[:MAX_ITEMS])]
        elif issubclass(cls, WALKED):
            children = [(f"[{i}]", x) for i, x in enumerate(list(obj)[:MAX_ITEMS])]
        else:
            children = [(f".{name}", x) for name, x in _attributes(obj)]
        if depth >= max_depth:
            truncated = truncated or any(not issubclass(type(x), _ATOMS) for _, x in children)
            continue
        for label, child in children:
            if issubclass(type(child), _ATOMS) or id(child) in seen:
                continue
            seen.add(id(child))
            if id(child) in shared or _opaque(child) or issubclass(type(child), skip_types):
                continue
            stack.append((child, path + label, depth + 1))
    sizes.sort(key=lambda s: (-s[0], s[1]))
    largest = tuple((p or "(the manager)", n) for n, p in sizes[:3])
    return Retained(total, largest, truncated)
