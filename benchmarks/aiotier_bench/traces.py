"""Request traces for the replay bench: the JSONL shape of Mooncake's FAST'25 release, read and
checked, and where the traces shipped with the repository live.

One line is one request: ``timestamp`` (ms), ``output_length`` (tokens), ``hash_ids`` (one id per
prompt block; requests that share a prefix share its leading ids) and optionally
``input_length``. Ids are ints or strings; each becomes a block key shaped like vLLM's
``OffloadKey`` (8 bytes of id, or the string's UTF-8, then a 4-byte KV-cache group index 0), so
aiotier and vLLM's managers are handed the same keys.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "SHIPPED_DIR",
    "Trace",
    "TraceError",
    "TraceRequest",
    "block_key",
    "load_trace",
    "shipped_traces",
]

#: Where the traces that come with the repository live, relative to its root.
SHIPPED_DIR = Path("benchmarks") / "traces" / "mooncake"
_GROUP = (0).to_bytes(4, "big")


class TraceError(ValueError):
    """A trace file that is not of the documented shape (names the file and line)."""


def block_key(block_id: int | str) -> bytes:
    """The key of a trace block: its id as 8 big-endian bytes (or UTF-8), then group 0."""
    if isinstance(block_id, str):
        return block_id.encode() + _GROUP
    return block_id.to_bytes(8, "big") + _GROUP


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace: when it arrives, how many tokens it generates, its blocks."""

    arrival_ms: float
    output_length: int
    blocks: tuple[int | str, ...]


@dataclass(frozen=True, slots=True)
class Trace:
    """A trace's requests in arrival order (stable for equal timestamps)."""

    name: str
    requests: tuple[TraceRequest, ...]

    def window(self, n: int | None) -> Trace:
        """The first ``n`` requests (all of them for None)."""
        return self if n is None or n >= len(self.requests) else Trace(self.name, self.requests[:n])

    def references(self) -> Iterator[int | str]:
        """Every block reference, request after request, in prompt order."""
        for r in self.requests:
            yield from r.blocks

    @property
    def reference_count(self) -> int:
        return sum(len(r.blocks) for r in self.requests)

    @property
    def unique_blocks(self) -> int:
        return len(set(self.references()))


def _check_request(raw: object, where: str) -> TraceRequest:
    if not isinstance(raw, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    missing = [f for f in ("timestamp", "output_length", "hash_ids") if f not in raw]
    if missing:
        raise TraceError(f"{where}: missing field(s) {', '.join(missing)}")
    ts, out, ids = raw["timestamp"], raw["output_length"], raw["hash_ids"]
    if isinstance(ts, bool) or not isinstance(ts, int | float) or ts < 0:
        raise TraceError(f"{where}: timestamp must be a number >= 0 (ms), got {ts!r}")
    if isinstance(out, bool) or not isinstance(out, int) or out < 0:
        raise TraceError(f"{where}: output_length must be an int >= 0, got {out!r}")
    if not isinstance(ids, list) or not ids:
        raise TraceError(f"{where}: hash_ids must be a non-empty list, got {ids!r}")
    for h in ids:
        if isinstance(h, bool) or not (
            (isinstance(h, int) and 0 <= h < 1 << 64) or (isinstance(h, str) and h)
        ):
            raise TraceError(
                f"{where}: each hash id must be an int in 0..2**64-1 or a non-empty string, "
                f"got {h!r}"
            )
    if len(set(ids)) != len(ids):
        raise TraceError(f"{where}: hash_ids repeats an id within one request")
    return TraceRequest(float(ts), out, tuple(ids))


def load_trace(path: str | os.PathLike[str], limit: int | None = None) -> Trace:
    """Read a JSONL trace (its first ``limit`` requests by arrival), checking every line."""
    p = Path(path)
    requests: list[TraceRequest] = []
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{p}:{lineno}"
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{where}: not JSON ({exc.msg})") from None
            requests.append(_check_request(raw, where))
    if not requests:
        raise TraceError(f"{p}: no requests")
    requests.sort(key=lambda r: r.arrival_ms)  # stable: equal timestamps keep file order
    return Trace(p.stem, tuple(requests)).window(limit)


def _candidate_roots() -> Sequence[Path]:
    here = Path(__file__).resolve().parent
    return (*here.parents, Path.cwd())


def shipped_traces() -> list[Path]:
    """The JSONL traces under ``benchmarks/traces/mooncake`` of the checkout this code runs from
    (found from this module's folder upwards, then the working directory); empty when the
    package was installed without its repository."""
    for root in _candidate_roots():
        folder = root / SHIPPED_DIR
        if folder.is_dir():
            return sorted(folder.glob("*.jsonl"))
    return []
