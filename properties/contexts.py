"""Request contexts whose identity a finished request's successor reuses, the same way in every
replay of an example.

A server makes a new context per request and frees it when the request is done; CPython then
gives the next object of that size the freed memory, so a new context often has a dead one's
``id``. A manager that keys per-request records by ``id(ctx)`` fails only then. To make that
reproducible, ``Contexts`` makes each context as an instance of a subclass of the target's
context class padded to a size nothing else in the process has, so the allocator's pool for
that size holds contexts only, and a context freed right before the next is made gives it its
memory. The fields come from a context the target's adapter made the usual way, so the manager
sees a context like any other (``isinstance`` holds; the scratch store is its own).
"""

from __future__ import annotations

from typing import Any

PAD_SLOTS = 38  # about 300 bytes more: a size class few other objects fall in


class Contexts:
    def __init__(self, new_context):
        self._new_context = new_context
        self._padded: dict[type, type] = {}

    def _class_for(self, cls: type) -> type:
        padded = self._padded.get(cls)
        if padded is None:
            slots = tuple(f"_kvgate_pad{i}" for i in range(PAD_SLOTS))
            padded = type(cls.__name__, (cls,), {"__slots__": slots, "__module__": cls.__module__})
            self._padded[cls] = padded
        return padded

    def new(self, req_id: str, release: list | None = None) -> Any:
        """A new context for ``req_id``; ``release``: contexts to free right before it is made
        (the list is emptied), so that it takes the last one's memory."""
        template = self._new_context(req_id)
        cls: Any = self._class_for(type(template))  # a class made at run time
        if release:
            release.clear()
        ctx = cls.__new__(cls)  # the first allocation of that size since the release
        for klass in type(template).__mro__:
            slots = getattr(klass, "__slots__", ())
            for name in (slots,) if isinstance(slots, str) else slots:
                if name not in ("__dict__", "__weakref__") and hasattr(template, name):
                    object.__setattr__(ctx, name, getattr(template, name))
        if hasattr(template, "__dict__"):
            ctx.__dict__.update(template.__dict__)
        return ctx
