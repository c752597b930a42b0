"""A slow-path lookup in progress: what the primary answered, what each tier was asked and
found, and what is still open. :class:`~aiotier._core.promotion.Promotions` fills it in as the
engine asks the tiers one by one."""

from __future__ import annotations

from typing import Final

from .._types import LookupResult
from .requests import RequestState

__all__ = ["LookupScan"]

_MISS: Final = LookupResult.MISS


class LookupScan:
    """One slow-path lookup of ``keys``: what is answered so far and what the tiers have.

    ``hold`` pins each promoted block for the caller (``rs``, or until the next step for
    anonymous calls); ``get`` passes False since it copies the bytes out at once.
    """

    __slots__ = (
        "asked",
        "asked_keys",
        "consulted",
        "exclude",
        "found",
        "hold",
        "keys",
        "need",
        "open",
        "prefix",
        "protected",
        "results",
        "retry_keys",
        "rs",
        "unplaced",
    )

    def __init__(
        self,
        keys: list[bytes],
        rs: RequestState | None,
        exclude: int,
        *,
        prefix: bool,
        hold: bool,
    ) -> None:
        self.keys = keys
        self.rs = rs
        self.exclude = exclude
        self.prefix = prefix  # keys after the first that no tier has cannot extend the prefix
        self.hold = hold
        self.results: list[LookupResult] = [_MISS] * len(keys)
        self.need: list[int] = []  # positions the primary could not answer
        self.open: list[int] = []  # positions no tier has answered yet
        self.asked: list[int] = []  # positions the tier being asked was asked about
        self.asked_keys: list[bytes] = []  # and their keys
        self.protected: list[int] = []  # slots this lookup must not evict
        self.retry_keys: list[bytes] = []
        self.found: dict[int, list[int]] = {}  # tier -> positions it will promote
        self.consulted = False  # whether a secondary tier was asked (it has a sync delay)
        self.unplaced: list[tuple[int, int]] = []  # (position, tier) the primary had no room for
