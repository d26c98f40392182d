"""**Answers of their declared types**: every answer the connector's scheduler side gives the
engine (its public methods: the hit and whether it loads asynchronously, whether a finished
request's blocks stay held, whether push work is pending, the step's metadata, its stats, its
hit sources) is of the type the method declares. The engine reads them by shape (``x or y``,
``if x is None``, tuple unpacking) and other connectors, metrics and logs read them by type: a
``None`` where a ``bool`` is declared reads as False today and as a crash or a wrong branch in
the next caller. An annotation that cannot be read is not judged (never a false alarm).

Read by the engine (engine.py) after the exact checks wrap the connector; known-bad variant
``push_work_unsaid`` in faults.py.
"""

from __future__ import annotations

import inspect
import numbers
import types
import typing
from collections.abc import Callable
from typing import Any

from .checks import Checks


def conforms(value: Any, hint: Any) -> bool:
    """Whether ``value`` is of type ``hint``, for the types connectors declare (classes,
    ``None``, unions, tuples, lists, dicts, sets); anything else is taken as met."""
    if hint is Any or hint is object:
        return True
    if hint is None or hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:  # PEP 484: a bool is an int; any integral number is
        return isinstance(value, numbers.Integral)
    if hint is float:  # PEP 484: an int is a float
        return isinstance(value, numbers.Real)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, a) for a in args)
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(conforms(v, args[0]) for v in value)
        return not args or (
            len(value) == len(args) and all(conforms(v, a) for v, a in zip(value, args))
        )
    if origin in (list, set, frozenset):
        return isinstance(value, origin) and all(conforms(v, args[0]) for v in value if args)
    if origin is dict:
        if not isinstance(value, dict):
            return False
        key, item = args or (Any, Any)
        return all(conforms(k, key) and conforms(v, item) for k, v in value.items())
    if origin is not None or not isinstance(hint, type):
        return True  # Iterable[...], a TypeVar, a Literal...: not judged
    return isinstance(value, hint)


def declared_return(method: Callable) -> tuple[bool, Any]:
    """``(readable, hint)`` of a method's declared return type."""
    if "return" not in getattr(method, "__annotations__", {}):
        return False, None
    try:
        return True, typing.get_type_hints(method)["return"]
    except Exception:  # a name only a type checker imports: not judged
        return False, None


def watch_answers(conn: Any, checks: Checks) -> None:
    """Wrap each public method of ``conn`` (its instance attribute where one is set) so that
    an answer not of its declared type fails ``checks``."""
    for name, method in inspect.getmembers(type(conn), inspect.isfunction):
        if name.startswith("_"):
            continue
        readable, hint = declared_return(method)
        if readable:
            setattr(conn, name, _checked(name, getattr(conn, name), hint, checks))


def _checked(name: str, call: Callable, hint: Any, checks: Checks) -> Callable:
    shown = getattr(hint, "__name__", None) if isinstance(hint, type) else None
    shown = shown or str(hint).replace("typing.", "")

    def answer(*args, **kwargs):
        got = call(*args, **kwargs)
        if not conforms(got, hint):
            checks.fail(
                f"the connector's {name}() answered {got!r:.120}, not the {shown} it declares"
            )
        return got

    return answer
