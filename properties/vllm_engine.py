"""vLLM's own scheduling path, built offline on a CPU, with every manager call checked.

What runs is the installed release's ``Scheduler`` (or its ``AsyncScheduler``) with the
``OffloadingConnector``'s scheduler side (spec §7). Nothing of vLLM is
imitated on the scheduler's side; only the model runner and the connector's worker are fakes:

- ``configs()`` builds, once per process, what is slow to build: a dummy architecture
  registered with vLLM's ``ModelRegistry`` (so no real model module is imported), a local
  ``config.json``, one ``VllmConfig`` for sync and one for async scheduling, and the chunk size
  in bytes that the connector's ``CPUOffloadingSpec`` divides ``cpu_bytes_to_use`` by.
  ``VllmEngine(setup, ...)`` then builds a fresh scheduler from them in about a millisecond:
  only the connector's extra config (CPU bytes, ``store_threshold``, ``max_tracker_size``,
  the eviction policy) and the GPU block count change between examples; a ``Shape`` (tokens
  per block, the scheduler's limits, sync or async, KV events on or off) gets its own
  ``VllmConfig`` the first time it is asked for.
- The manager behind the connector is the release's own, as the connector's spec builds it,
  or a ``vllm=MODULE:ATTR`` class built with the same sizes. Where the connector keeps its
  manager, a ``Front`` stands: each call goes through the lockstep oracle
  (``properties.oracle.LockstepManager``) whose target is the target's adapter over the real
  manager (``VllmAdapter``), and the front hands vLLM back exactly what the real manager
  returned (the adapter's ``raw``). A call the oracle does not know (``on_schedule_end``,
  ``on_reset_flushed``, ``shutdown``) goes to the real manager directly and is listed in
  ``Front.unchecked``.
- ``FakeWorker`` stands for the connector's worker side: it reads each step's connector
  metadata (store jobs, load jobs, jobs to flush), holds every job in flight until the machine
  delivers it (a flushed job and a synchronous load complete in the step that names them, as
  the real worker waits for them), and reports completions through ``KVConnectorOutput``
  (``OffloadingWorkerMetadata.completed_jobs``, and ``finished_recving`` for asynchronous
  loads). Every transfer succeeds: both releases assert so on this path.

Everything that differs between releases is found by capability, never by version: the
``ModelRunnerOutput`` fields (0.34.0 dropped ``req_id_to_index``), where the connector keeps
its scheduler side, which manager calls exist. ``unavailable_reason()`` says in one line why
none of this can run here (no importable vLLM), or ``None``.

Three request-level checks sit on top of the oracle, each with a fault that breaks it
(``FAULTS``, used by the tests):

- **cold admissions**: a key is admitted only after ``store_threshold`` distinct (request,
  generation) pairs offered it, so a block that only one request ever had is never stored by
  that request's own retries or re-offers (``Checks.cold``);
- **store jobs**: every store job the connector issues gets exactly one ``complete_store`` of
  its keys, in the update that reports it, unless a cache reset flushed it first; then never
  (``Checks.jobs``; faults ``double_complete`` and ``drop_complete``);
- **events**: the CPU-tier ``BlockStored`` / ``BlockRemoved`` events the scheduler publishes,
  replayed from the last cache reset, announce exactly the keys the manager has ready
  (``Checks.events``; fault ``drop_removals``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import logging
import os
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kvgate.impl.base import STORES_SKIPPED

from .adapters import factory_takes
from .oracle import LockstepManager
from .vllm_adapter import INSTALL_HINT

SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"
CONNECTOR_SCHEDULER_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler"
DUMMY_ARCH = "KvgateDummyForCausalLM"
BLOCK_SIZE = 2  # tokens per GPU block (and per block hash)
MAX_MODEL_LEN = 64
MAX_BATCHED_TOKENS = 8  # small, so that long prompts are prefilled in chunks
MAX_SEQS = 4
FAULTS = ("double_complete", "drop_complete", "drop_removals")


def unavailable_reason() -> str | None:
    """Why vLLM's scheduling path cannot run here (one line, saying how to install a release,
    spec §10), or ``None`` when it can."""
    for module in (SCHEDULER_MODULE, CONNECTOR_SCHEDULER_MODULE):
        try:
            importlib.import_module(module)
        except Exception as exc:  # ImportError, or a dependency failing while importing
            text = str(exc).strip().splitlines()
            why = f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
            return f"vLLM's scheduler is not importable ({why}); {INSTALL_HINT}"
    return None


@dataclass(frozen=True)
class Setup:
    """One example's engine: the CPU tier, the admission rule, the GPU and the scheduling."""

    num_chunks: int = 2
    store_threshold: int = 2
    max_tracker_size: int = 64_000
    policy: str = "lru"
    async_scheduling: bool = False
    gpu_blocks: int = 16
    blocks_per_chunk: int = 1
    offload_prompt_only: bool = True
    block_size: int = BLOCK_SIZE
    max_seqs: int = MAX_SEQS
    batched_tokens: int = MAX_BATCHED_TOKENS
    max_model_len: int = MAX_MODEL_LEN
    kv_events: bool = True

    @property
    def shape(self) -> Shape:
        return Shape(
            self.block_size,
            self.max_seqs,
            self.batched_tokens,
            self.max_model_len,
            self.async_scheduling,
            self.kv_events,
        )


# ---------------------------------------------------------------------------- built once
@dataclass(frozen=True)
class Shape:
    """What a ``VllmConfig`` fixes: tokens per block, the scheduler's limits, sync or async.
    The machine runs one small shape; a replay builds the shape its flags name."""

    block_size: int = BLOCK_SIZE
    max_seqs: int = MAX_SEQS
    batched_tokens: int = MAX_BATCHED_TOKENS
    max_model_len: int = MAX_MODEL_LEN
    async_scheduling: bool = False
    kv_events: bool = True  # KVEventsConfig.enable_kv_cache_events (vLLM's default is off)


class _Configs:
    """What is slow to build, built once per process (see the module docstring): the first
    ``VllmConfig`` takes seconds (vLLM finds its platform), each further shape milliseconds."""

    def __init__(self):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        import torch
        from torch import nn
        from vllm import ModelRegistry

        for name in ("vllm", "vllm.distributed", "vllm.v1"):
            logging.getLogger(name).setLevel(logging.ERROR)

        class KvgateDummyForCausalLM(nn.Module):
            """Never run: it only lets ModelConfig accept a generating architecture."""

            def __init__(self, *, vllm_config=None, prefix: str = ""):
                super().__init__()

            def embed_input_ids(self, input_ids):
                return input_ids

            def forward(self, input_ids, positions):
                return input_ids

            def compute_logits(self, hidden_states):
                return hidden_states

        ModelRegistry.register_model(DUMMY_ARCH, KvgateDummyForCausalLM)
        self.model_dir = tempfile.mkdtemp(prefix="kvgate-vllm-model-")
        with open(os.path.join(self.model_dir, "config.json"), "w") as f:
            json.dump(
                {
                    "architectures": [DUMMY_ARCH],
                    "model_type": "llama",
                    "hidden_size": 16,
                    "intermediate_size": 16,
                    "num_attention_heads": 1,
                    "num_key_value_heads": 1,
                    "num_hidden_layers": 1,
                    "vocab_size": 1 << 20,
                    "max_position_embeddings": 1 << 20,
                    "torch_dtype": "float32",
                },
                f,
            )
        self.torch = torch
        self._models: dict[int, Any] = {}
        self._vllm: dict[Shape, Any] = {}
        self._hashers: dict[int, Any] = {}
        self._chunk_bytes: dict[tuple[Shape, int], int] = {}
        self.scheduler_classes = self._scheduler_classes()
        self.runner_output_fields = self._runner_output_fields()
        try:  # how published events name a block hash (an int by default, or the bytes)
            from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

            self.external_hash = maybe_convert_block_hash
        except ImportError:
            self.external_hash = bytes
        self.vllm(Shape())  # the machine's shape, so that its first example is not the slow one

    def vllm(self, shape: Shape):
        """The ``VllmConfig`` of ``shape`` (one per shape and process; the connector's extra
        config and the GPU block count are set per scheduler)."""
        config = self._vllm.get(shape)
        if config is None:
            from vllm.config import (
                CacheConfig,
                DeviceConfig,
                KVEventsConfig,
                KVTransferConfig,
                ModelConfig,
                SchedulerConfig,
                VllmConfig,
            )

            model = self._models.get(shape.max_model_len)
            if model is None:
                model = self._models[shape.max_model_len] = ModelConfig(
                    model=self.model_dir,
                    tokenizer=self.model_dir,
                    skip_tokenizer_init=True,
                    dtype="float32",
                    max_model_len=shape.max_model_len,
                    seed=0,
                )
            config = self._vllm[shape] = VllmConfig(
                model_config=model,
                cache_config=CacheConfig(block_size=shape.block_size, enable_prefix_caching=True),
                scheduler_config=SchedulerConfig(
                    max_num_seqs=shape.max_seqs,
                    max_num_batched_tokens=shape.batched_tokens,
                    max_model_len=shape.max_model_len,
                    enable_chunked_prefill=True,
                    is_encoder_decoder=False,
                    async_scheduling=shape.async_scheduling,
                ),
                kv_transfer_config=KVTransferConfig(
                    kv_connector="OffloadingConnector",
                    kv_role="kv_both",
                    kv_connector_extra_config={"cpu_bytes_to_use": 1 << 20},
                ),
                kv_events_config=KVEventsConfig(
                    enable_kv_cache_events=shape.kv_events, publisher="null"
                ),
                device_config=DeviceConfig("cpu"),
            )
        return config

    def block_hasher(self, block_size: int):
        """vLLM's own request block hasher, with the hash the cache config names."""
        hasher = self._hashers.get(block_size)
        if hasher is None:
            from vllm.utils.hashing import get_hash_fn_by_name
            from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

            hash_fn = get_hash_fn_by_name(self.vllm(Shape()).cache_config.prefix_caching_hash_algo)
            if not self._hashers:
                init_none_hash(hash_fn)
            hasher = self._hashers[block_size] = get_request_block_hasher(block_size, hash_fn)
        return hasher

    def kv_cache_config(self, gpu_blocks: int, block_size: int):
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

        spec = FullAttentionSpec(
            block_size=block_size, num_kv_heads=1, head_size=1, dtype=self.torch.float32
        )
        return KVCacheConfig(
            num_blocks=gpu_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)],
        )

    def chunk_bytes(self, shape: Shape, blocks_per_chunk: int) -> int:
        """What the connector's spec counts one CPU chunk as (aligned), asked of the spec."""
        if (shape, blocks_per_chunk) not in self._chunk_bytes:
            from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
                build_offloading_config,
            )
            from vllm.v1.kv_offload.factory import OffloadingSpecFactory

            config = self.vllm(shape)
            extra = config.kv_transfer_config.kv_connector_extra_config
            extra.clear()
            extra.update(cpu_bytes_to_use=1 << 30, blocks_per_chunk=blocks_per_chunk)
            spec = OffloadingSpecFactory.create_spec(
                build_offloading_config(config, self.kv_cache_config(8, shape.block_size))
            )
            size = getattr(spec, "kv_bytes_per_chunk", 0)
            if not size:
                raise RuntimeError(
                    f"{type(spec).__name__} does not say how many bytes a "
                    "chunk takes (no kv_bytes_per_chunk)"
                )
            self._chunk_bytes[(shape, blocks_per_chunk)] = int(size)
        return self._chunk_bytes[(shape, blocks_per_chunk)]

    @staticmethod
    def _scheduler_classes() -> dict[bool, type]:
        from vllm.v1.core.sched.scheduler import Scheduler

        try:
            from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        except ImportError:
            AsyncScheduler = None
        return {False: Scheduler, True: AsyncScheduler}

    @staticmethod
    def _runner_output_fields() -> frozenset[str]:
        from vllm.v1.outputs import ModelRunnerOutput

        return frozenset(f.name for f in dataclasses.fields(ModelRunnerOutput))


_CONFIGS: _Configs | None = None


def configs() -> _Configs:
    global _CONFIGS
    if _CONFIGS is None:
        _CONFIGS = _Configs()
    return _CONFIGS


# ---------------------------------------------------------------------------- the front
_NOT_ASKED = object()  # the adapter's raw answer before a call reaches the manager


class Front:
    """Stands where the connector scheduler keeps its manager. Each call goes through the
    oracle; vLLM gets back what the real manager returned. ``calls`` counts calls by name;
    ``unchecked`` names the calls that went to the real manager without the oracle."""

    # Calls the oracle may not have yet: through it where it has them, else to the manager.
    OPTIONAL = (
        "get_load_source",
        "config_info",
        "has_pending_work",
        "on_schedule_end",
        "on_reset_flushed",
        "shutdown",
        "touch",
    )

    def __init__(
        self,
        oracle: LockstepManager,
        adapter: Any,
        real: Any,
        checks: Checks,
        fault: str | None = None,
    ):
        self.oracle = oracle
        self.adapter = adapter
        self.real = real
        self.checks = checks
        self.fault = fault
        self.calls: Counter = Counter()
        self.unchecked: set[str] = set()
        self._faulted = False

    @property
    def lock(self):
        return getattr(self.real, "lock", None) or contextlib.nullcontext()

    def _through(self, name: str, *args, **kwargs) -> Any:
        """The call through the oracle; what the real manager answered (``None`` where the
        oracle did not ask it: a call the target lacks)."""
        self.calls[name] += 1
        self.adapter.raw = _NOT_ASKED
        getattr(self.oracle, name)(*args, **kwargs)
        raw, self.adapter.raw = self.adapter.raw, None
        return None if raw is _NOT_ASKED else raw

    def lookup(self, key, req_context=None):
        return self._through("lookup", key, req_context)

    def prepare_load(self, keys, req_context=None):
        keys = list(keys)
        out = self._through("prepare_load", keys, req_context)
        self.checks.loaded(keys)
        return out

    def complete_load(self, keys, req_context=None):
        return self._through("complete_load", list(keys), req_context)

    def prepare_store(self, keys, req_context):
        keys = list(keys)
        self.checks.offered(keys, req_context)
        out = self._through("prepare_store", keys, req_context)
        self.checks.prepared(keys, req_context, out)
        return out

    def complete_store(self, keys, req_context=None, success: bool = True):
        keys = list(keys)
        if self.fault == "drop_complete" and not self._faulted:
            self._faulted = True
            return None
        self._through("complete_store", keys, req_context, success=success)
        self.checks.completed(keys)
        if self.fault == "double_complete" and not self._faulted:
            self._faulted = True
            self._through("complete_store", keys, req_context, success=success)
            self.checks.completed(keys)
        return None

    def on_new_request(self, req_context):
        name = getattr(self.oracle, "name", None)
        if callable(name):  # a divergence names the request by its id
            name(req_context, str(getattr(req_context, "req_id", "?")))
        return self._through("on_new_request", req_context)

    def on_request_finished(self, req_context):
        return self._through("on_request_finished", req_context)

    def reset_cache(self):
        out = self._through("reset_cache")
        self.checks.reset()
        return out

    def take_events(self):
        events = list(self._through("take_events") or ())
        if self.fault == "drop_removals":
            events = [e for e in events if not getattr(e, "removed", False)]
        return iter(events)

    def get_stats(self):
        self.calls["get_stats"] += 1
        self.adapter.raw = _NOT_ASKED
        plain = self.oracle.get_stats() or {}
        self.checks.stats["skips"] += int(plain.get(STORES_SKIPPED, 0) or 0)
        raw, self.adapter.raw = self.adapter.raw, None
        return None if raw is _NOT_ASKED else raw

    def __getattr__(self, name: str) -> Any:
        if name not in self.OPTIONAL:
            raise AttributeError(name)
        real = getattr(self.real, name)  # AttributeError where the release lacks it
        checked = getattr(type(self.oracle), name, None)

        def call(*args, **kwargs):
            if checked is not None:
                return self._through(name, *args, **kwargs)
            self.calls[name] += 1
            self.unchecked.add(name)
            return real(*args, **kwargs)

        return call


# ---------------------------------------------------------------------------- request-level checks
class Checks:
    """The checks that sit on top of the oracle (see the module docstring). Each records its
    first failure in ``failure`` (one line), which the machine raises."""

    def __init__(
        self, threshold: int, is_ready: Callable[[bytes], bool], name: Callable[[bytes], str]
    ):
        self.threshold = threshold
        self.is_ready = is_ready
        self.name = name
        self.failure = ""
        self.problems: list[str] = []  # every failure, the first 20 (a replay reads them)
        self.generation = 0
        self.offerers: dict[bytes, set[tuple[int, int]]] = {}
        self.handles: dict[int, tuple[Any, int]] = {}
        self.specs: dict[int, tuple[Any, tuple[bytes, ...]]] = {}  # id(store_spec) -> keys
        self.jobs: dict[int, tuple[bytes, ...]] = {}  # open store job -> its keys
        self.flushed_by_reset: set[int] = set()  # jobs a reset flushed (never completed)
        self.completions: list[tuple[bytes, ...]] = []  # complete_store calls of this update
        self.announced: set[bytes] = set()  # (hash + group) of the CPU-tier events, replayed
        self.dirty: set[bytes] = set()  # keys whose readiness a call may have changed
        self.ready: dict[bytes, tuple[Any, int]] = {}  # ready key -> its name in events
        self.names_of: dict[tuple[Any, int], bytes] = {}
        self.outcome: dict[tuple[int, int, bytes], bool] = {}  # (who, key) -> admitted or not
        self.is_finished: Callable[[str], bool] = lambda req_id: False
        self.stats = Counter()  # what happened, for the coverage labels and the replay
        self.cold: list[str] = []  # the cold admissions, in order

    def fail(self, text: str) -> None:
        if not self.failure:
            self.failure = text
        if len(self.problems) < 20:
            self.problems.append(text)

    # --- cold admissions
    def _handle(self, ctx: Any) -> int:
        entry = self.handles.get(id(ctx))
        if entry is None or entry[0] is not ctx:
            entry = (ctx, self.stats["contexts"])
            self.stats["contexts"] += 1
            self.handles[id(ctx)] = entry
        return entry[1]

    def offered(self, keys: list[bytes], ctx: Any) -> None:
        who = (self._handle(ctx), self.generation)
        again = [self.outcome.get((*who, key)) for key in keys]
        if any(a is False for a in again):
            self.stats["retries"] += 1  # a key this request offered before and got None for
        if any(a is True for a in again):
            self.stats["re-offers"] += 1  # a key it offered before with success: a restart
        if self.is_finished(getattr(ctx, "req_id", "")):
            self.stats["finish-time offers"] += 1
            if any(a is False for a in again):
                self.stats["finish-time retries"] += 1
        for key in keys:
            self.offerers.setdefault(key, set()).add(who)
        self._last = (who, keys)

    def prepared(self, keys: list[bytes], ctx: Any, out: Any) -> None:
        who, _ = self._last
        for key in keys:
            self.outcome[(*who, key)] = out is not None
        self.stats["offers"] += 1
        if out is None:
            self.stats["allocation failures"] += 1
            return
        stored = [bytes(k) for k in out.keys_to_store]
        self.dirty.update(stored)
        self.dirty.update(bytes(k) for k in out.evicted_keys)
        self.stats["admitted"] += len(stored)
        if out.evicted_keys:
            self.stats["evictions"] += 1
            self.stats["evicted keys"] += len(out.evicted_keys)
        self.specs[id(out.store_spec)] = (out.store_spec, tuple(stored))
        if self.threshold < 2:
            return
        for key in stored:
            n = len(self.offerers.get(key, ()))
            if n < self.threshold:
                self.stats["cold admissions"] += 1
                self.cold.append(
                    f"{self.name(key)} admitted after {n} distinct request(s) offered it"
                )
                self.fail(
                    f"cold admission: {self.name(key)} was admitted after {n} distinct "
                    f"request(s) offered it, store_threshold={self.threshold}"
                )

    def loaded(self, keys: list[bytes]) -> None:
        self.stats["loads"] += 1
        self.stats["loaded keys"] += len(keys)

    # --- store jobs
    def issued(self, job_id: int, dst_spec: Any, gpu_blocks: int, blocks_per_chunk: int) -> None:
        entry = self.specs.pop(id(dst_spec), None)
        if entry is None or entry[0] is not dst_spec:
            self.fail(f"store job {job_id}: its CPU spec is not one the manager returned")
            return
        keys = entry[1]
        if job_id in self.jobs:
            self.fail(f"store job {job_id} issued twice")
        if gpu_blocks != len(keys) * blocks_per_chunk:
            self.fail(
                f"store job {job_id}: {gpu_blocks} GPU block(s) for {len(keys)} "
                f"chunk(s) of {blocks_per_chunk} block(s)"
            )
        self.jobs[job_id] = keys

    def completed(self, keys: list[bytes]) -> None:
        self.stats["completed keys"] += len(keys)
        self.dirty.update(bytes(k) for k in keys)
        # In any order: 0.33.0 keeps a job's keys in a set, 0.34.0 in prefix order.
        self.completions.append(tuple(sorted(bytes(k) for k in keys)))

    def reported(self, store_jobs: Iterable[int]) -> None:
        """After an update whose output reported ``store_jobs`` done: each open one got exactly
        one complete_store of its keys in that update, and no other complete_store came."""
        expected = Counter()
        for job in store_jobs:
            if job in self.flushed_by_reset:
                self.stats["stale completions"] += 1
                continue
            keys = self.jobs.pop(job, None)
            if keys is None:
                self.fail(f"store job {job} reported done, but it is not open")
                continue
            expected[tuple(sorted(keys))] += 1
        got = Counter(self.completions)
        self.completions = []
        if got != expected:
            extra, missing = got - expected, expected - got
            what = []
            if missing:
                what.append(
                    "no complete_store for " + "; ".join(self._keys(k) for k in missing.elements())
                )
            if extra:
                what.append(
                    "complete_store with no store job reported for it: "
                    + "; ".join(self._keys(k) for k in extra.elements())
                )
            self.fail("store jobs: " + ", ".join(what))

    def _keys(self, keys: tuple[bytes, ...]) -> str:
        return "[" + ", ".join(self.name(k) for k in keys) + "]"

    def reset(self) -> None:
        self.generation += 1
        self.stats["stale keys"] += sum(len(keys) for keys in self.jobs.values())
        self.flushed_by_reset.update(self.jobs)
        self.jobs.clear()
        self.specs.clear()
        self.announced.clear()  # the replay starts over at a reset, as the oracle's does
        self.dirty.update(self.ready)
        self.stats["resets"] += 1

    # --- events
    def published(self, events: Iterable[Any]) -> None:
        """Replay the CPU-tier events of one published batch. Events name a block by its
        hash as vLLM publishes it (``external``) and its group."""
        for event in events:
            if getattr(event, "medium", None) != "CPU":
                continue
            group = int(getattr(event, "group_idx", None) or 0)
            names = {(h, group) for h in getattr(event, "block_hashes", ())}
            if type(event).__name__ == "BlockRemoved":
                self.announced -= names
            elif type(event).__name__ == "BlockStored":
                self.announced |= names

    def check_events(self, external: Callable[[bytes], Any]) -> None:
        """After an update (every event drained): the announced keys are the ready keys.
        Incremental: only keys a call named since the last check are looked up again."""
        for key in self.dirty:
            name = (external(key[:-4]), int.from_bytes(key[-4:], "big"))
            self.names_of[name] = key
            if self.is_ready(key):
                self.ready[key] = name
            else:
                self.ready.pop(key, None)
        self.dirty.clear()
        ready = set(self.ready.values())
        if ready != self.announced:

            def name(n):
                return self.name(self.names_of[n]) if n in self.names_of else repr(n)

            more = sorted(name(n) for n in self.announced - ready)
            less = sorted(name(n) for n in ready - self.announced)
            self.fail(
                "published CPU events differ from the manager's ready keys: "
                + ", ".join(
                    filter(
                        None,
                        [
                            f"announced but not ready {more}" if more else "",
                            f"ready but never announced {less}" if less else "",
                        ],
                    )
                )
            )


# ---------------------------------------------------------------------------- the worker side
class FakeWorker:
    """The connector's worker side, as the machine drives it (see the module docstring)."""

    def __init__(self, checks: Checks, blocks_per_chunk: int):
        self.checks = checks
        self.blocks_per_chunk = blocks_per_chunk
        self.in_flight: dict[int, tuple[str, str]] = {}  # job -> ("store" | "load", req_id)
        self.done: list[int] = []  # completed, not reported yet
        self.reported: set[int] = set()
        self.started: dict[int, int] = {}  # job -> the engine step that issued it
        self.clock = 0  # the engine step now (the engine sets it)
        self.stats = Counter()

    def receive(self, meta: Any) -> None:
        """One step's connector metadata, as the worker gets it before the forward pass."""
        if meta is None:
            return
        for job_id, job in (getattr(meta, "store_jobs", None) or {}).items():
            gpu = len(getattr(job.src_spec, "block_ids", ()))
            self.checks.issued(job_id, job.dst_spec, gpu, self.blocks_per_chunk)
            self._start(job_id, "store", job.req_id)
        for job_id, job in (getattr(meta, "load_jobs", None) or {}).items():
            self._start(job_id, "load", job.req_id)
            if getattr(job, "sync", False):  # waited for within the step: no finished_recving
                self.stats["sync loads"] += 1
                self.in_flight[job_id] = ("sync load", job.req_id)
                self.finish([job_id])
        flush = [j for j in (getattr(meta, "jobs_to_flush", None) or ()) if j in self.in_flight]
        if flush:
            self.stats["flushes"] += 1
            self.finish(flush)

    def _start(self, job_id: int, kind: str, req_id: str) -> None:
        if job_id in self.in_flight or job_id in self.reported or job_id in self.done:
            self.checks.fail(f"job id {job_id} issued twice")
        self.in_flight[job_id] = (kind, req_id)
        self.started[job_id] = self.clock

    def finish(self, jobs: Iterable[int]) -> None:
        for job in jobs:
            if job in self.in_flight and job not in self.done:
                self.done.append(job)

    def jobs(self, kind: str | None = None) -> list[int]:
        """In-flight jobs not completed yet, oldest first."""
        done = set(self.done)
        return [
            j
            for j, (k, _) in self.in_flight.items()
            if j not in done and (kind is None or k == kind)
        ]

    def due(self, store_delay: int, load_delay: int) -> list[int]:
        """In-flight jobs issued at least that many engine steps ago (a replay's delays)."""
        return [
            j
            for j in self.jobs()
            if self.clock + 1 - self.started[j]
            >= (store_delay if self.in_flight[j][0] == "store" else load_delay)
        ]

    def report(self) -> tuple[Any, list[int]]:
        """The ``KVConnectorOutput`` of everything completed since the last report, and the
        store jobs in it."""
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
            OffloadingWorkerMetadata,
        )
        from vllm.v1.outputs import KVConnectorOutput

        meta = OffloadingWorkerMetadata()
        recving, stores = set(), []
        for job in self.done:
            kind, req_id = self.in_flight.pop(job)
            self.started.pop(job, None)
            meta.mark_completed(job)
            self.reported.add(job)
            if kind == "load":
                recving.add(req_id)
            elif kind == "store":
                stores.append(job)
        self.done = []
        output = KVConnectorOutput(
            finished_sending=set(),
            finished_recving=recving,
            kv_connector_worker_meta=meta if meta.completed_jobs else None,
        )
        return output, stores


# ---------------------------------------------------------------------------- the engine
class _Published:
    """Stands for the scheduler's KV event publisher: hands each batch to the checks."""

    def __init__(self, checks: Checks):
        self.checks = checks

    def publish(self, batch: Any) -> None:
        self.checks.published(getattr(batch, "events", ()))

    def shutdown(self) -> None:
        return None


@dataclass
class _Batch:
    output: Any  # SchedulerOutput
    sampled: dict[str, bool]  # req_id -> samples a token (not a prefill chunk)
    kv_output: Any
    stores: list[int]


class VllmEngine:
    """vLLM's scheduler with the connector, a checked manager and the fake worker, stepped
    as an engine core steps it (sync: schedule, execute, update; async: a queue of two
    batches, as ``step_with_batch_queue`` keeps it)."""

    def __init__(
        self,
        setup: Setup,
        target: Any = None,
        *,
        fault: str | None = None,
        lockstep: bool = True,
        key_name: Callable[[bytes], str] | None = None,
        log: list[dict[str, Any]] | None = None,
    ):
        """``target``: a resolved ``vllm`` or ``vllm=MODULE:ATTR`` target (``None``: the
        installed release's ``vllm``)."""
        from vllm.v1.structured_output import StructuredOutputManager

        if target is None:
            from .targets import resolve_target

            target = resolve_target("vllm")
        cfg = configs()
        self.setup = setup
        self.cfg = cfg
        self.target = target
        cls = cfg.scheduler_classes[setup.async_scheduling]
        if cls is None:
            raise RuntimeError("this vLLM has no AsyncScheduler")
        vllm_config = cfg.vllm(setup.shape)
        chunk_bytes = cfg.chunk_bytes(setup.shape, setup.blocks_per_chunk)
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config
        extra.clear()
        extra.update(
            cpu_bytes_to_use=setup.num_chunks * chunk_bytes,
            blocks_per_chunk=setup.blocks_per_chunk,
            store_threshold=setup.store_threshold,
            max_tracker_size=setup.max_tracker_size,
            eviction_policy=setup.policy,
            offload_prompt_only=setup.offload_prompt_only,
        )
        vllm_config.cache_config.num_gpu_blocks = setup.gpu_blocks
        self.sched = cls(
            vllm_config=vllm_config,
            kv_cache_config=cfg.kv_cache_config(setup.gpu_blocks, setup.block_size),
            structured_output_manager=StructuredOutputManager(vllm_config),
            block_size=setup.block_size,
            log_stats=True,
        )
        connector = self.sched.connector
        self.connector = getattr(connector, "connector_scheduler", None) or connector.scheduler
        real = self.connector.manager
        factory = manager_factory(target)
        info = spec_config_info(setup, chunk_bytes)  # what the spec told the manager it built
        if factory is not None:
            takes_info = factory_takes(target.factory, "info")
            real, info = factory(setup, real), (info if takes_info else None)
        self.key_name = key_name or (lambda k: k.hex()[:8])
        self.adapter = target.adapter(real)
        self.checks = Checks(setup.store_threshold, self._ready, self.key_name)
        self.oracle = build_oracle(
            self.adapter, setup, target, key_name=self.key_name, log=log, config_info=info
        )
        front_of = self.oracle if lockstep else _Unchecked(self.adapter)
        self.front = Front(front_of, self.adapter, real, self.checks, fault)
        self.connector.manager = self.front
        self.sched.kv_event_publisher = _Published(self.checks)
        self.worker = FakeWorker(self.checks, setup.blocks_per_chunk)
        self.queue: list[_Batch] = []
        self.steps = 0
        self.engine_clock = True  # the oracle's step is the engine step (a machine sets its own)
        self.counts = Counter()

    # --- what the checks read
    def _ready(self, key: bytes) -> bool:
        return str(self.adapter.lookup(key, None)) == "HIT"

    # --- engine events
    def add_request(self, req_id: str, tokens: list[int], max_tokens: int) -> Any:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        request = Request(
            request_id=req_id,
            prompt_token_ids=list(tokens),
            sampling_params=params,
            pooling_params=None,
            block_hasher=self.cfg.block_hasher(self.setup.block_size),
        )
        self.sched.add_request(request)
        return request

    def abort(self, req_id: str) -> None:
        from vllm.v1.request import RequestStatus

        self.sched.finish_requests(req_id, RequestStatus.FINISHED_ABORTED)

    def reset(self, running_too: bool = False) -> bool:
        """The path vLLM's ``reset_prefix_cache(reset_connector=True)`` takes."""
        return bool(
            self.sched.reset_prefix_cache(reset_running_requests=running_too, reset_connector=True)
        )

    def can_step(self) -> bool:
        return bool(self.queue) or self.sched.has_requests()

    def step(self) -> None:
        """One engine-core step."""
        self.steps += 1
        self.worker.clock = self.steps
        if self.engine_clock:
            self.oracle.set_step(self.steps)
        scheduled = False
        if self.sched.has_requests():
            out = self.sched.schedule()
            self.worker.receive(out.kv_connector_metadata)
            kv_output, stores = self.worker.report()
            sampled = {}
            for req_id in out.num_scheduled_tokens:
                req = self.sched.requests.get(req_id)
                sampled[req_id] = req is not None and not req.is_prefill_chunk
            if out.preempted_req_ids:
                self.counts["preemptions"] += len(out.preempted_req_ids)
            self.queue.append(_Batch(out, sampled, kv_output, stores))
            scheduled = out.total_num_scheduled_tokens > 0
        if not self.queue:
            return
        if self.setup.async_scheduling and len(self.queue) < 2 and scheduled:
            self.counts["overlapped"] += 1
            return  # the engine returns to schedule the next batch before waiting
        self._update(self.queue.pop(0))

    def _update(self, batch: _Batch) -> None:
        from vllm.v1.outputs import ModelRunnerOutput

        req_ids = list(batch.output.num_scheduled_tokens)
        kwargs: dict[str, Any] = dict(
            req_ids=req_ids,
            sampled_token_ids=[[SAMPLED_TOKEN] if batch.sampled[r] else [] for r in req_ids],
            kv_connector_output=batch.kv_output,
        )
        if "req_id_to_index" in self.cfg.runner_output_fields:
            kwargs["req_id_to_index"] = {r: i for i, r in enumerate(req_ids)}
        fields = self.cfg.runner_output_fields
        kwargs = {k: v for k, v in kwargs.items() if k in fields}
        self.sched.update_from_output(batch.output, ModelRunnerOutput(**kwargs))
        self.checks.reported(batch.stores)
        if self.setup.kv_events:  # with events off, nothing is announced, by design
            self.checks.check_events(self.cfg.external_hash)

    def drain(self) -> None:
        """Process every queued batch (the engine waits for what it already executed)."""
        while self.queue:
            self._update(self.queue.pop(0))

    # --- GPU blocks held outside the scheduler (so the next step that needs one preempts)
    def hold_gpu_blocks(self) -> list[Any]:
        pool = self.sched.kv_cache_manager.block_pool
        n = pool.get_num_free_blocks()
        return pool.get_new_blocks(n) if n else []

    def release_gpu_blocks(self, blocks: list[Any]) -> None:
        if blocks:
            self.sched.kv_cache_manager.block_pool.free_blocks(blocks)


SAMPLED_TOKEN = 7


class _Unchecked:
    """In place of the oracle (``lockstep=False``, for the tests of the request-level checks
    alone): every call goes to the adapter unchecked."""

    def __init__(self, adapter: Any):
        self.adapter = adapter

    def set_step(self, step: int) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.adapter, name)


def spec_config_info(setup: Setup, chunk_bytes: int) -> list[dict[str, Any]]:
    """What a manager built by the connector's ``CPUOffloadingSpec`` publishes as its
    configuration (``config_info``): the tier's chunks, blocks per chunk, size in bytes (the
    spec's aligned chunk size) and the tokens it holds for requests of ``max_model_len``
    tokens (one full-attention group: the chunks one such request needs, rounded up)."""
    chunk_tokens = setup.block_size * setup.blocks_per_chunk
    per_request = -(-setup.max_model_len // chunk_tokens)
    return [
        {
            "cpu_num_chunks": setup.num_chunks,
            "cpu_blocks_per_chunk": setup.blocks_per_chunk,
            "cpu_kv_cache_size_bytes": setup.num_chunks * chunk_bytes,
            "cpu_kv_cache_size_tokens": setup.num_chunks * setup.max_model_len // per_request,
        }
    ]


def build_oracle(
    adapter: Any,
    setup: Setup,
    target: Any,
    *,
    key_name=None,
    log=None,
    config_info: list | None = None,
) -> LockstepManager:
    """The lockstep oracle over ``adapter``, judging it as ``target`` says (exact for a vLLM
    release, foreign for ``foreign=vllm...``: spec §9), the model built with the recency the
    target was found to have (spec §4). ``config_info``: what the manager was told to publish
    (a manager the connector's spec built), else the model's own answer."""
    from kvgate.model.cache import Model

    model = Model(
        setup.num_chunks,
        setup.policy,
        setup.store_threshold,
        setup.max_tracker_size,
        target.recencies[0],
        enable_events=setup.kv_events,
    )
    if config_info is not None:
        model.config_info = lambda: [dict(m) for m in config_info]
    kwargs: dict[str, Any] = {"foreign": target.foreign, "log": log}
    if key_name is not None:
        kwargs["key_name"] = key_name
    return LockstepManager(adapter, model, **kwargs)


def manager_factory(target: Any) -> Callable[[Setup, Any], Any] | None:
    """What stands behind the connector for ``target``: ``None`` for ``vllm`` (the manager the
    connector's own spec built), else the ``vllm=MODULE:ATTR`` class built with the setup's
    sizes (``target.factory``: num_chunks, cache_policy, store_threshold, max_tracker_size,
    enable_events as the connector's spec would pass it)."""
    if target.spec in ("vllm", "foreign=vllm"):
        return None

    def build(setup: Setup, built: Any, make=target.factory) -> Any:
        kwargs = {}
        if factory_takes(make, "info"):  # what the spec told its own manager to publish
            kwargs["info"] = PublishedInfo(built.config_info()[0])
        return make(
            setup.num_chunks,
            cache_policy=setup.policy,
            store_threshold=setup.store_threshold,
            max_tracker_size=setup.max_tracker_size,
            enable_events=setup.kv_events,
            **kwargs,
        )

    return build


@dataclass(frozen=True)
class PublishedInfo:
    """The facts a manager publishes about its tier (``config_info``), handed to a
    ``vllm=MODULE:ATTR`` manager as the connector's spec hands its own manager a
    ``CPUOffloadingInfo``: the manager asks it only for ``as_config_info()``."""

    facts: Any

    def as_config_info(self) -> dict:
        return dict(self.facts)


def is_vllm_target(spec: str) -> bool:
    """``vllm``, ``vllm=MODULE:ATTR``, either of them ``foreign=``."""
    spec = spec.removeprefix("foreign=")
    return spec == "vllm" or spec.startswith("vllm=")
