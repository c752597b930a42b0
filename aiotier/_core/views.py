"""The views ``prepare_load`` and ``prepare_store`` hand out, held per request until their
``complete_*``, which releases them: a late use raises ``ValueError`` instead of reading (or
writing) whatever block reuses the slot by then.

A batch's views are made when the caller first reads its spec's ``buffers`` (a caller that
addresses blocks by id, as vLLM's workers do, never pays for them); views first made after
their keys completed come out released, as if made at the prepare and released since.

They are held as the batches they were handed out in, so the usual call, a ``complete_*`` of
the very keys of one ``prepare_*``, costs a tuple comparison and a C-level pass; completing
part of a batch, or keys of several, finds each key's view on its own.

A view with an export (``numpy.frombuffer`` of it, say) cannot be released and stays valid; so
do slices and copies made of a view, which are objects of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["HandedViews", "ViewBatch"]


def _release(views: Sequence[memoryview | None]) -> None:
    try:
        list(map(memoryview.release, views))  # type: ignore[arg-type]
    except (BufferError, TypeError):  # an exported view (see the module doc), or a gap
        for v in views:
            if v is not None:
                try:  # noqa: SIM105 (a try costs nothing; contextlib.suppress an object)
                    v.release()  # releasing twice is allowed
                except BufferError:
                    pass


class ViewBatch:
    """The keys of one ``prepare_*`` and their views, made on first use by ``make``.

    ``views`` is None until they are made; then one entry per key, None once that key's
    view was released. ``handed`` is what the spec shows: every view made, released or not.
    """

    __slots__ = ("_make", "handed", "keys", "released", "views")

    def __init__(self, keys: tuple[bytes, ...], make: Callable[[], list[memoryview]]) -> None:
        self.keys = keys
        self._make = make
        self.views: list[memoryview | None] | None = None
        self.handed: tuple[memoryview, ...] | None = None
        #: released whole before the views were made: they come out released
        self.released = False

    def made(self) -> list[memoryview | None]:
        """The views, made now if they were not yet (for a completion of part of the batch)."""
        if self.views is None:
            self.handed = tuple(self._make())
            self.views = list(self.handed)
        return self.views

    def buffers(self) -> tuple[memoryview, ...]:
        """What the spec hands out (made at the first call)."""
        if self.handed is None:
            if self.released:  # completed already: released views (never the slot's bytes)
                self.handed = tuple(memoryview(b"") for _ in self.keys)
                _release(self.handed)
            else:
                self.made()
        assert self.handed is not None
        return self.handed

    def release(self) -> None:
        """Release every view of the batch (made or to be made)."""
        if self.views is None:
            self.released = True
        else:
            _release(self.views)


def _release_from(batches: list[ViewBatch], ks: tuple[bytes, ...], latest: bool) -> list[bytes]:
    """Release one view of each key of ``ks`` held in ``batches``; the keys not found."""
    order = range(len(batches) - 1, -1, -1) if latest else range(len(batches))
    for i in order:
        if batches[i].keys == ks:
            batches.pop(i).release()
            return []
    missing = []
    for k in ks:
        for i in order:
            batch = batches[i]
            views = batch.made()
            at = [j for j, bk in enumerate(batch.keys) if bk == k and views[j] is not None]
            if at:
                j = at[-1] if latest else at[0]
                _release(views[j : j + 1])
                views[j] = None
                break
        else:
            missing.append(k)
    batches[:] = [b for b in batches if any(v is not None for v in b.made())]
    return missing


def _take_one(batches: list[ViewBatch], k: bytes) -> memoryview | None:
    """Take the earliest outstanding view of ``k`` out of ``batches`` (None: there is none)."""
    for i, batch in enumerate(batches):
        views = batch.made()
        for j, bk in enumerate(batch.keys):
            v = views[j]
            if bk == k and v is not None:
                views[j] = None
                if all(x is None for x in views):
                    del batches[i]
                return v
    return None


def _holds(batches: list[ViewBatch], k: bytes) -> bool:
    return any(
        bk == k and v is not None
        for b in batches
        for bk, v in zip(b.keys, b.made(), strict=True)
    )


class HandedViews:
    """The views handed out to one request and not completed yet, batch by batch; those
    handed out before a clear apart (they may still be completed, or be given up at once)."""

    __slots__ = ("_batches", "_cancelled", "_done")

    def __init__(self) -> None:
        self._batches: list[ViewBatch] = []
        self._cancelled: list[ViewBatch] = []
        #: views of loads completed while another load of their key is outstanding
        self._done: dict[bytes, list[memoryview]] = {}

    def hold(self, keys: Sequence[bytes], make: Callable[[], list[memoryview]]) -> ViewBatch:
        """The batch of views of ``keys`` that ``make`` makes when first asked for."""
        batch = ViewBatch(tuple(keys), make)
        if keys:
            self._batches.append(batch)
        return batch

    def release(self, keys: Sequence[bytes], *, latest: bool) -> None:
        """Release one view of each key: its latest, or its earliest (stores complete in the
        order they were prepared)."""
        if self._batches or self._cancelled:
            missing = _release_from(self._batches, tuple(keys), latest)
            if missing and self._cancelled:
                _release_from(self._cancelled, tuple(missing), latest)

    def release_loaded(self, keys: Sequence[bytes]) -> None:
        """A load of ``keys`` completed. Two loads of one key by one request hand out views of
        the same block and nothing tells which one completes (concurrent tasks end in any
        order): a key's views are released once no load of it is outstanding."""
        ks = tuple(keys)
        if not (self._batches or self._cancelled):
            return
        if (
            len(self._batches) == 1
            and self._batches[0].keys == ks
            and not (self._cancelled or self._done)
        ):
            self._batches.pop().release()  # the usual call: one batch, completed whole
            return
        done = self._done
        for k in ks:  # park one view of each key as done (a load since the clear first)
            found = _take_one(self._batches, k)
            if found is not None:
                done.setdefault(k, []).append(found)
            else:  # a load from before a clear: a block of its own, released at once
                cancelled = _take_one(self._cancelled, k)
                if cancelled is not None:
                    _release([cancelled])
        for k in set(ks):
            if k in done and not _holds(self._batches, k):
                _release(done.pop(k))

    def cancel(self) -> None:
        """A clear cancelled everything handed out so far."""
        self._cancelled += self._batches
        self._batches.clear()

    def release_cancelled(self) -> None:
        for batch in self._cancelled:
            batch.release()
        self._cancelled.clear()

    def release_all(self) -> None:
        self.release_cancelled()
        for batch in self._batches:
            batch.release()
        self._batches.clear()
        for parked in self._done.values():
            _release(parked)
        self._done.clear()
