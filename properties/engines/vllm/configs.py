"""vLLM's scheduling path, built offline on a CPU: what one example's engine is made of
(``Setup``, ``Shape``) and what is slow to build, built once per process (``configs()``).
``unavailable_reason()`` says in one line why none of this can run here."""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from typing import Any

from .adapter import INSTALL_HINT
from .layouts import FULL_ATTENTION, Layout

SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"
CONNECTOR_SCHEDULER_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler"
DUMMY_ARCH = "KvgateDummyForCausalLM"
BLOCK_SIZE = 2  # tokens per GPU block (and per block hash)
MAX_MODEL_LEN = 64
MAX_BATCHED_TOKENS = 8  # small, so that long prompts are prefilled in chunks
MAX_SEQS = 4


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
    try:  # what the machine builds first: the connector's CPU tier, sized from its spec
        configs().chunk_bytes(Shape(), 1)
    except Exception as exc:
        text = str(exc).strip().splitlines()
        why = f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
        return (
            "this vLLM's offloading connector predates what vLLM's scheduler machine drives "
            f"(sizing its CPU tier: {why})"
        )
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
    layout: Layout = FULL_ATTENTION  # the model's KV-cache groups (layouts.py)
    sync_load_budget: int = 0  # bytes a step may load synchronously (0: every load async)
    self_describing: bool = False  # store events carry each chunk's tokens and parent
    # the manager reports its stats (False: its get_stats answers None, as a manager with
    # metrics off, or the base class, does; the connector's own stats go on)
    manager_stats: bool = True
    # the manager answers lookups as a tier that promotes from a slower one does (RETRY while
    # it finds a chunk, HIT_PENDING while it promotes one: front.tiered_answer), where the
    # release's lookups answer those
    tiered: bool = False
    # prefix_cache_retention_interval (vLLM's cache config, copied into the KV-cache config as
    # vLLM's planner does): 0 (vLLM's default) the latest replay boundary and shared-prefix
    # junctions only, ``None`` densely, N every N tokens; left unset where a release lacks it
    retention: int | None = 0
    # tokens per block hash (vLLM's prefix_match_unit); None: one hash a block
    hash_tokens: int | None = None

    def __post_init__(self):
        # a periodic interval without a window is a configuration vLLM refuses: its default
        if self.retention and not self.layout.sliding:
            object.__setattr__(self, "retention", 0)
        if self.layout.recurrent is not None and self.hash_tokens is None:
            # a recurrent group's block spans two block hashes, so that a prefix can end inside
            # a block (a partial tail); its state is one block, so a chunk is one block
            object.__setattr__(self, "hash_tokens", self.block_size)
            object.__setattr__(self, "block_size", 2 * self.block_size)
            object.__setattr__(self, "blocks_per_chunk", 1)
            # the same GPU memory in blocks twice as long: half as many (and so reused as
            # often as the other layouts' blocks are)
            object.__setattr__(self, "gpu_blocks", self.gpu_blocks // 2)

    @property
    def hash_size(self) -> int:
        """Tokens per block hash."""
        return self.hash_tokens or self.block_size

    @property
    def hashes_per_chunk(self) -> int:
        return self.blocks_per_chunk * self.block_size // self.hash_size

    @property
    def shape(self) -> Shape:
        return Shape(
            self.block_size,
            self.max_seqs,
            self.batched_tokens,
            self.max_model_len,
            self.async_scheduling,
            self.kv_events,
            self.retention,
            self.hash_tokens if self.layout.recurrent is not None else None,
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
    retention: int | None = 0  # CacheConfig.prefix_cache_retention_interval (Setup.retention)
    # with a recurrent group: tokens per block hash (CacheConfig.prefix_match_unit), the
    # cache in vLLM's ``align`` mode; None: no recurrent group
    recurrent_hash: int | None = None


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
        self._chunk_bytes: dict[tuple[Shape, int, Layout], int] = {}
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
                cache_config=CacheConfig(
                    block_size=shape.block_size,
                    enable_prefix_caching=True,
                    **retention_kwargs(CacheConfig, shape.retention),
                    **recurrent_kwargs(shape),
                ),
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

    def kv_cache_config(
        self,
        gpu_blocks: int,
        block_size: int,
        layout: Layout = FULL_ATTENTION,
        retention: int | None = 0,
        shape: Shape | None = None,
    ):
        config = layout.kv_cache_config(gpu_blocks, block_size)
        if RETENTION in {f.name for f in dataclasses.fields(config)}:
            setattr(config, RETENTION, retention)  # as vLLM's planner copies it from the cache
        if shape is not None:
            resolved = self.block_sizes(config, shape)
            if resolved is not None:  # what vLLM's engine core resolves before the scheduler
                from vllm.v1.core.kv_cache_utils import resolve_cache_hit_alignment_tokens

                config.hash_block_size = resolved[1]
                config.cache_hit_alignment_tokens = resolve_cache_hit_alignment_tokens(
                    config, self.vllm(shape), *resolved
                )
        return config

    def block_sizes(self, kv_cache_config: Any, shape: Shape) -> tuple[int, int] | None:
        """The scheduler's block size and the block hash's, as vLLM's engine core resolves
        them for this KV-cache config (``None`` where the release does not)."""
        from vllm.v1.core import kv_cache_utils

        resolve = getattr(kv_cache_utils, "resolve_kv_cache_block_sizes", None)
        fields = {f.name for f in dataclasses.fields(kv_cache_config)}
        if resolve is None or "cache_hit_alignment_tokens" not in fields:
            return None
        scheduler, hashing = resolve(kv_cache_config, self.vllm(shape))
        return int(scheduler), int(hashing)

    def chunk_bytes(
        self, shape: Shape, blocks_per_chunk: int, layout: Layout = FULL_ATTENTION
    ) -> int:
        """What the connector's spec counts one CPU chunk as (aligned), asked of the spec."""
        if (shape, blocks_per_chunk, layout) not in self._chunk_bytes:
            from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
                build_offloading_config,
            )
            from vllm.v1.kv_offload.factory import OffloadingSpecFactory

            config = self.vllm(shape)
            extra = config.kv_transfer_config.kv_connector_extra_config
            extra.clear()
            extra.update(cpu_bytes_to_use=1 << 30, blocks_per_chunk=blocks_per_chunk)
            spec = OffloadingSpecFactory.create_spec(
                build_offloading_config(
                    config,
                    self.kv_cache_config(8, shape.block_size, layout, shape.retention, shape),
                )
            )
            size = getattr(spec, "kv_bytes_per_chunk", 0)
            if not size:
                raise RuntimeError(
                    f"{type(spec).__name__} does not say how many bytes a "
                    "chunk takes (no kv_bytes_per_chunk)"
                )
            self._chunk_bytes[(shape, blocks_per_chunk, layout)] = int(size)
        return self._chunk_bytes[(shape, blocks_per_chunk, layout)]

    @staticmethod
    def _scheduler_classes() -> dict[bool, Any]:
        """vLLM's scheduler classes, sync (False) and async (True: None where it has none)."""
        from vllm.v1.core.sched.scheduler import Scheduler

        async_cls: Any = None
        try:
            from vllm.v1.core.sched.async_scheduler import AsyncScheduler

            async_cls = AsyncScheduler
        except ImportError:
            pass
        return {False: Scheduler, True: async_cls}

    @staticmethod
    def _runner_output_fields() -> frozenset[str]:
        from vllm.v1.outputs import ModelRunnerOutput

        return frozenset(f.name for f in dataclasses.fields(ModelRunnerOutput))


RETENTION = "prefix_cache_retention_interval"


def retention_kwargs(cache_config_cls: Any, retention: int | None) -> dict[str, Any]:
    """``CacheConfig``'s retention argument, where the release has the field."""
    fields = getattr(cache_config_cls, "model_fields", None) or {
        f.name: f for f in dataclasses.fields(cache_config_cls)
    }
    return {RETENTION: retention} if RETENTION in fields else {}


def recurrent_kwargs(shape: Shape) -> dict[str, Any]:
    """``CacheConfig``'s arguments for a recurrent group's prefix caching (``align`` mode)."""
    if not shape.recurrent_hash:
        return {}
    return dict(
        mamba_cache_mode="align",
        prefix_match_unit=shape.recurrent_hash,
        mamba_block_size=shape.block_size,
    )


def retentions() -> tuple[int | None, ...]:
    """The retention intervals the machine draws: vLLM's default first (what a counterexample
    shrinks to), dense, and every 8 tokens (a multiple of every chunk the machine builds, as
    the connector requires of a sliding-window group), where the release has the setting."""
    from vllm.config import CacheConfig

    return (0, None, 8) if retention_kwargs(CacheConfig, 0) else (0,)


_CONFIGS: _Configs | None = None


def configs() -> _Configs:
    global _CONFIGS
    if _CONFIGS is None:
        _CONFIGS = _Configs()
    return _CONFIGS


def is_vllm_target(spec: str) -> bool:
    """``vllm``, ``vllm=MODULE:ATTR``, either of them ``foreign=``."""
    spec = spec.removeprefix("foreign=")
    return spec == "vllm" or spec.startswith("vllm=")


def tiered_lookups() -> bool:
    """Whether the release's manager lookups can answer ``RETRY`` and ``HIT_PENDING`` (a
    tiered manager's answers), so that a tiered manager can stand behind its connector."""
    for module in ("vllm.v1.kv_offload.base", "vllm.v1.kv_offload.abstract"):
        try:
            answers = importlib.import_module(module).LookupResult
        except (ImportError, AttributeError):
            continue
        return hasattr(answers, "RETRY") and hasattr(answers, "HIT_PENDING")
    return False
