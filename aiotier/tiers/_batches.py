"""Several writes of one key in one ``write_many`` batch: the rule every tier keeps.

Only the last write of a key takes effect (a caller writing in order expects its last bytes),
and every earlier write of the key reports the outcome of that last one: an earlier write
reported as done while the last one failed would tell the engine that the tier holds bytes it
does not. :class:`LastWrites` picks the writes to carry out and maps their outcomes back to
every position of the batch.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import TypeVar

__all__ = ["LastWrites", "write_each"]

_T = TypeVar("_T")


class LastWrites:
    """Of a batch whose position ``i`` writes ``keys[i]``: :attr:`kept`, the positions to carry
    out, and :meth:`spread`, the outcome each position reports.

    A key of None (one the tier could not make sense of) repeats nothing: its position is kept
    and reports its own outcome (its error).
    """

    __slots__ = ("_source", "kept")

    def __init__(self, keys: Sequence[Hashable | None]) -> None:
        last = {k: i for i, k in enumerate(keys) if k is not None}
        #: The positions to carry out, in batch order: the last of each key, and each None.
        self.kept: list[int] = [i for i, k in enumerate(keys) if k is None or last[k] == i]
        # per position, the index in kept of the write whose outcome it reports (None: itself)
        self._source: list[int] | None = None
        if len(self.kept) < len(keys):
            at = {i: j for j, i in enumerate(self.kept)}
            self._source = [at[i if k is None else last[k]] for i, k in enumerate(keys)]

    def pick(self, items: Sequence[_T]) -> Sequence[_T]:
        """The items at the :attr:`kept` positions (``items`` itself when no key repeats)."""
        if self._source is None:
            return items
        return [items[i] for i in self.kept]

    def spread(self, outcomes: Sequence[_T]) -> list[_T]:
        """Per position of the batch, its outcome, from ``outcomes[j]``, the outcome of the
        write at ``kept[j]``."""
        if len(outcomes) != len(self.kept):
            raise ValueError(f"{len(outcomes)} outcomes for {len(self.kept)} kept writes")
        if self._source is None:
            return list(outcomes)
        return [outcomes[j] for j in self._source]


async def write_each(
    items: Sequence[tuple[bytes, _T]], write: Callable[[bytes, _T], Awaitable[None]]
) -> list[Exception | None]:
    """A ``write_many`` from a single-key ``write``: the last write of each key carried out,
    one at a time, each write of the batch reporting its outcome (``None`` or the failure)."""
    batch = LastWrites([k if k.__class__ is bytes else None for k, _ in items])
    out: list[Exception | None] = []
    for k, d in batch.pick(items):
        try:
            await write(k, d)
        except Exception as exc:
            out.append(exc)
        else:
            out.append(None)
    return batch.spread(out)
