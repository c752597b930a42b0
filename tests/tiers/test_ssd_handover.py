"""Handover: blocks the SSD tier evicted, on their way to the tier below."""

from __future__ import annotations

import asyncio

from aiotier.tiers._ssd.handover import Handover


async def test_a_read_waiting_for_a_key_that_leaves_again_wakes_with_the_later_bytes() -> None:
    handover = Handover()
    first = handover.leave(b"k")
    reader = asyncio.ensure_future(handover.wait(b"k"))
    await asyncio.sleep(0)
    second = handover.leave(b"k")  # evicted again before the first read of its slot arrived
    handover.arrived(b"k", first, b"old")  # superseded: ignored
    await asyncio.sleep(0)
    assert not reader.done() and handover.payload(b"k") is None
    handover.arrived(b"k", second, b"new")
    await asyncio.wait_for(reader, 5)
    assert handover.payload(b"k") == b"new"
    assert handover.take() == [(b"k", b"new")]


async def test_a_newer_write_wakes_the_reads_waiting_and_drops_the_bytes_in_transit() -> None:
    handover = Handover()
    token = handover.leave(b"k")
    reader = asyncio.ensure_future(handover.wait(b"k"))
    await asyncio.sleep(0)
    assert handover.supersede(b"k")
    await asyncio.wait_for(reader, 5)
    handover.arrived(b"k", token, b"old")  # its read ended after the write: ignored
    assert handover.payload(b"k") is None and handover.take() == []
    assert not handover
