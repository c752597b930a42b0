"""The SSD tier's hop runner: ops that chain (writes) queued while every thread is busy wait in
the thread pool itself, so a thread that ends a hop goes on to the next without the event loop;
other ops (reads) wait for the loop to hand them over."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from helpers import eventually

from aiotier.tiers._ssd.hops import DiskOp, HopRunner
from aiotier.tiers._ssd.syscalls import NowaitProbe


class HeldOp(DiskOp):
    """An op that says when a thread started it, and waits for ``gate`` if given."""

    def __init__(self, *, chains: bool, gate: threading.Event | None = None) -> None:
        DiskOp.__init__(self, 0)
        self.chains = chains
        self.gate = gate
        self.on_thread = threading.Event()

    def start(self, nowait: NowaitProbe) -> Any:
        self.on_thread.set()
        if self.gate is not None and not self.gate.wait(10):
            raise TimeoutError("gate never opened")
        return "done"


@pytest.mark.parametrize("chains", [True, False])
async def test_a_queued_op_reaches_a_freed_thread_while_the_loop_is_busy_only_if_it_chains(
    chains: bool,
) -> None:
    runner = HopRunner(1, "hops")
    gate = threading.Event()
    first = HeldOp(chains=chains, gate=gate)
    second = HeldOp(chains=chains)
    try:
        one = asyncio.ensure_future(runner.submit_group([first], withdrawable=False))
        await eventually(first.on_thread.is_set)
        two = asyncio.ensure_future(runner.submit_group([second], withdrawable=False))
        await asyncio.sleep(0)  # the second op is queued: every thread is busy
        assert not second.on_thread.is_set()
        # The loop is held here, on its own thread, from now until the wait below ends: only an
        # op already in the pool's queue can start when the first one ends.
        gate.set()
        assert second.on_thread.wait(0.5 if not chains else 10) is chains
        assert await one == ["done"]
        assert await two == ["done"]
        assert second.on_thread.is_set()
    finally:
        gate.set()
        await runner.drain()
        runner.shutdown()
