"""The suite runs on the loop it was asked for: the CI matrix's uvloop runs are real."""

from __future__ import annotations

import asyncio

import pytest


def _on_uvloop(loop: asyncio.AbstractEventLoop) -> bool:
    return type(loop).__module__.startswith("uvloop")


async def test_async_tests_run_on_the_selected_loop(pytestconfig: pytest.Config) -> None:
    wanted = pytestconfig.getoption("--loop")
    assert _on_uvloop(asyncio.get_running_loop()) == (wanted == "uvloop")


def test_loops_started_by_sync_tests_are_the_selected_kind(pytestconfig: pytest.Config) -> None:
    async def which() -> bool:
        return _on_uvloop(asyncio.get_running_loop())

    assert asyncio.run(which()) == (pytestconfig.getoption("--loop") == "uvloop")
