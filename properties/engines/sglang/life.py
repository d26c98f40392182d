"""A counterexample as a request life a person can read: request, chunk, retraction, insert,
backup; and the one error a failed check raises."""

from __future__ import annotations

from kvgate.model.radix import Page


def tokens(seq) -> str:
    return "[" + " ".join(str(t) for t in seq) + "]"


def page(p: Page) -> str:
    """A page by its last token and its depth: ``..., 7 @3`` is the page ending at token 3."""
    return f"{tokens(p[-3:])[:-1]}{'...' if len(p) > 3 else ''} @{len(p)}]"


def pages(ps) -> str:
    return ", ".join(page(p) for p in ps)


class Divergence(AssertionError):
    """The cache did what SGLang's rule forbids; the message holds the life that led there."""


def divergence(what: str, life: list[str]) -> Divergence:
    shown = life[-40:]
    head = [] if len(shown) == len(life) else [f"  ... {len(life) - len(shown)} earlier lines"]
    return Divergence("\n".join([what, "request life:", *head, *("  " + x for x in shown)]))
