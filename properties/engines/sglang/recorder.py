"""The copy recorder: stands in for the device-to-host copy at SGLang's cache controller.

SGLang's hierarchical cache decides what to back up in its own tree code and hands each copy to
its cache controller (``managers/cache_controller.py``), which needs CUDA streams, a pinned host
pool and transfer kernels. The recorder is that controller's boundary and nothing more: ``write``
takes the device slots of one node, hands back host slots from a plain free list (or ``None``,
a failed copy, when the machine asks for one), and queues an acknowledgement that completes
at once or when the machine delivers it, as the controller's finish events do. What each copy
held is recorded, as the pages the machine's scheduler said those device slots hold.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


class _Done:
    """A finish event: ``query()`` says whether the copy has ended."""

    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True


@dataclass
class Ack:
    """One copy's acknowledgement, in the shape the cache's ``writing_check`` reads."""

    node_ids: list
    finish_event: _Done = field(default_factory=_Done)
    start_event: _Done = field(default_factory=_Done)
    num_tokens_by_pool: dict = field(default_factory=dict)
    num_bytes: int = 0
    timing_enabled: bool = False


class _AckQueue(list):
    """The acknowledgements in order: a list as 0.5.x's cache reads it, and a queue of the
    finished copies' node ids as 0.4.x's reads it (``qsize``, ``get``)."""

    def qsize(self) -> int:
        done = 0
        for ack in self:
            if not ack.finish_event.done:
                break
            done += 1
        return done

    def get(self, *_args, **_kwargs):
        return self.pop(0).node_ids[0]

    def empty(self) -> bool:
        return self.qsize() == 0


class _HostPool:
    def __init__(self, size: int) -> None:
        self.size = size
        self.free_slots = list(range(size))
        self.shared_allocation_domain = None

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self, n: int) -> torch.Tensor | None:
        if n > len(self.free_slots):
            return None
        taken, self.free_slots = self.free_slots[:n], self.free_slots[n:]
        return torch.tensor(taken, dtype=torch.int64)

    def free(self, slots) -> int:
        values = [int(s) for s in torch.as_tensor(slots).flatten()]
        self.free_slots.extend(values)
        return len(values)

    def clear(self) -> None:
        self.free_slots = list(range(self.size))


class _Entry:
    def __init__(self, pool: _HostPool) -> None:
        self.host_pool = pool
        self.host_evict_fn = None


class _HostMemory:
    """What the cache reads of the controller's host memory: its free size, and freeing."""

    def __init__(self, size: int) -> None:
        self.pool = _HostPool(size)
        self.anchor_entry = _Entry(self.pool)

    def available_size(self) -> int:
        return self.pool.available_size()

    def free(self, slots) -> int:
        return self.pool.free(slots)

    def alloc(self, n: int):
        return self.pool.alloc(n)

    def clear(self) -> None:
        self.pool.clear()


class CopyRecorder:
    """The cache controller, reduced to its device-to-host copy: records, completes, delays or
    fails each backup. ``pages_of_slots`` maps device slots to the pages they hold."""

    write_policy = "write_through_selective"
    pp_prefetch_command_group = None
    enable_storage = False

    def __init__(self, host_slots: int, pages_of_slots: Callable[[list[int]], list]) -> None:
        self.mem_pool_host = _HostMemory(host_slots)
        self.ack_write_queue: list[Ack] = _AckQueue()
        self.ack_load_queue: list[Ack] = _AckQueue()
        self.pages_of_slots = pages_of_slots
        self.copies: list[list] = []  # the pages of each copy asked for, in order
        self.new: list = []  # the pages copied since the machine last looked
        self.delay = False  # acknowledgements wait for ``deliver`` while set
        self.fail_next = False  # the next copy fails (no host slots handed back)

    # --- the controller's calls that the tree makes ---
    def write(self, device_indices, node_id=None, priority=None, **_ignored):
        slots = [int(s) for s in torch.as_tensor(device_indices).flatten()]
        if self.fail_next:
            self.fail_next = False
            return None
        host = self.mem_pool_host.alloc(len(slots))
        if host is None:
            return None
        pages = self.pages_of_slots(slots)
        self.copies.append(pages)
        self.new.extend(pages)
        ack = Ack(node_ids=[node_id])
        ack.finish_event.done = not self.delay
        self.ack_write_queue.append(ack)
        return host

    def start_writing(self) -> None:
        return None

    mem_pool_device_allocator: Any = None  # where the cache frees device slots through it

    def evict_device(self, device_indices, host_indices=None) -> int:
        """Give device slots back (a node backed up to host leaves the GPU; 0.4.x names its
        host slots too)."""
        self.mem_pool_device_allocator.free(device_indices)
        return len(device_indices)

    def evict_host(self, host_indices, backup_only: bool = False) -> int:
        """Give host slots back (a node leaves host memory)."""
        return self.mem_pool_host.free(host_indices)

    def reset(self) -> None:
        self.ack_write_queue.clear()
        self.ack_load_queue.clear()
        self.mem_pool_host.clear()

    # --- the machine's ---
    def deliver(self) -> int:
        """Complete every copy in flight; how many there were."""
        waiting = [a for a in self.ack_write_queue if not a.finish_event.done]
        for ack in waiting:
            ack.finish_event.done = True
        return len(waiting)

    def in_flight(self) -> int:
        return sum(1 for a in self.ack_write_queue if not a.finish_event.done)

    def take_new(self) -> list:
        new, self.new = self.new, []
        return new
