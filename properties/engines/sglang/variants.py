"""Variants of SGLang's cache, applied from a registry: the mended one, and known-bad ones.

``mended``: the release with its known defect put right (a retracted request is the same request
when it resumes: docs/sglang.md, defect 1). The mend keeps, on each node of SGLang's Python tree
core, the requests its hit count has counted (copied with the count when the node splits,
dropped with the node), and counts a request on a node once; the request being inserted is told
to the tree core by the cache's ``checkpoint_into_tree``. Each known-bad variant is the mended
cache with one thing wrong, a subclass of SGLang's own classes:

- ``every-insert``: counts every insert (no request is told, and the watermark is forgotten);
- ``forgets-retraction``: forgets a request across retraction (it resumes as a new request);
- ``below-threshold``: backs a node up one hit below the threshold;
- ``split-loses-count``: a node split off another starts one count short.

The checks never ask which variant runs. The mend needs the Python tree core (the Rust core's
nodes are not Python objects), so every variant is built on it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_RIDS = "_kvgate_counted_requests"


@dataclass(frozen=True)
class Variant:
    what: str
    cache: Callable[[type], type]  # SGLang's cache class -> the variant's subclass
    core: Callable[[object], None]  # applied to the built tree core
    cores: tuple[str, ...] = ("python",)
    bad: bool = True


def _counter(req: Any) -> str:
    return str(req.rid)


def _cache_telling(counter: Callable[[Any], str | None], zero_watermark: bool = False):
    def make(cls: type) -> type:
        class Told(cls):
            """Tells the tree core which request each insert is made for."""

            def checkpoint_into_tree(self, req, *, up_to, **kwargs):
                if zero_watermark:
                    req.kv.cache_inserted_len = 0
                self.tree_core.kvgate_request = counter(req)
                try:
                    return super().checkpoint_into_tree(req, up_to=up_to, **kwargs)
                finally:
                    self.tree_core.kvgate_request = None

        Told.__name__ = Told.__qualname__ = f"Mended{cls.__name__}"
        return Told

    return make


def _once_per_request(tree_core, split_loses: int = 0) -> None:
    real: Any = type(tree_core)  # SGLang's Python tree core

    class OncePerRequest(real):
        kvgate_request = None

        def _inc_hit_count_and_check(self, node):
            request = self.kvgate_request
            if request is not None and not node.evicted:
                counted = node.__dict__.setdefault(_RIDS, set())
                if request in counted:
                    return False
                counted.add(request)
            return super()._inc_hit_count_and_check(node)

        def _split_node(self, key, child, split_len):
            new_node, action = super()._split_node(key, child, split_len)
            new_node.__dict__[_RIDS] = set(child.__dict__.get(_RIDS, ()))
            new_node.hit_count = max(0, new_node.hit_count - split_loses)
            return new_node, action

    tree_core.__class__ = OncePerRequest


def _lossy_split(tree_core) -> None:
    _once_per_request(tree_core, split_loses=1)


def _below_threshold(cls: type) -> type:
    base: Any = _cache_telling(_counter)(cls)

    class BelowThreshold(base):
        @property
        def write_through_threshold(self):
            return self.tree_core.write_through_threshold

        @write_through_threshold.setter
        def write_through_threshold(self, value) -> None:
            self.tree_core.write_through_threshold = max(1, value - 1)

    return BelowThreshold


VARIANTS: dict[str, Variant] = {
    "mended": Variant("the release, a resumed request counted once",
                      _cache_telling(_counter), _once_per_request, bad=False),
    "every-insert": Variant("counts every insert",
                            _cache_telling(lambda req: None, zero_watermark=True),
                            _once_per_request),
    "forgets-retraction": Variant("forgets a request across retraction",
                                  _cache_telling(lambda req: f"{req.rid}#{req.retraction_count}"),
                                  _once_per_request),
    "below-threshold": Variant("backs up one hit below the threshold", _below_threshold,
                               _once_per_request),
    "split-loses-count": Variant("a split-off node starts a count short",
                                 _cache_telling(_counter), _lossy_split),
}  # fmt: skip
KNOWN_BAD = tuple(name for name, v in VARIANTS.items() if v.bad)
