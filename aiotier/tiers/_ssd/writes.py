"""A batch of writes (sans-IO): which writes of a ``write_many`` are carried out, spread over
slot-write ops as the index finds slots for them, and what each op's outcome does to the index.

The counterpart of :mod:`.reads`. Of several writes of one key only the last is carried out,
and the earlier ones report its outcome (``tiers/_batches.py``). Writes are planned in batch
order, as many as the index has slots for; the rest wait until disk work ends. The tier runs
the ops, holds the keys' turns and decides where evicted blocks go.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..._types import MAX_KEY_BYTES, normalize_key
from .._batches import LastWrites
from .handover import Handover
from .index import SSDIndex, WritePlan
from .ops import SlotWrites, byte_view

__all__ = ["WriteBatch", "writes_ended"]


class WriteBatch:
    """What ``write_many(items)`` asks of the disk.

    Building it keeps the last write of each key and checks those (a key too long, a block
    larger than ``block_size``: a ``ValueError`` for that write). :attr:`pending` holds the
    writes still to plan, in batch order; :meth:`outcomes` gives each item its answer once the
    ops are settled.
    """

    __slots__ = ("_last", "_out", "pending")

    def __init__(
        self,
        items: Sequence[tuple[bytes, bytes | memoryview]],
        block_size: int | None,
        tier_name: str,
    ) -> None:
        self._last = LastWrites([k if type(k) is bytes else _key_or_none(k) for k, _ in items])
        # per kept write (LastWrites.kept), its error or None
        self._out: list[Exception | None] = [None] * len(self._last.kept)
        #: ``(key, place, view)`` of the writes not planned yet (``place``: in ``_out``).
        self.pending: list[tuple[bytes, int, memoryview]] = []
        limit = block_size if block_size is not None else float("inf")
        for place, (k, d) in enumerate(self._last.pick(items)):
            if (  # what the engine hands down: inline, no call per block
                type(k) is bytes
                and len(k) <= MAX_KEY_BYTES
                and type(d) is memoryview
                and d.format == "B"
                and d.ndim == 1
                and d.nbytes <= limit
            ):
                self.pending.append((k, place, d))
                continue
            try:
                key, view = _checked(k, d, block_size, tier_name)
            except Exception as exc:
                self._out[place] = exc
                continue
            self.pending.append((key, place, view))

    def pending_keys(self) -> list[bytes]:
        """The keys of the writes not planned yet (one write each)."""
        return [key for key, _place, _view in self.pending]

    def plan(
        self,
        index: SSDIndex,
        ops: list[SlotWrites],
        locate: Callable[[int], tuple[int, int]],
        planned: Callable[[WritePlan], object | None],
    ) -> list[SlotWrites]:
        """Spread as many pending writes as the index has slots for over ``ops``, in batch
        order; the ops given writes (none: every slot is busy). ``locate(slot)`` is its file
        descriptor and offset; ``planned(plan)`` the tier's part of each plan, which returns
        the token of a victim handed over (its bytes are read first), else None."""
        pending, parts = self.pending, len(ops)
        n = 0
        for key, place, view in pending:
            plan = index.plan_write(key, view.nbytes)
            if plan is None:
                break
            victim, token, read = plan.victim, planned(plan), None
            if token is not None and victim is not None:  # handed over: its bytes read first
                read = (victim.key, victim.seq, victim.length)
            fd, off = locate(plan.slot)
            ops[n * parts // len(pending)].add(
                fd, off, key, plan.seq, view, read, (plan, token, place)
            )
            n += 1
        self.pending = pending[n:]
        return [op for op in ops if op.tags]

    def settle(self, ops: list[SlotWrites], results: list[list[Exception | None]]) -> None:
        """The ops' results (in the order :meth:`plan` returned the ops) in place."""
        out = self._out
        for op, res in zip(ops, results, strict=True):
            for (_plan, _token, place), r in zip(op.tags, res, strict=True):
                out[place] = r

    def outcomes(self) -> list[Exception | None]:
        """Per item of the batch, None (written) or its error: that of its key's last write."""
        return self._last.spread(self._out)


def writes_ended(
    op: SlotWrites, outcome: Any, index: SSDIndex, handover: Handover
) -> tuple[list[BaseException | None], list[int], list[bytes]]:
    """A write op's outcome, on the loop: each key moves to its new slot, or loses its copy
    where its write failed (no tier serves older bytes than a write it accepted), and victims'
    bytes arrive in the hand-over. Per block the error (or None), the slots to clear (replaced
    copies, failed writes' slots) and the keys whose older copy a failed write dropped."""
    n = len(op.tags)
    if isinstance(outcome, BaseException):
        handed: list[bytes | None] = [None] * n
        errors: list[BaseException | None] = [outcome] * n
    else:
        handed, errors = outcome[0], list(outcome[1])
    clear: list[int] = []
    dropped: list[bytes] = []
    for j, (plan, token, _place) in enumerate(op.tags):
        if token is not None:
            handover.arrived(plan.victim.key, token, handed[j])
        if errors[j] is None:
            old = index.write_landed(plan)
            if old >= 0:
                clear.append(old)
        else:
            clear.extend(index.write_failed(plan))
            if plan.replaces:
                dropped.append(plan.key)
    return errors, clear, dropped


def _key_or_none(key: object) -> bytes | None:
    """The key, or None for one that is no key (its write fails on its own)."""
    try:
        return key if type(key) is bytes else normalize_key(key)
    except Exception:
        return None


def _checked(
    key: object, data: bytes | memoryview, block_size: int | None, tier_name: str
) -> tuple[bytes, memoryview]:
    key = key if type(key) is bytes else normalize_key(key)
    if len(key) > MAX_KEY_BYTES:
        raise ValueError(f"block key is {len(key)} bytes, more than {MAX_KEY_BYTES}")
    view = byte_view(data)
    if block_size is not None and view.nbytes > block_size:
        raise ValueError(
            f"ssd tier {tier_name!r}: block {key[:64]!r} of {view.nbytes} bytes exceeds "
            f"the tier's block size, {block_size}"
        )
    return key, view
