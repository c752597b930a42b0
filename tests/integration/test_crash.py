"""SIGKILL a process that writes through an SSDTier, many times; every restart finds clean data.

A child process opens an ``SSDTier`` on a real temporary directory and writes batches of
blocks with ``write_many`` (several writes in flight at once), rewriting keys with new versions
as it goes. It prints ``batch FIRST LAST`` before each batch and ``done OP`` after each write
the tier reported complete, flushed. The parent kills it with SIGKILL at a random moment (a
random number of completed writes, then a random extra delay; sometimes while it is still
opening), then reopens the directory itself (a header scan: a killed process leaves no
checkpoint) and checks every key:

- each block present is complete and correct: its bytes are exactly the payload of a version
  the child attempted (payloads derive from key and version, so any mix-up shows); a write the
  kill cut short after its header fails its checksum on that read and counts as absent;
- with ``fsync=True`` every write the child reported complete is there (that version or a later
  attempted one); with ``fsync=False`` losses are allowed by the contract, counted, and reported;
- the restart was a header scan (``after == "crash"``), the tier's usage is within its
  capacity, and the slot files kept their reserved size.

The capacity holds every key (no eviction), so a missing block is a lost write. The default
run kills ``AIOTIER_TEST_CRASH_KILLS`` (10) times per variant; the ``slow`` variant (``--run-slow``)
kills 200 times with ``fsync=True``.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import read_one

from aiotier import SSDTier
from aiotier.errors import BlockCorruptedError

KILLS = int(os.environ.get("AIOTIER_TEST_CRASH_KILLS", "10"))
SLOW_KILLS = 200
KEYS = 300  # op i writes key i % KEYS, version i // KEYS
WINDOW = 8  # writes in flight per batch
MAX_BLOCK = 8192
CAPACITY = 16 << 20  # 1300 slots: holds every key and its rewrites, so no eviction
REPO = Path(__file__).resolve().parents[2]

PAYLOAD_SRC = textwrap.dedent(
    """
    import hashlib

    def payload(key: bytes, version: int) -> bytes:
        seed = hashlib.blake2b(key + version.to_bytes(4, "little"), digest_size=32).digest()
        n = 1 + int.from_bytes(seed[:2], "little") % 8192
        return (seed * (n // 32 + 1))[:n]
    """
)
_ns: dict[str, object] = {}
exec(PAYLOAD_SRC, _ns)
payload = _ns["payload"]

CHILD = PAYLOAD_SRC + textwrap.dedent(
    """
    import asyncio, sys
    from aiotier import SSDTier

    async def main() -> None:
        path, fsync, start = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
        keys, window, capacity = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
        tier = SSDTier(path, capacity, fsync=fsync, io_threads=2, block_size=8192)
        await tier.open()
        out = sys.stdout
        out.write("open\\n")
        out.flush()
        op = start
        while True:
            ops = list(range(op, op + window))
            items = [(b"key-%d" % (i % keys), payload(b"key-%d" % (i % keys), i // keys))
                     for i in ops]
            out.write(f"batch {ops[0]} {ops[-1]}\\n")
            out.flush()
            errors = await tier.write_many(items)
            for i, err in zip(ops, errors):
                out.write(f"done {i}\\n" if err is None else f"fail {i} {err!r}\\n")
            out.flush()
            op += window

    asyncio.run(main())
    """
)


class Ledger:
    """What the children attempted and reported, across every run on one directory."""

    def __init__(self) -> None:
        self.attempted_max = -1  # ops 0..attempted_max may have been written
        self.reported: dict[bytes, int] = {}  # key -> highest version reported complete
        self.lost_unsynced = 0
        self.blocks_checked = 0
        self.present = 0
        self.repaired = 0  # torn slots and duplicate copies open() cleared
        self.torn_on_read = 0  # writes cut short after their header: found by the first read

    def allowed_versions(self, key_index: int) -> range:
        if self.attempted_max < key_index:
            return range(0)
        return range((self.attempted_max - key_index) // KEYS + 1)


async def _run_and_kill(
    directory: Path, fsync: bool, ledger: Ledger, rng: random.Random
) -> tuple[int, bool]:
    """Start a child, let it complete a random number of writes, SIGKILL it; return how many
    writes it reported and whether it finished opening the tier."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, str(directory), "1" if fsync else "0",
        str(ledger.attempted_max + 1), str(KEYS), str(WINDOW), str(CAPACITY),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    # a random moment: sometimes while opening, mostly after some completed writes
    target = 0 if rng.random() < 0.15 else rng.randint(1, 400)
    extra = rng.uniform(0, 0.02)
    done_this_run = 0
    opened = False
    deadline = time.monotonic() + 60

    def account(line: bytes) -> None:
        nonlocal done_this_run, opened
        word, *rest = line.decode().split()
        if word == "open":
            opened = True
        elif word == "batch":
            ledger.attempted_max = max(ledger.attempted_max, int(rest[1]))
        elif word == "done":
            op = int(rest[0])
            key = b"key-%d" % (op % KEYS)
            ledger.reported[key] = max(ledger.reported.get(key, -1), op // KEYS)
            done_this_run += 1
        elif word == "fail":
            pytest.fail(f"the child's write failed: {line!r}")

    try:
        if target == 0:
            await asyncio.sleep(rng.uniform(0.0, 0.6))  # python start-up and open() take ~0.5 s
        else:
            while done_this_run < target:
                line = await asyncio.wait_for(proc.stdout.readline(), deadline - time.monotonic())
                if not line:
                    _, err = await proc.communicate()
                    pytest.fail(f"the child exited early ({proc.returncode}): {err.decode()}")
                account(line)
            await asyncio.sleep(extra)
    finally:
        if proc.returncode is None:
            os.kill(proc.pid, signal.SIGKILL)  # our own child, by its pid
        rest, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, err.decode()[-2000:])
    for line in rest.splitlines():  # what it printed before dying (the pipe kept it)
        account(line)
    return done_this_run, opened


async def _verify(directory: Path, fsync: bool, ledger: Ledger, opened: bool) -> None:
    """Reopen the directory: every block complete and correct or absent; fsync: none lost.
    A child that finished opening consumed the checkpoint: the restart is a header scan."""
    tier = SSDTier(directory, CAPACITY, fsync=fsync, io_threads=2, block_size=MAX_BLOCK)
    await tier.open()
    start = tier.last_start
    assert start is not None
    if opened:
        assert start.after == "crash", start  # a killed process leaves no checkpoint
    ledger.repaired += start.torn + start.duplicates
    try:
        buf = bytearray(MAX_BLOCK)
        view = memoryview(buf)
        present = 0
        for i in range(KEYS):
            key = b"key-%d" % i
            allowed = ledger.allowed_versions(i)
            reported = ledger.reported.get(key, -1)
            ledger.blocks_checked += 1
            try:
                n = await read_one(tier, key, view)
            except BlockCorruptedError:
                # a write the kill cut short after its header (written first): the read finds
                # it, the tier drops it. Only a write of this key that was started can be torn
                assert len(allowed), f"{key!r}: corrupt, but no write of it was ever started"
                ledger.torn_on_read += 1
                n = -1
            if n < 0:
                if reported >= 0:
                    assert not fsync, f"fsync=True: {key!r} v{reported} was reported, now absent"
                    ledger.lost_unsynced += 1
                continue
            present += 1
            data = bytes(buf[:n])
            versions = [v for v in allowed if payload(key, v) == data]  # type: ignore[operator]
            assert versions, f"{key!r}: {n} bytes that no attempted version wrote"
            if fsync:
                assert versions[-1] >= reported, (
                    f"fsync=True: {key!r} holds v{versions[-1]}, v{reported} was reported"
                )
            elif versions[-1] < reported:
                ledger.lost_unsynced += 1
        usage = tier.usage()
        assert usage.blocks == present, (usage, present)
        assert usage.bytes_used <= CAPACITY
        ledger.present = present
    finally:
        await tier.aclose()
    sizes = await asyncio.to_thread(lambda: [p.stat().st_size for p in directory.glob("slots-*")])
    assert sum(sizes) == usage.capacity_bytes, "the slot files lost their reserved size"


async def _kill_many(directory: Path, fsync: bool, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    ledger = Ledger()
    t0 = time.monotonic()
    completed = 0
    for _ in range(kills):
        done, opened = await _run_and_kill(directory, fsync, ledger, rng)
        completed += done
        await _verify(directory, fsync, ledger, opened)
    print(
        f"\ncrash test fsync={fsync}: {kills} SIGKILLs survived, {completed} writes reported "
        f"complete, {ledger.attempted_max + 1} attempted, {ledger.blocks_checked} block checks, "
        f"{ledger.present} blocks present at the end, {ledger.repaired} torn slots/duplicate "
        f"copies cleared at restart, {ledger.torn_on_read} torn slots found by a read, "
        f"lost (reported, then absent or older): "
        f"{ledger.lost_unsynced}, {time.monotonic() - t0:.1f}s"
    )
    if fsync:
        assert ledger.lost_unsynced == 0


@pytest.mark.parametrize("fsync", [False, True], ids=["fsync-off", "fsync-on"])
async def test_sigkill_at_random_moments_never_leaves_wrong_bytes(
    tmp_path: Path, fsync: bool
) -> None:
    await _kill_many(tmp_path / "ssd", fsync, KILLS, 1234 + fsync)


@pytest.mark.slow
async def test_sigkill_many_times_with_fsync_keeps_every_acknowledged_block(
    tmp_path: Path,
) -> None:
    await _kill_many(tmp_path / "ssd", True, SLOW_KILLS, 99)
