"""vLLM's own KV offloading managers as :class:`~.trace_replay.ReplayBackend`\\ s: the peer of the
trace replay, driven call for call as vLLM's offloading connector drives them (vLLM 0.32's
``OffloadingConnectorScheduler``: ``on_new_request``, a ``lookup`` per key up to the first miss
where ``HIT_PENDING`` and ``RETRY`` defer the request, ``prepare_load`` of the hits,
``prepare_store`` of the rest, ``complete_load``/``complete_store`` when the transfers finish,
``on_request_finished``, ``on_schedule_end`` once per step, ``take_events``).

Built only where vLLM imports (:func:`vllm_unavailable` says why not otherwise); nothing here
makes up a figure for a manager that did not run.

The same driver replays aiotier as a vLLM user runs it (:func:`adapter_replay`):
:class:`~aiotier.integrations.vllm.AiotierOffloadingManager` over a
:class:`~aiotier.BlockingEngine`, answering with vLLM's types where vLLM imports and with the
adapter's stand-ins elsewhere. Its calls run, as in vLLM's scheduler, in a thread with no event
loop.
"""

from __future__ import annotations

import importlib
import itertools
import os
import warnings
from collections.abc import Coroutine, Sequence
from types import ModuleType
from typing import Any, TypeVar

from aiotier import AdmissionPolicy, PrimaryTier, SecondaryTier
from aiotier.integrations.vllm import AiotierOffloadingManager, VllmTypes
from aiotier.integrations.vllm import types as stand_ins

from .trace_replay import Admitted, ReplayResult, replay
from .traces import Trace

__all__ = [
    "AdapterBackend",
    "VllmBackend",
    "adapter_replay",
    "adapter_types",
    "tiering_manager",
    "vllm_manager",
    "vllm_unavailable",
    "vllm_version",
]

_T = TypeVar("_T")

_regions = itertools.count()
_MODULES = (
    "vllm.v1.kv_offload.base",
    "vllm.v1.kv_offload.cpu.manager",
    "vllm.v1.kv_offload.cpu.shared_offload_region",
    "vllm.v1.kv_offload.tiering.example.manager",
    "vllm.v1.kv_offload.tiering.manager",
)


def _vllm(module: str, name: str) -> Any:
    """``name`` from vLLM's ``module`` (imported by name: vLLM is optional, and untyped here)."""
    return getattr(importlib.import_module(module), name)


def vllm_unavailable() -> str | None:
    """None when vLLM's offloading managers import here, else the reason they do not."""
    try:
        with warnings.catch_warnings():  # vLLM's own imports warn (torch deprecations)
            warnings.simplefilter("ignore")
            for module in _MODULES:
                importlib.import_module(module)
    except Exception as exc:  # any failure to import is a reason to skip, named as it is
        return f"vLLM is not importable here ({type(exc).__name__}: {exc})"
    return None


def vllm_version() -> str:
    return str(getattr(importlib.import_module("vllm"), "__version__", "unknown"))


def vllm_manager(capacity: int, policy: str) -> Any:
    """vLLM's ``CPUOffloadingManager`` of ``capacity`` chunks with its ``lru`` or ``arc``
    policy."""
    manager = _vllm("vllm.v1.kv_offload.cpu.manager", "CPUOffloadingManager")
    return manager(num_chunks=capacity, cache_policy=policy)


def tiering_manager(capacity: int, policy: str = "lru") -> Any:
    """vLLM's ``TieringOffloadingManager``: a CPU primary of ``capacity`` chunks (one page of
    shared memory each) over vLLM's in-memory example secondary tier, which keeps every chunk
    it is given and completes each transfer at once. Its ``shutdown()`` removes the shared
    memory file; both open and close files (call them off the event loop)."""
    tiering = "vllm.v1.kv_offload.tiering.manager"
    page = os.sysconf("SC_PAGE_SIZE")
    region = _vllm("vllm.v1.kv_offload.cpu.shared_offload_region", "SharedOffloadRegion")(
        engine_id=f"aiotier-bench-{os.getpid()}-{next(_regions)}",
        num_chunks=capacity,
        rank=None,
        kv_bytes_per_chunk=page,
        cpu_page_size=page,
    )
    primary = _vllm(tiering, "CPUPrimaryTierOffloadingManager")(
        capacity, region, cache_policy=policy
    )
    secondary = _vllm("vllm.v1.kv_offload.tiering.example.manager", "ExampleSecondaryTierManager")(
        offloading_spec=None,  # the example tier only keeps it
        primary_kv_view=primary.get_kv_memoryview(),
        tier_type="example",
    )
    return _vllm(tiering, "TieringOffloadingManager")(primary, [secondary])


def adapter_types() -> tuple[ModuleType, VllmTypes, str]:
    """What the adapter's replay speaks: the module of the connector's types (``ReqContext``,
    ``LookupResult``, ``ScheduleEndContext``), the adapter's :class:`VllmTypes` from it, and a
    label. vLLM's where it imports, else the adapter's stand-ins."""
    if vllm_unavailable() is None:
        base = importlib.import_module("vllm.v1.kv_offload.base")
        return base, VllmTypes.from_module(base), f"vLLM {vllm_version()}'s types"
    return stand_ins, VllmTypes(), "the adapter's stand-in types (vLLM is not importable)"


class VllmBackend:
    """Drives an ``OffloadingManager`` with the types of ``base`` (default: vLLM's
    ``vllm.v1.kv_offload.base``)."""

    def __init__(self, manager: Any, base: ModuleType | None = None) -> None:
        if base is None:
            base = importlib.import_module("vllm.v1.kv_offload.base")
        self.manager = manager
        self._result = base.LookupResult
        self._req_context = base.ReqContext
        self._end = base.ScheduleEndContext
        self._ctx: dict[str, Any] = {}

    def _req(self, req_id: str) -> Any:
        ctx = self._ctx.get(req_id)
        if ctx is None:
            ctx = self._ctx[req_id] = self._req_context(req_id=req_id)
            self.manager.on_new_request(ctx)
        return ctx

    async def lookup(self, req_id: str, keys: list[bytes]) -> int | None:
        ctx = self._req(req_id)
        lookup, r = self.manager.lookup, self._result
        hits, defer = 0, False
        for k in keys:  # OffloadingConnectorScheduler._maximal_prefix_lookup
            res = lookup(k, ctx)
            if res is r.HIT:
                hits += 1
            elif res is r.HIT_PENDING:
                hits += 1
                defer = True
            elif res is r.RETRY:
                defer = True
            else:
                break
        return None if defer else hits

    def admit(self, req_id: str, keys: list[bytes], hits: int) -> Admitted:
        m, ctx = self.manager, self._req(req_id)
        loads = keys[:hits]
        if loads:
            for k in loads:  # the connector asks each loaded key's source (its hit metrics)
                m.get_load_source(k, ctx)
            m.prepare_load(loads, ctx)
        stores: list[bytes] = []
        failed = False
        if hits < len(keys):
            out = m.prepare_store(keys[hits:], ctx)
            if out is None:
                failed = True
            else:
                stores = list(out.keys_to_store)
        return Admitted(req_id, loads, stores, failed)

    def complete(self, admitted: Admitted) -> None:
        ctx = self._req(admitted.req_id)
        if admitted.loads:
            self.manager.complete_load(admitted.loads, ctx)
        if admitted.stores:
            self.manager.complete_store(admitted.stores, ctx)

    def end_step(self, new_req_ids: list[str], finished_req_ids: list[str]) -> None:
        m = self.manager
        for rid in finished_req_ids:
            m.on_request_finished(self._ctx.pop(rid))
        m.on_schedule_end(self._end(new_req_ids=new_req_ids, preempted_req_ids=()))
        for _ in m.take_events():
            pass

    async def between_steps(self, waiting: list[list[bytes]]) -> None:
        """vLLM's example tier completes its transfers at once: nothing to wait for."""


class AdapterBackend(VllmBackend):
    """aiotier's vLLM adapter, driven as vLLM's managers are; between steps the promotions the
    deferred requests wait for land (a real step is long enough for a memory or local-disk
    read)."""

    manager: AiotierOffloadingManager

    def __init__(
        self, manager: AiotierOffloadingManager, base: ModuleType, *, settle_timeout: float = 10.0
    ) -> None:
        super().__init__(manager, base)
        self.settle_timeout = settle_timeout

    async def between_steps(self, waiting: list[list[bytes]]) -> None:
        keys = [k for ks in waiting for k in ks]
        if keys:  # from the replay's thread, which runs no loop (see adapter_replay)
            self.manager.engine.wait(keys, timeout=self.settle_timeout)


def adapter_replay(
    trace: Trace,
    primary: PrimaryTier,
    admission: AdmissionPolicy | None = None,
    below: Sequence[SecondaryTier] = (),
    *,
    count_calls: bool = False,
) -> ReplayResult:
    """Replay ``trace`` through a new adapter over ``primary`` (and ``below``), closed after.

    Call it from a thread that runs no event loop (``asyncio.to_thread`` from a coroutine):
    vLLM's scheduler calls the manager from plain threads, and the adapter's fast paths, like
    :class:`~aiotier.BlockingEngine`'s, are taken only there."""
    base, types, _ = adapter_types()
    kwargs: dict[str, Any] = {} if admission is None else {"admission": {"primary": admission}}
    manager = AiotierOffloadingManager.create(primary, below, types=types, **kwargs)
    try:
        return run_to_end(replay(trace, AdapterBackend(manager, base), count_calls=count_calls))
    finally:
        manager.shutdown()


def run_to_end(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine that never suspends (nothing it awaits waits for I/O) in this thread,
    with no event loop; a coroutine that suspends is closed and named."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError(f"{coro!r} suspended with no event loop to resume it")
