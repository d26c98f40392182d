"""Every private vLLM name the harness touches, in one place: what owns it, what uses it, and
which gated releases lack it.

A name is private when vLLM makes no promise about it: an attribute or method whose name
starts with ``_`` on one of vLLM's objects (the connector's scheduler side, the CPU
offloading manager, its cache policy, 0.21.0's threshold wrapper). The harness reads them
where vLLM has no public answer (what the connector still tracks, whether it holds the
manager's lock), the planted faults (faults.py) replace them, and the mended targets
(releases/vllm_mends.py) wrap them. A release that renames one would leave a check or a
fault with nothing to act on, so each name says which gated releases lack it
(``absent_in``: the harness copes there, by design) and tests/test_private_names.py holds
every installed release to the list: a name missing where it is expected, or present where
the list says it is absent, fails naming it. The harness imports no private vLLM module.

The harness modules import the names from here (``getattr(conn, JOBS)``, not ``conn._jobs``).
The adapter's internals (adapter.py ``INTERNALS``, ``OLDER_NAMES``) are listed here as well;
the test checks that the two lists agree.
"""

from __future__ import annotations

import importlib
import inspect
import re
from dataclasses import dataclass

# What owns each name: the vLLM class, by module and class name.
CONNECTOR = "connector"
MANAGER = "manager"
LRU_POLICY = "lru_policy"
THRESHOLD_WRAPPER = "threshold_wrapper"
OWNERS = {
    CONNECTOR: (
        "vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler",
        "OffloadingConnectorScheduler",
    ),
    MANAGER: ("vllm.v1.kv_offload.cpu.manager", "CPUOffloadingManager"),
    LRU_POLICY: ("vllm.v1.kv_offload.cpu.policies.lru", "LRUCachePolicy"),
    THRESHOLD_WRAPPER: ("vllm.v1.kv_offload.reuse_manager", "FilterReusedOffloadingManager"),
}
OLD = ("0.21.0", "0.28.0")  # the gated releases of an older design (gate only)
NEW = ("0.33.0", "0.34.0")

# --- the connector's scheduler side
REQ_STATUS = "_req_status"  # req_id -> the request's offloading state
JOBS = "_jobs"  # job id -> the transfer job it tracks
RESET_FENCE = "_reset_fence"  # a reset waiting for its flushed jobs
RESET_FENCE_SINCE = "_reset_fence_since"  # when that wait began (time.monotonic())
PENDING_JOBS = "_block_id_to_pending_jobs"  # GPU block -> the jobs fencing it
CHUNKS_LOADING = "_chunks_being_loaded"
ACQUIRE_STEP = "_acquire_step"  # its presence: the connector holds the manager's lock
RELEASE_STEP = "_release_step"
INFO_SENT = "_info_sent"  # the tier's configuration already rode on a stats payload
RESET_CACHE = "_reset_cache"  # the part of reset_cache that tells the manager
BUILD_STORE_JOBS = "_build_store_jobs"
BUILD_PARTIAL_TAIL_STORE_JOBS = "_build_partial_tail_store_jobs"
SLIDING_WINDOW_GROUPS = "_sliding_window_groups"
LOOKUP_COMPLETE_CHUNKS = "_lookup_complete_chunks"
PARTIAL_TAIL_HIT = "_lookup_partial_tail_hit"  # extends a complete-chunk hit by a partial tail
MANAGER_LOCKED = "_manager_locked"  # the context manager a hook enters the lock with
OBSERVE_ASYNC_DELAY = "_maybe_observe_lookup_async_delay"
REACHABLE_STORE_BLOCK_MASK = "_reachable_store_block_mask"
JOBS_TO_FLUSH = "_current_batch_jobs_to_flush"
# --- the manager, its policy, the threshold wrapper (adapter.py INTERNALS, OLDER_NAMES)
POLICY = "_policy"
LRU_RANKS = "_ranks"
FREE_LIST = "_free_list"
ALLOCATED_CHUNKS = "_num_allocated_chunks"
ALLOCATED_BLOCKS = "_num_allocated_blocks"  # its name before 0.30.0
NUM_CHUNKS = "_num_chunks"
NUM_BLOCKS = "_num_blocks"  # its name before 0.30.0
BACKING = "_backing"


@dataclass(frozen=True)
class Private:
    """One private name: on what, used by what, and the gated releases that lack it."""

    name: str
    owner: str  # a key of OWNERS
    used_by: str
    absent_in: tuple[str, ...] = ()


NAMES: tuple[Private, ...] = (
    Private(
        REQ_STATUS,
        CONNECTOR,
        "exact.py (nothing left behind), lookup_metrics.py (which lookups run); faults "
        "reoffer, ignore_max_load, keep_finished, session_keys_frozen, positions_unrecorded",
    ),
    Private(JOBS, CONNECTOR, "exact.py (deferred for a cause, never idle, nothing left behind)"),
    Private(
        RESET_FENCE,
        CONNECTOR,
        "exact.py (deferred for a cause, nothing left behind); fault fence_never_drains",
        absent_in=OLD,
    ),
    Private(RESET_FENCE_SINCE, CONNECTOR, "fault fence_warns_at_once", absent_in=OLD),
    Private(PENDING_JOBS, CONNECTOR, "exact.py (nothing left behind)"),
    Private(CHUNKS_LOADING, CONNECTOR, "exact.py (nothing left behind)", absent_in=("0.21.0",)),
    Private(
        ACQUIRE_STEP, CONNECTOR, "exact.py (the manager's lock); fault region_split", absent_in=OLD
    ),
    Private(RELEASE_STEP, CONNECTOR, "faults lock_left_held, region_split", absent_in=OLD),
    Private(
        INFO_SENT, CONNECTOR, "exact.py (configuration once); fault info_every_time", absent_in=OLD
    ),
    Private(RESET_CACHE, CONNECTOR, "faults reset_lost, reset_keeps_progress", absent_in=OLD),
    Private(
        BUILD_STORE_JOBS,
        CONNECTOR,
        "faults reoffer, offers_a_step_late; releases/vllm_mends.py (one offer a step)",
    ),
    Private(
        BUILD_PARTIAL_TAIL_STORE_JOBS,
        CONNECTOR,
        "releases/vllm_mends.py (one offer a step)",
        absent_in=("0.21.0",),
    ),
    Private(PARTIAL_TAIL_HIT, CONNECTOR, "fault partial_tail_unserved", absent_in=(*OLD, "0.33.0")),
    Private(SLIDING_WINDOW_GROUPS, CONNECTOR, "fault window_last_token"),
    Private(LOOKUP_COMPLETE_CHUNKS, CONNECTOR, "fault window_last_token", absent_in=("0.21.0",)),
    Private(MANAGER_LOCKED, CONNECTOR, "fault false_recovery", absent_in=OLD),
    Private(
        OBSERVE_ASYNC_DELAY,
        CONNECTOR,
        "lookup_metrics.py (where the release times lookups); fault drop_async_delay",
        absent_in=("0.21.0",),
    ),
    Private(
        REACHABLE_STORE_BLOCK_MASK,
        CONNECTOR,
        "releases/vllm_mends.py (whole window chunks)",
        absent_in=OLD,
    ),
    Private(JOBS_TO_FLUSH, CONNECTOR, "releases/vllm_mends.py (a second reset before a step)"),
    Private(POLICY, MANAGER, "adapter.py INTERNALS (the cache policy the oracle inspects)"),
    Private(LRU_RANKS, LRU_POLICY, "adapter.py INTERNALS (request-scoped LRU)", absent_in=OLD),
    Private(FREE_LIST, MANAGER, "adapter.py INTERNALS (freed chunk ids)"),
    Private(ALLOCATED_CHUNKS, MANAGER, "adapter.py INTERNALS (ids handed out)", absent_in=OLD),
    Private(ALLOCATED_BLOCKS, MANAGER, "adapter.py OLDER_NAMES (ids handed out)", absent_in=NEW),
    Private(NUM_CHUNKS, MANAGER, "adapter.py INTERNALS (the tier's size)", absent_in=OLD),
    Private(NUM_BLOCKS, MANAGER, "adapter.py OLDER_NAMES (the tier's size)", absent_in=NEW),
    Private(
        BACKING,
        THRESHOLD_WRAPPER,
        "adapter.py INTERNALS (the manager a threshold filter wraps)",
        absent_in=("0.28.0",) + NEW,
    ),
)
BY_NAME = {(p.owner, p.name): p for p in NAMES}


def owner_class(owner: str) -> type | None:
    """The installed vLLM's class for ``owner``; None where its module or class is gone."""
    module, cls = OWNERS[owner]
    try:
        return getattr(importlib.import_module(module), cls, None)
    except ImportError:
        return None


def has(cls: type, name: str) -> bool:
    """Whether instances of ``cls`` have ``name``: a class attribute (a method), or an
    instance attribute one of its vLLM classes assigns (``self.name = ...``)."""
    if hasattr(cls, name):
        return True
    assigned = re.compile(rf"self\.{re.escape(name)}\s*(:[^=\n]*)?=[^=]")
    for klass in cls.__mro__:
        if not klass.__module__.startswith("vllm"):
            continue
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        if assigned.search(source):
            return True
    return False


def check(version: str) -> dict[str, list[str]]:
    """The installed vLLM (``version``) held to the list: ``missing``, the names it lacks that
    the harness expects there; ``stale``, the names the list says it lacks but it has. Each
    as ``owner.name (used by)``."""
    missing, stale = [], []
    classes = {owner: owner_class(owner) for owner in OWNERS}
    for p in NAMES:
        cls = classes[p.owner]
        found = cls is not None and has(cls, p.name)
        said = f"{OWNERS[p.owner][1]}.{p.name} (used by {p.used_by})"
        if not found and version not in p.absent_in:
            missing.append(said)
        elif found and version in p.absent_in:
            stale.append(said)
    return {"missing": missing, "stale": stale}
