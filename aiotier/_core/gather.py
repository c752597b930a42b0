"""``gather(values, indexes)``: many lookups in one C-level call, for checks over whole batches."""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import Any

__all__ = ["gather"]


def gather(values: Any, indexes: Sequence[Any]) -> tuple[Any, ...]:
    """``tuple(values[i] for i in indexes)``, raising as ``values[i]`` would (``KeyError``,
    ``IndexError``, ``TypeError``)."""
    if len(indexes) > 1:
        return itemgetter(*indexes)(values)  # type: ignore[no-any-return]
    return (values[indexes[0]],) if indexes else ()
