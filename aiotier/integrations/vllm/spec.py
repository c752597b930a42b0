"""``AiotierOffloadingSpec``: the offloading spec vLLM loads by name (needs vLLM installed).

Name it in vLLM's ``kv_transfer_config``::

    {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
     "kv_connector_extra_config": {
         "spec_module_path": "aiotier.integrations.vllm", "spec_name": "AiotierOffloadingSpec",
         "aiotier": {"primary": {"num_blocks": 1024},
                     "tiers": [{"type": "ssd", "path": "/var/cache/aiotier",
                                "capacity_bytes": 100000000000}]}}}

``"aiotier"`` is a mapping shaped like aiotier's config file (``engine``, ``primary``,
``tiers``; see :mod:`aiotier.config`) or the path of such a TOML file. The primary's
``block_size`` is one offloaded chunk of vLLM's KV cache: every worker's bytes of
``blocks_per_chunk`` GPU blocks, in every KV-cache tensor. The spec derives it from vLLM's
layout; a ``block_size`` given in the config must equal it. ``primary.num_blocks`` may be left
out when ``cpu_bytes_to_use`` (vLLM's own option) is given: the chunks that fit in it.

vLLM makes the spec twice: in its scheduler (``get_manager``) and in each worker process
(``get_worker``), and builds the workers first. The primary arena is a POSIX shared-memory
segment whose name both sides derive from vLLM's engine id (unique per engine and data-parallel
rank, the same in every process of one engine) and the arena's geometry; the scheduler creates
it in ``get_manager``, a worker maps it at its first transfer (no transfer is scheduled before
the manager exists). Nothing is written to disk to hand the name over. The scheduler's
``shutdown`` (the engine's close) removes the segment; if the scheduler process dies first, its
resource tracker removes it once the processes holding the tracker's pipe have exited.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any, cast

from vllm.v1.kv_offload import base as vllm_base

from aiotier.config import engine_parts, load_config
from aiotier.errors import ConfigError
from aiotier.integrations.vllm.manager import AiotierOffloadingManager, VllmTypes
from aiotier.integrations.vllm.stats import metric_definitions
from aiotier.integrations.vllm.worker import ArenaWorker
from aiotier.tiers.primary import PrimaryTier

__all__ = ["AiotierOffloadingSpec", "AiotierVllmManager", "arena_stem"]

def arena_stem(engine_id: str) -> str:
    """The shared-memory name of an engine's arena, before its geometry: a hash of vLLM's
    engine id, so any id gives a short, valid name."""
    return "aiotier-vllm-" + hashlib.sha256(engine_id.encode()).hexdigest()[:16]


class AiotierVllmManager(AiotierOffloadingManager, vllm_base.OffloadingManager):
    """vLLM's ``OffloadingManager`` ABC, every method supplied by the aiotier manager."""


def _aiotier_config(extra: Mapping[str, Any]) -> dict[str, Any]:
    raw = extra.get("aiotier")
    if raw is None:
        raise ConfigError(
            'kv_connector_extra_config["aiotier"] is required: aiotier\'s configuration (a '
            "mapping with primary, tiers and engine sections) or the path of a TOML file"
        )
    if isinstance(raw, str | os.PathLike):
        return load_config(raw)
    if not isinstance(raw, Mapping):
        raise ConfigError(
            f'kv_connector_extra_config["aiotier"]: expected a mapping or a TOML file\'s path, '
            f"got {type(raw).__name__}"
        )
    return dict(raw)


class AiotierOffloadingSpec(vllm_base.OffloadingSpec):
    """aiotier as vLLM's offloaded medium: the manager in the scheduler, an arena copier in
    each worker, the primary arena shared between them."""

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, Any]:
        """The metrics the manager's ``get_stats()`` reports (vLLM refuses a reported metric
        that its spec does not define)."""
        return metric_definitions(vllm_base)

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        if getattr(config, "canonical_layout", False):
            raise ConfigError(
                "aiotier stores each worker's KV pages as they are: the canonical_layout option "
                "of kv_connector_extra_config is not supported"
            )
        self.aiotier_config = _aiotier_config(self.extra_config)
        primary = self.aiotier_config.get("primary", {})
        if not isinstance(primary, Mapping):
            raise ConfigError(f"aiotier config: primary: expected a table, got {primary!r}")
        self._primary = dict(primary)
        per_block = int(config.worker_kv_bytes_per_block)
        world = int(config.parallel.world_size)
        #: one worker's bytes of one chunk; the chunk (a primary block) holds every worker's
        self.worker_chunk_bytes = per_block * self.blocks_per_chunk
        self.block_size = self.worker_chunk_bytes * world
        if self.block_size <= 0:
            raise ConfigError(
                "vLLM reports no KV bytes per block for this model and layout: aiotier cannot "
                "size its blocks"
            )
        given = self._primary.get("block_size")
        if given is not None and int(given) != self.block_size:
            raise ConfigError(
                f"aiotier config: primary.block_size is {given}, but one offloaded chunk of "
                f"this model is {self.block_size} bytes ({per_block} KV bytes per block and "
                f"worker x {self.blocks_per_chunk} blocks per chunk x {world} workers); set "
                f"{self.block_size} or leave it out"
            )
        self._primary["block_size"] = self.block_size
        if "num_blocks" not in self._primary:
            budget = self.extra_config.get("cpu_bytes_to_use")
            if not budget:
                raise ConfigError(
                    "aiotier config: primary.num_blocks is required (or cpu_bytes_to_use in "
                    "kv_connector_extra_config, which it is derived from)"
                )
            self._primary["num_blocks"] = int(budget) // self.block_size
            if self._primary["num_blocks"] <= 0:
                raise ConfigError(
                    f"cpu_bytes_to_use={budget} holds no offloaded chunk of {self.block_size} "
                    f"bytes"
                )
        try:
            self.num_blocks = int(self._primary["num_blocks"])
        except (TypeError, ValueError):
            raise ConfigError(
                f"aiotier config: primary.num_blocks: expected int, got "
                f"{self._primary['num_blocks']!r}"
            ) from None
        self.arena_stem = arena_stem(str(config.engine_id))
        self._manager: AiotierVllmManager | None = None
        self._worker: ArenaWorker | None = None

    def get_manager(self) -> AiotierVllmManager:
        """The scheduler's manager over an engine whose primary arena is the shared segment."""
        if self._manager is None:
            config = {**self.aiotier_config, "primary": self._primary}
            primary_args, tiers, engine_args = engine_parts(config)
            # the arena is always shared, under the name the workers derive
            primary_args.pop("shared_memory", None)
            primary_args["shared_memory_stem"] = self.arena_stem
            primary = PrimaryTier(**primary_args)
            try:
                manager = AiotierVllmManager.create(
                    primary,
                    tiers,
                    types=VllmTypes.from_module(vllm_base),
                    enable_events=self.kv_events_config.enable_kv_cache_events,
                    **engine_args,
                )
            except BaseException:
                primary.release_shared_memory()
                raise
            self._manager = cast(AiotierVllmManager, manager)
        return self._manager

    def get_worker(self, kv_caches: Any) -> ArenaWorker:
        """A worker copying between this process's KV tensors and its part of each chunk."""
        if self._worker is None:
            self._worker = ArenaWorker(
                kv_caches,
                arena_stem=self.arena_stem,
                num_blocks=self.num_blocks,
                block_size=self.block_size,
                blocks_per_chunk=self.blocks_per_chunk,
                offset=int(self.config.parallel.rank) * self.worker_chunk_bytes,
                chunk_bytes=self.worker_chunk_bytes,
            )
        return self._worker
