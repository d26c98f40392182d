"""vLLM's own ``Scheduler`` with the ``OffloadingConnector``, a checked manager and the fake
worker, stepped as an engine core steps it (spec §7)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...adapters import factory_takes
from . import faults
from .answer_types import watch_answers
from .bytes_worker import BytesWorker
from .checks import Checks
from .configs import Setup, configs
from .error_log import ErrorLog
from .event_payload import Publisher
from .exact import ExactChecks
from .fake_worker import FakeWorker
from .front import Front, _Unchecked, build_oracle, manager_factory, spec_config_info
from .layouts import offload_caps, offload_key
from .load_tiers import LOAD_TIERS, TIER_LISTS
from .lookup_metrics import LookupDelays
from .warning_claims import WarningClaims

# Every known-bad variant (tests of the checks), from the one registry that plants them.
FAULTS = tuple(faults.FAULTS)


# ---------------------------------------------------------------------------- the engine
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
        move_bytes: bool = True,
        key_name: Callable[[bytes], str] | None = None,
        log: list[dict[str, Any]] | None = None,
    ):
        """``target``: a resolved ``vllm`` or ``vllm=MODULE:ATTR`` target (``None``: the
        installed release's ``vllm``)."""
        from vllm.v1.structured_output import StructuredOutputManager

        if target is None:
            from ...targets import resolve_target

            target = resolve_target("vllm")
        cfg = configs()
        self.setup = setup
        self.cfg = cfg
        self.target = target
        cls = cfg.scheduler_classes[setup.async_scheduling]
        if cls is None:
            raise RuntimeError("this vLLM has no AsyncScheduler")
        vllm_config = cfg.vllm(setup.shape)
        chunk_bytes = cfg.chunk_bytes(setup.shape, setup.blocks_per_chunk, setup.layout)
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
        if setup.sync_load_budget:
            extra["sync_load_budget_bytes"] = setup.sync_load_budget
        if setup.self_describing:
            extra["self_describing_kv_events"] = True
        vllm_config.cache_config.num_gpu_blocks = setup.gpu_blocks
        kv_cache_config = cfg.kv_cache_config(
            setup.gpu_blocks, setup.block_size, setup.layout, setup.retention, setup.shape
        )
        resolved = cfg.block_sizes(kv_cache_config, setup.shape)
        hashing = {}
        if resolved is not None:
            if resolved != (setup.block_size, setup.hash_size):
                raise RuntimeError(f"vLLM resolves block sizes {resolved} for {setup}")
            hashing["hash_block_size"] = setup.hash_size
        self.sched = cls(
            vllm_config=vllm_config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=StructuredOutputManager(vllm_config),
            block_size=setup.block_size,
            log_stats=True,
            **hashing,
        )
        connector = self.sched.connector
        self.connector = getattr(connector, "connector_scheduler", None) or connector.scheduler
        # a patched target may carry its fixes to the connector and the scheduler beside its
        # manager
        factory_of = getattr(target, "factory", None)
        for name, part in (("mend_connector", self.connector), ("mend_scheduler", self.sched)):
            mend = getattr(factory_of, name, None)
            if mend is not None:
                mend(part)
        real = self.connector.manager
        factory = manager_factory(target)
        # what the spec told the manager it built
        info: list[dict[str, Any]] | None = spec_config_info(setup, chunk_bytes)
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
        self.front = faults.built(fault, Front)(front_of, self.adapter, real, self.checks)
        self.front.reports_stats = setup.manager_stats
        self.front.tiered = setup.tiered
        self.connector.manager = self.front
        layout = setup.layout
        self.sched.kv_event_publisher = faults.built(fault, Publisher)(
            self.checks,
            # a recurrent group's events carry no tokens (a state, not KV per token)
            described=lambda g: (
                setup.self_describing and layout.windows[g] is None and g != layout.recurrent
            ),
            blocks_per_chunk=setup.blocks_per_chunk,
            chunk_tokens=setup.block_size * setup.blocks_per_chunk,
            prefix_of=self._prefix_of_event,
            describe=lambda t: self.describe(t),
        )
        self.prefixes: dict[bytes, tuple[int, ...]] = {}  # chunk key -> the prefix it names
        self.offload_caps = offload_caps()  # the connector reads max_offload_tokens
        # req -> block hashes already learned, and the last of them
        self._learned: dict[str, tuple[int, Any]] = {}
        self._by_external: dict[tuple[Any, int], list[bytes]] = {}  # (event hash, group) -> key
        self.describe: Callable[[tuple[int, ...]], str] = lambda t: repr(list(t))
        self.move_bytes = move_bytes
        self.worker: FakeWorker = faults.built(fault, BytesWorker)(
            self.checks,
            gpu_blocks=setup.gpu_blocks,
            num_chunks=setup.num_chunks,
            block_size=setup.block_size,
            blocks_per_chunk=setup.blocks_per_chunk,
            layout=setup.layout,
            tokens_of=self._tokens_of,
            blocks_of=self._blocks_of,
            prefix_of=self.prefix_of,
            describe=lambda t: self.describe(t),
        )
        if not move_bytes:  # a long replay: jobs and their accounting only, no data
            if type(self.worker) is not BytesWorker:
                raise ValueError(
                    f"fault {fault!r} breaks the bytes worker, which move_bytes=False leaves out"
                )
            self.worker = FakeWorker(self.checks, setup.blocks_per_chunk)
        # a fault of the connector is planted before the checks wrap it: they judge it
        faults.plant_on_connector(fault, self.connector, self)
        self.exact = ExactChecks(self, self.checks, self._ready)
        self.front.exact = self.exact
        self.lookup_delays = LookupDelays(self.connector, self.checks)
        self.error_log = ErrorLog(self.connector, self.checks)
        self.warnings = WarningClaims(self, self.checks)
        watch_answers(self.connector, self.checks)
        self.queue: list[_Batch] = []
        self.requests: dict[str, Any] = {}  # every request added, finished ones too
        self.transfer_params: dict[str, dict] = {}  # req -> the kv_transfer_params it was sent
        self.steps = 0
        self.engine_clock = True  # the oracle's step is the engine step (a machine sets its own)
        self.counts: Counter[str] = Counter()

    # --- what the checks read
    def _ready(self, key: bytes) -> bool:
        return str(self.adapter.lookup(key, None)) == "HIT"

    def _tokens_of(self, req_id: str) -> list[int] | None:
        """A request's tokens: its prompt, then what it samples (always ``SAMPLED_TOKEN``)."""
        req = self.sched.requests.get(req_id)
        if req is None:
            return None
        prompt = list(req.prompt_token_ids)
        limit = getattr(req, "max_tokens", None) or self.setup.max_model_len
        return prompt + [SAMPLED_TOKEN] * (limit + 1)

    def _blocks_of(self, req_id: str) -> tuple[list[int], ...]:
        """A request's GPU blocks, per KV-cache group (the null block, 0, where a group freed
        one: below a sliding window)."""
        return tuple(list(g) for g in self.sched.kv_cache_manager.get_block_ids(req_id))

    def prefix_of(self, key: bytes) -> tuple[int, ...] | None:
        """The prefix of tokens ``key``'s chunk ends (learned from the live requests)."""
        prefix = self.prefixes.get(key)
        if prefix is None:
            self.learn_prefixes()
            prefix = self.prefixes.get(key)
        return prefix

    def _prefix_of_event(self, external: Any, group: int) -> tuple[int, ...] | None:
        """The prefix a chunk named in an event by its key's hash (as published) ends."""
        self.learn_prefixes()
        for key in self._by_external.get((external, group), ()):
            return self.prefixes.get(key)
        return None

    def learn_prefixes(self) -> None:
        """The prefix each chunk key of each live request names (every group's key of a chunk
        names the same prefix)."""
        # every block hash's key where a prefix may end inside a chunk (a recurrent group's
        # partial tails), else each chunk's last
        per_key = 1 if self.setup.layout.recurrent is not None else self.setup.hashes_per_chunk
        hs = self.setup.hash_size
        for req in self.sched.requests.values():
            tokens = None
            hashes = req.block_hashes
            learned, last = self._learned.get(req.request_id, (0, None))
            if learned and (learned > len(hashes) or hashes[learned - 1] != last):
                learned = 0  # a streaming session's next input: its last block hashed again
            if learned >= len(hashes):
                continue
            self._learned[req.request_id] = (len(hashes), hashes[-1])
            for i in range(learned, len(hashes)):
                block_hash = hashes[i]
                if (i + 1) % per_key:
                    continue
                if offload_key(block_hash, 0) in self.prefixes:
                    continue
                tokens = tokens if tokens is not None else list(req.all_token_ids)
                for group in range(len(self.setup.layout.windows)):
                    key = offload_key(block_hash, group)
                    self.prefixes[key] = tuple(tokens[: (i + 1) * hs])
                    if self.setup.self_describing:
                        name = (self.cfg.external_hash(bytes(block_hash)), group)
                        self._by_external.setdefault(name, [key])

    # --- engine events
    def add_request(
        self,
        req_id: str,
        tokens: list[int],
        max_tokens: int,
        max_load: int | str | None = None,
        resumable: bool = False,
        max_offload: int | None = None,
    ) -> Any:
        """``max_load``: the request's cap on tokens loaded from the CPU tier (its
        ``kv_transfer_params``' ``max_load_tokens``, read by the connector where the release
        has it), or ``'cpu'``/``'cpu-last'``: the tiers it may load from named instead
        (``load_tiers.TIER_LISTS``).
        ``resumable``: a streaming-input session (where the release has them,
        ``layouts.streaming_sessions``): ``req_id`` again sends the session's next input,
        whose ``tokens`` vLLM appends to the prompt after the turn's output but its last
        sampled token. ``max_offload``: the request's cap on tokens offloaded (its
        ``max_offload_tokens``, where the release reads it: ``layouts.offload_caps``)."""
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        extra: dict[str, Any] = {}
        if isinstance(max_load, int):
            self.transfer_params[req_id] = {"max_load_tokens": max_load}
        elif max_load is not None:
            self.transfer_params[req_id] = {LOAD_TIERS: [dict(e) for e in TIER_LISTS[max_load]]}
        if max_offload is not None and self.offload_caps:
            self.transfer_params.setdefault(req_id, {})["max_offload_tokens"] = max_offload
            self.counts["capped offloads"] += 1
        if req_id in self.transfer_params:  # the connector gets a copy: this one is the record
            extra["extra_args"] = {"kv_transfer_params": dict(self.transfer_params[req_id])}
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, **extra)
        session: dict[str, Any] = {"resumable": True} if resumable else {}
        request = Request(
            request_id=req_id,
            prompt_token_ids=list(tokens),
            sampling_params=params,
            pooling_params=None,
            block_hasher=self.cfg.block_hasher(self.setup.hash_size),
            **session,
        )
        if req_id in self.requests:
            self.counts["session inputs"] += 1
        self.sched.add_request(request)
        self.requests.setdefault(req_id, request)  # a session's next input joins its first
        return request

    def end_session(self, req_id: str) -> None:
        """The client closes a streaming-input session: vLLM's closing request (the session's
        id, not resumable) ends it once its current turn stops."""
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        closing = Request(
            request_id=req_id,
            prompt_token_ids=[0],
            sampling_params=SamplingParams(max_tokens=1, ignore_eos=True),
            pooling_params=None,
            block_hasher=self.cfg.block_hasher(self.setup.hash_size),
        )
        self.sched.add_request(closing)

    def abort(self, req_id: str) -> None:
        from vllm.v1.request import RequestStatus

        self.sched.finish_requests(req_id, RequestStatus.FINISHED_ABORTED)

    def reset(self, running_too: bool = False) -> bool:
        """The path vLLM's ``reset_prefix_cache(reset_connector=True)`` takes. With
        ``running_too`` vLLM preempts the running requests before it resets, and keeps them
        preempted when it then refuses the reset (it raises): the checks hear of those
        preemptions either way (a preempted request offers its chunks again)."""
        running = [r.request_id for r in self.sched.running] if running_too else []
        try:
            return bool(
                self.sched.reset_prefix_cache(
                    reset_running_requests=running_too, reset_connector=True
                )
            )
        finally:
            left = {r.request_id for r in self.sched.running}
            self.exact.preempted([r for r in running if r not in left], by_reset=True)

    def shutdown(self) -> None:
        """The engine stops: vLLM's scheduler shuts its connector down (spec §7.1)."""
        told = self.front.calls["shutdown"]
        self.sched.shutdown()
        self.exact.shut_down(self.front.calls["shutdown"] - told, self.connector.manager)

    def can_step(self) -> bool:
        if self.queue or self.sched.has_requests():
            return True
        self.exact.idle()
        return False

    def step(self) -> None:
        """One engine-core step."""
        self.steps += 1
        self.worker.clock = self.front.step = self.steps
        if self.engine_clock:
            self.oracle.set_step(self.steps)
        scheduled = False
        if self.sched.has_requests():
            self.front.in_schedule = True
            try:
                out = self.sched.schedule()
            finally:
                self.front.in_schedule, self.front.let_go = False, None
            if self.move_bytes:
                self.learn_prefixes()
            self.worker.receive(out.kv_connector_metadata)
            # the scheduler's copy-on-write hand-offs run before the batch (a recurrent group's
            # state at a boundary inside a block, copied into a block of its own)
            self.worker.copy_blocks(getattr(out, "kv_cache_block_copies", None) or ())
            computed = {
                r: self.sched.requests[r].num_computed_tokens
                for r in out.num_scheduled_tokens
                if r in self.sched.requests
            }
            self.worker.forward(dict(out.num_scheduled_tokens), computed)
            kv_output, stores = self.worker.report()
            self.exact.preempted(out.preempted_req_ids or ())
            self.exact.scheduled(out.num_scheduled_tokens)
            self.exact.offered_in_time(out.num_scheduled_tokens)
            self.exact.handoffs_offered()
            self.exact.lock_free(self.front.held, "after the step's metadata was built")
            self.error_log.check("by the time the step's metadata was built")
            self.warnings.check("by the time the step's metadata was built")
            self.exact.after_schedule(self._unsettled() | _completed(kv_output))
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
        self.exact.updated(settled=not self.queue)
        self.exact.kept_after_finish("after the scheduler applied an update")
        self.exact.lock_free(self.front.held, "after the scheduler applied an update")
        self.error_log.check("by the time the scheduler applied an update")
        self.warnings.check("by the time the scheduler applied an update")
        self.worker.check_ready(self._ready)
        if self.setup.kv_events:  # with events off, nothing is announced, by design
            self.checks.check_events(self.cfg.external_hash)

    def _unsettled(self) -> set[int]:
        """Jobs the connector has not heard back about: in flight at the worker, or reported
        in a batch whose output has not reached the scheduler yet."""
        jobs = set(self.worker.in_flight)
        for batch in self.queue:
            jobs |= _completed(batch.kv_output)
        return jobs

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


def _completed(kv_output: Any) -> set[int]:
    meta = getattr(kv_output, "kv_connector_worker_meta", None)
    return set(getattr(meta, "completed_jobs", None) or ())
