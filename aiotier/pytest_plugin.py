"""pytest fixtures for code that uses aiotier, loaded through the ``pytest11`` entry point.

Installing aiotier registers this plugin; a test suite that runs its async tests with
pytest-asyncio gets:

``aiotier_engine``
    A small engine, already open, over a :class:`~aiotier.MemoryTier` and an
    :class:`~aiotier.SSDTier` in the test's ``tmp_path``; closed (and its tasks gone) after the
    test. Its metrics go to ``aiotier_metrics``. Override ``aiotier_engine_options`` to change
    its size or policy.
``aiotier_faulty_tier``
    A :class:`~aiotier.testing.FaultyTier` over a fresh :class:`~aiotier.MemoryTier`, seeded, not
    opened (an engine opens its tiers): inject faults, then hand it to your own engine.
``aiotier_metrics``
    A private ``MeterProvider`` with an in-memory reader and a
    :class:`~aiotier.testing.MetricsProbe` over it: ``aiotier_metrics.probe.count(...)``.

Every fixture name starts with ``aiotier_`` so none of them can shadow a fixture of yours.
Nothing here runs unless a test asks for one of the fixtures; without pytest-asyncio the async
fixture fails with a message that says what to install.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider

    from .engine import TieringEngine
    from .testing import FaultyTier, MetricsProbe

__all__ = [
    "AiotierMetrics",
    "aiotier_engine",
    "aiotier_engine_options",
    "aiotier_faulty_tier",
    "aiotier_metrics",
]

_NO_ASYNCIO = (
    "the aiotier_engine fixture is async and needs pytest-asyncio: "
    "pip install pytest-asyncio (and mark async tests, or set asyncio_mode = 'auto')"
)


class AiotierMetrics(NamedTuple):
    """The ``aiotier_metrics`` fixture: a private provider and a probe that reads it."""

    provider: MeterProvider
    probe: MetricsProbe


@pytest.fixture
def aiotier_engine_options() -> dict[str, Any]:
    """Sizes and keyword arguments of ``aiotier_engine``; override it to change them.

    Keys: ``num_blocks``, ``block_size``, ``memory_bytes``, ``ssd_bytes`` and any keyword
    argument of :class:`~aiotier.TieringEngine` (``write_policy``, ``promotion_timeout``, ...).
    """
    return {
        "num_blocks": 64,
        "block_size": 4096,
        "memory_bytes": 1 << 20,
        "ssd_bytes": 16 << 20,
        "promotion_timeout": 2.0,
    }


@pytest.fixture
def aiotier_metrics() -> Iterator[AiotierMetrics]:
    """A ``MeterProvider`` with an ``InMemoryMetricReader``, and a ``MetricsProbe`` over it."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from .testing import MetricsProbe

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        yield AiotierMetrics(provider, MetricsProbe(reader))
    finally:
        provider.shutdown()


@pytest.fixture
def aiotier_faulty_tier() -> FaultyTier:
    """A ``FaultyTier`` (seed 0) over a 1 MiB ``MemoryTier`` named ``"faulty"``, not opened."""
    from .testing import FaultyTier
    from .tiers.memory import MemoryTier

    return FaultyTier(MemoryTier(1 << 20), seed=0, name="faulty")


def _build_engine(
    options: dict[str, Any], directory: Path, metrics: AiotierMetrics
) -> TieringEngine:
    from .engine import TieringEngine
    from .tiers.memory import MemoryTier
    from .tiers.primary import PrimaryTier
    from .tiers.ssd import SSDTier

    opts = dict(options)
    num_blocks = opts.pop("num_blocks", 64)
    block_size = opts.pop("block_size", 4096)
    memory_bytes = opts.pop("memory_bytes", 1 << 20)
    ssd_bytes = opts.pop("ssd_bytes", 16 << 20)
    opts.setdefault("meter_provider", metrics.provider)
    tiers = [MemoryTier(memory_bytes), SSDTier(directory, ssd_bytes, io_threads=1)]
    return TieringEngine(PrimaryTier(num_blocks, block_size), tiers, **opts)


async def _engine(
    aiotier_engine_options: dict[str, Any],
    aiotier_metrics: AiotierMetrics,
    tmp_path: Path,
) -> AsyncIterator[TieringEngine]:
    """An open engine: a primary arena over a ``MemoryTier`` and an ``SSDTier`` in ``tmp_path``.

    Defaults: 64 blocks of 4 KiB, 1 MiB of memory, 16 MiB of SSD under
    ``tmp_path / "aiotier-ssd"``, ``promotion_timeout=2.0``, metrics to ``aiotier_metrics``.
    """
    engine = _build_engine(aiotier_engine_options, tmp_path / "aiotier-ssd", aiotier_metrics)
    await engine.open()
    try:
        yield engine
    finally:
        await engine.aclose()


def _needs_pytest_asyncio() -> None:
    """The engine fixture is async; without pytest-asyncio it says what to install."""
    pytest.fail(_NO_ASYNCIO, pytrace=False)


aiotier_engine: Any
try:
    import pytest_asyncio
except ImportError:  # pragma: no cover - exercised only without pytest-asyncio
    aiotier_engine = pytest.fixture(_needs_pytest_asyncio, name="aiotier_engine")
else:
    aiotier_engine = pytest_asyncio.fixture(_engine, name="aiotier_engine")
