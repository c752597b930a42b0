"""Two write batches of a tier in flight at once: the second keeps the tier busy while the first
is held, and a key's writes and removes still land in the order they were queued."""

from __future__ import annotations

import asyncio
from pathlib import Path

from helpers import DictTier, block, eventually

from aiotier import PrimaryTier, SSDTier, TieringEngine


class GatedTier(DictTier):
    """A dict tier that logs each op and holds the writes of the keys in ``gates``."""

    def __init__(self) -> None:
        super().__init__("gated")
        self.log: list[tuple[str, bytes, bytes]] = []
        self.gates: dict[bytes, asyncio.Event] = {}

    async def write(self, key: bytes, data: bytes | memoryview) -> None:
        self.log.append(("start", key, bytes(data[:1])))
        gate = self.gates.get(key)
        if gate is not None:
            await gate.wait()
        await super().write(key, data)
        self.log.append(("write", key, bytes(data[:1])))

    async def remove(self, key: bytes) -> bool:
        self.log.append(("remove", key, b""))
        return await super().remove(key)

    def contains_hint(self, key: bytes) -> bool | None:
        return key in self.data  # exact, as an indexed tier's: a new key needs no remove

    def ops_of(self, key: bytes) -> list[tuple[str, bytes]]:
        return [(op, v) for op, k, v in self.log if k == key and op != "start"]


async def test_a_second_batch_is_written_beside_a_held_one_and_a_key_keeps_its_order() -> None:
    tier = GatedTier()
    gate = tier.gates[b"a"] = asyncio.Event()
    async with TieringEngine(PrimaryTier(1, 64), [tier], write_policy="write_back") as engine:
        assert await engine.put(b"a", block(1))
        assert await engine.put(b"b", block(2))  # evicts a: its write is held by the tier
        await eventually(lambda: ("start", b"a", b"\x01") in tier.log)
        assert await engine.put(b"a", block(3))  # evicts b; a's older copy must go
        assert await engine.put(b"c", block(4))  # evicts a's newer bytes
        # b goes down beside the held batch; nothing more of a starts before it ends
        await eventually(lambda: ("write", b"b", b"\x02") in tier.log)
        assert tier.ops_of(b"a") == []
        assert await engine.get(b"a") == block(3)  # served on its way down meanwhile
        del tier.gates[b"a"]
        gate.set()
        await engine.flush(timeout=5)
        assert tier.ops_of(b"a") == [("write", b"\x01"), ("remove", b""), ("write", b"\x03")]
        assert tier.data[b"a"] == block(3)
        assert await engine.get(b"a") == block(3)


async def test_an_ssd_tier_written_by_two_writers_holds_no_older_bytes_than_the_newest(
    tmp_path: Path,
) -> None:
    # 12 keys put over and over through a 2-block primary: each put evicts, each key is
    # demoted again and again, its removes and writes queued back to back in batches that
    # the two writers apply side by side (a step's puts hold some keys of the last step's).
    tier = SSDTier(tmp_path / "ssd", 1 << 20)
    newest: dict[bytes, bytes] = {}
    async with TieringEngine(PrimaryTier(2, 4096), [tier], write_policy="write_back") as engine:
        for i in range(400):
            k = b"k%d" % (i % 12)
            newest[k] = k + i.to_bytes(4, "big") * 100
            assert await engine.put(k, newest[k])
            if i % 7 == 0:
                await asyncio.sleep(0)  # a step: the writers take what queued
        await engine.flush(timeout=30)
        for k, v in newest.items():
            buf = bytearray(4096)
            (n,) = await tier.read_many_into([k], [memoryview(buf)])
            assert n == -1 or bytes(buf[: int(n)]) == v, k  # absent, or the newest bytes
            assert await engine.get(k) == v
