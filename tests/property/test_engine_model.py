"""Stateful property test: the engine against a plain dict, over a tiny primary and a slow tier.

Invariants after every step: capacity never exceeded, no pin count below zero, ``get`` returns
exactly the model's bytes (or None, only with ``write_policy="none"`` or a tier below whose
admission policy may keep a block out), and at teardown every pin is released and no task
survives ``aclose``. Each run draws the write policy, the eviction policy and admission (TinyLFU
on the primary, AdmitAfter(2) below, both or neither).
"""

from __future__ import annotations

import asyncio
import os

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from aiotier import (
    AdmissionPolicy,
    AdmitAfter,
    AdmitTinyLFU,
    LookupResult,
    MemoryTier,
    PrimaryTier,
    RequestContext,
    TieringEngine,
)
from aiotier.testing import FaultyTier

BLOCK = 16
KEYS = st.sampled_from([f"k{i}" for i in range(8)])
VALUES = st.binary(min_size=0, max_size=BLOCK)
REQS = st.sampled_from([RequestContext("a"), RequestContext("b"), None])


class EngineModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.model: dict[bytes, bytes] = {}
        self.loaded: list[tuple[list[str], RequestContext | None]] = []
        self.engine: TieringEngine | None = None
        self.policy = "write_back"
        self.lossy = False

    def run(self, coro):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coro)

    @initialize(policy=st.sampled_from(["write_back", "write_back", "write_through", "none"]),
                evict=st.sampled_from(["lru", "arc", "lfuda"]),
                admit=st.sampled_from(["all", "primary", "below", "both"]))  # fmt: skip
    def start(self, policy: str, evict: str, admit: str) -> None:
        self.policy = policy
        # a tier below that admits only some blocks drops the others, like write policy "none"
        self.lossy = policy == "none" or admit in ("below", "both")
        admission: dict[str, AdmissionPolicy] = {}
        if admit in ("primary", "both"):
            admission["primary"] = AdmitTinyLFU()
        if admit in ("below", "both"):
            admission["memory"] = AdmitAfter(2)
        tier = FaultyTier(MemoryTier(1 << 20), seed=1).delay("read", 0.001).delay("write", 0.001)
        self.engine = TieringEngine(
            PrimaryTier(3, BLOCK, policy=evict), [tier], write_policy=policy,  # type: ignore[arg-type]
            promotion_timeout=2.0, admission=admission,
        )
        self.run(self.engine.open())

    @property
    def e(self) -> TieringEngine:
        assert self.engine is not None
        return self.engine

    @rule(key=KEYS, value=VALUES)
    def put(self, key: str, value: bytes) -> None:
        if self.run(self.e.put(key, value)):
            self.model[key.encode()] = value

    @rule(key=KEYS, req=REQS)
    def get(self, key: str, req: RequestContext | None) -> None:
        got = self.run(self.e.get(key, req))
        expected = self.model.get(key.encode())
        if got is None and self.lossy:
            self.model.pop(key.encode(), None)  # dropped by policy: it may not come back
            return
        assert got == expected, (key, got, expected)

    @rule(key=KEYS)
    def delete(self, key: str) -> None:
        self.run(self.e.delete(key))
        self.model.pop(key.encode(), None)

    @rule(keys=st.lists(KEYS, max_size=4), req=REQS)
    def lookup_and_load(self, keys: list[str], req: RequestContext | None) -> None:
        n = self.run(self.e.lookup_prefix(keys, req))
        if n is None:
            self.run(self.e.wait(keys))
            return
        hits = keys[:n]
        for k in hits:
            assert k.encode() in self.model or self.lossy
        if hits:
            spec = self.e.prepare_load(hits, req)
            for k, buf in zip(hits, spec.buffers, strict=True):
                assert bytes(buf) == self.model[k.encode()]
            self.loaded.append((hits, req))

    @rule()
    def complete_load(self) -> None:
        # no precondition: whether anything is loaded depends on timing, and hypothesis needs
        # the rule choice to be replayable
        if not self.loaded:
            return
        keys, req = self.loaded.pop(0)
        self.e.complete_load(keys, req)

    @rule(keys=st.lists(KEYS, min_size=1, max_size=3, unique=True), value=VALUES,
          success=st.booleans(), req=REQS)  # fmt: skip
    def store(self, keys: list[str], value: bytes, success: bool, req: RequestContext | None
              ) -> None:  # fmt: skip
        out = self.e.prepare_store(keys, req)
        if out is None:
            return
        for buf in out.store_spec.buffers:
            buf[: len(value)] = value
        stored = list(out.keys_to_store)
        self.e.complete_store(stored, req, success=success, sizes=[len(value)] * len(stored))
        if success:
            for k in stored:
                self.model[k] = value

    @rule(finish=st.booleans())
    def end_step(self, finish: bool) -> None:
        finished = ["a", "b"] if finish else []
        if finish:
            for keys, req in list(self.loaded):
                if req is not None:
                    self.loaded.remove((keys, req))
        self.e.end_step(new_req_ids=["a"], finished_req_ids=finished)

    @invariant()
    def capacity_and_pins_hold(self) -> None:
        if self.engine is None:
            return
        table = self.e.core.table
        assert len(table.index) <= self.e.primary.num_blocks
        assert min(table.pins) >= 0
        for k, slot in table.index.items():
            assert table.keys[slot] == k

    def teardown(self) -> None:
        if self.engine is not None:
            for keys, req in self.loaded:
                self.e.complete_load(keys, req)
            self.e.end_step(finished_req_ids=["a", "b"])
            self.e.end_step()
            assert self.e.stats().pinned_blocks == 0
            assert len(self.e.core.pins.share) == 0  # every promoted block was given back
            # everything put is still readable (write_back keeps every block somewhere)
            if not self.lossy:
                for k, v in self.model.items():
                    assert self.run(self.e.get(k)) == v
                    assert self.run(self.e.lookup(k)) in (LookupResult.HIT, LookupResult.RETRY)
            self.run(self.e.aclose())
        pending = asyncio.all_tasks(self.loop)
        assert not pending, pending
        self.loop.close()


EngineModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("AIOTIER_TEST_MODEL_EXAMPLES", "80")),
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestEngineModel = EngineModel.TestCase
