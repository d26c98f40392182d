"""SGLang's hierarchical cache rule as a tiny model: which radix pages are due on host (spec §11).

A *page* is named by its path: the tuple of token ids from the root to the page's end (one
radix-tree page, ``page_size`` tokens). For each page on the GPU tree the model keeps the set
of distinct requests whose inserts covered it since the page last entered the tree:

- an insert by request r covers pages ``0 .. n-1`` of its tokens: r joins each page's set
  (a set, so a second insert by r, a later chunk, the insert at finish and the insert after a
  retraction and resumption add nothing: a resumed request is the same request);
- a page that leaves the tree (evicted from the GPU with no host copy) takes its set with it:
  SGLang keeps counts on the node and drops them with the node; a page evicted from the GPU
  that has a host copy keeps it, and no insert counts on it until it is back on the GPU;
- a reset empties the tree and every set.

A page whose set holds at least ``threshold`` requests is due on host; a page below it must not
be backed up. A page's ancestors are covered by every insert that covers the page, so their sets
are supersets and backing them up with it (SGLang keeps the host copy a prefix) never backs up a
page below the threshold. The model never imports SGLang.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Page = tuple[int, ...]  # the token ids from the root to the end of the page


def pages_of(tokens: tuple[int, ...], page_size: int) -> list[Page]:
    """The whole pages of ``tokens``, each named by its path."""
    whole = len(tokens) - len(tokens) % page_size
    return [tuple(tokens[:end]) for end in range(page_size, whole + 1, page_size)]


@dataclass
class RadixModel:
    threshold: int
    page_size: int = 1
    inserters: dict[Page, set[str]] = field(default_factory=dict)  # pages on the GPU tree
    on_host: set[Page] = field(default_factory=set)  # pages with a host copy (or one in flight)

    def insert(self, request: str, tokens: tuple[int, ...]) -> None:
        """``request`` inserts its first ``len(tokens)`` tokens (a chunk, a checkpoint, finish)."""
        for page in pages_of(tokens, self.page_size):
            if page in self.on_host and page not in self.inserters:
                continue  # evicted from the GPU, kept on host: no insert counts on it there
            self.inserters.setdefault(page, set()).add(request)

    def count(self, page: Page) -> int:
        return len(self.inserters.get(page, ()))

    def due(self, page: Page) -> bool:
        return self.count(page) >= self.threshold

    def backed_up(self, pages: list[Page]) -> None:
        """The cache backed these pages up (the recorder saw their copy)."""
        self.on_host.update(pages)

    def evicted(self, pages: list[Page]) -> None:
        """These pages left the GPU: a page with a host copy stays there; one without leaves
        the tree, and its count with it."""
        for page in pages:
            self.inserters.pop(page, None)

    def reset(self) -> None:
        self.inserters.clear()
        self.on_host.clear()

    def wrong_backups(self) -> list[Page]:
        """Pages backed up although fewer than ``threshold`` requests inserted them."""
        return sorted(p for p in self.on_host if p in self.inserters and not self.due(p))

    def missing_backups(self) -> list[Page]:
        """Pages on the GPU that ``threshold`` requests inserted but that have no host copy."""
        return sorted(p for p in self.inserters if self.due(p) and p not in self.on_host)
