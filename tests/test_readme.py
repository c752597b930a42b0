"""The README's code runs as written (the scheduler step over a real engine, RETRY path too)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

from helpers import write_one

from aiotier import MemoryTier, PrimaryTier, TieringEngine

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)


def block_with(text: str) -> str:
    (block,) = [b for b in BLOCKS if text in b]
    return block


def test_every_python_block_compiles() -> None:
    assert len(BLOCKS) >= 3
    for block in BLOCKS:
        compile(block, "README.md", "exec")  # no top-level await, no syntax from elsewhere


def test_the_cache_example_runs() -> None:
    exec(block_with("engine.get("), {"__name__": "readme"})


def test_the_scheduler_step_loads_what_a_tier_promoted_and_stores_new_blocks() -> None:
    scope: dict[str, Any] = {}
    exec(block_with("async def step("), scope)

    async def run() -> None:
        tier = MemoryTier(1 << 20)
        async with TieringEngine(PrimaryTier(8, 4096), [tier]) as engine:
            await write_one(tier, b"a", b"A")
            await write_one(tier, b"b", b"B")  # below the primary: the lookup answers RETRY
            await scope["step"](engine, [b"a", b"b", b"absent"], [b"new"])
            assert await engine.get(b"new") == b"\x01" * 4096
            assert await engine.get(b"a") == b"A"

    asyncio.run(run())
