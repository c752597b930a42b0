"""aiotier's engine as a :class:`~.trace_replay.ReplayBackend`: the scheduler protocol, call for
call (``lookup_prefix``, ``prepare_load``/``touch``/``complete_load``, ``prepare_store``/
``complete_store``, ``end_step``, ``take_events``)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiotier import LookupResult, RequestContext, TieringEngine

from .trace_replay import Admitted

__all__ = ["EngineBackend"]


class EngineBackend:
    """Drives a :class:`~aiotier.TieringEngine`; between steps it lets promotions land."""

    def __init__(self, engine: TieringEngine, *, settle_timeout: float = 10.0) -> None:
        self.engine = engine
        self.settle_timeout = settle_timeout
        self._ctx: dict[str, RequestContext] = {}

    def _req(self, req_id: str) -> RequestContext:
        ctx = self._ctx.get(req_id)
        if ctx is None:
            ctx = self._ctx[req_id] = RequestContext(req_id)
        return ctx

    async def lookup(self, req_id: str, keys: list[bytes]) -> int | None:
        return await self.engine.lookup_prefix(keys, self._req(req_id))

    def admit(self, req_id: str, keys: list[bytes], hits: int) -> Admitted:
        engine, ctx = self.engine, self._req(req_id)
        loads = keys[:hits]
        if loads:
            engine.prepare_load(loads, ctx)
            engine.touch(loads)
        stores: tuple[bytes, ...] = ()
        failed = False
        if hits < len(keys):
            out = engine.prepare_store(keys[hits:], ctx)
            if out is None:
                failed = True
            else:
                stores = out.keys_to_store
        return Admitted(req_id, loads, stores, failed)

    def complete(self, admitted: Admitted) -> None:
        ctx = self._req(admitted.req_id)
        if admitted.loads:
            self.engine.complete_load(admitted.loads, ctx)
        if admitted.stores:
            self.engine.complete_store(admitted.stores, ctx)

    def end_step(self, new_req_ids: list[str], finished_req_ids: list[str]) -> None:
        self.engine.end_step(new_req_ids=new_req_ids, finished_req_ids=finished_req_ids)
        self.engine.take_events()
        for rid in finished_req_ids:
            del self._ctx[rid]

    async def between_steps(self, waiting: list[list[bytes]]) -> None:
        """Promotions for the deferred requests land (a real step is long enough for a memory
        or local-disk read); write-backs queued this step get a turn of the loop."""
        keys = [k for ks in waiting for k in ks]
        if keys:
            results = await self.engine.wait(keys, timeout=self.settle_timeout)
            assert all(r is not LookupResult.RETRY for r in results)
        await asyncio.sleep(0)

    def tier_counts(self) -> dict[str, Any]:
        """Per tier: blocks promoted from it, bytes read from and written to it."""
        counters = self.engine.stats().counters
        out: dict[str, Any] = {}
        for key, n in counters.items():
            if key[0] == "promotions" and key[2] == "ok":
                out.setdefault(key[1], {})["promoted_blocks"] = n
            elif key[0] in ("read_bytes", "write_bytes"):
                out.setdefault(key[1], {})[key[0]] = n
        return out
