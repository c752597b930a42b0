"""The primary arena in shared memory, for worker processes that move blocks in and out of it.

A scheduler process owns the engine; with ``PrimaryTier(..., shared_memory=True)`` its arena
is a POSIX shared-memory segment (``/dev/shm`` on Linux) named by
``PrimaryTier.shared_memory_name``. Another process (a vLLM tensor-parallel worker) maps the same
segment with :class:`SharedArena` and reaches a slot by its id, the ``block_ids`` of the load
and store specs: it writes the slots of a ``prepare_store`` before ``complete_store`` and reads
the slots of a ``prepare_load`` before ``complete_load``, exactly as a caller in the scheduler's
process does through the specs' buffers. The engine's bookkeeping (which key is in which slot,
pins, lengths) stays in the scheduler's process.

The segment's name is removed when the engine closes (or, failing that, when the
``PrimaryTier`` is collected or the scheduler's process exits); processes still attached keep
their mapping until they close it. Neither a worker that attached nor a child forked from the
scheduler is responsible for the segment: its exit never removes it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import sys
import threading
from multiprocessing import shared_memory
from types import TracebackType

from .errors import ConfigError

__all__ = ["SharedArena", "create_segment", "segment_name"]


class _Segment(shared_memory.SharedMemory):
    """A segment whose views may outlive this object (the arena's slices, a spec's buffers):
    the mapping then goes with the last view, and finalising this object stays quiet."""

    def __del__(self) -> None:
        with contextlib.suppress(BufferError, OSError):
            self.close()


def _drop_fd(shm: shared_memory.SharedMemory) -> None:
    # the mapping holds its own reference to the memory: the descriptor is not needed
    fd = getattr(shm, "_fd", -1)
    if fd >= 0:
        os.close(fd)
        shm._fd = -1  # type: ignore[attr-defined]


def segment_name(stem: str, num_blocks: int, block_size: int) -> str:
    """The name of the segment ``create_segment(num_blocks, block_size, stem)`` makes: the stem
    and the geometry, which :class:`SharedArena` checks."""
    return f"{stem}-{num_blocks}x{block_size}"


#: What a stem may hold: a POSIX shared-memory name is one path component, 255 bytes at most
#: on Linux and 31 on macOS (the geometry is appended).
_STEM = re.compile(r"[A-Za-z0-9_.-]{1,200}")


def create_segment(
    num_blocks: int, block_size: int, stem: str | None = None
) -> shared_memory.SharedMemory:
    """A new segment of ``num_blocks * block_size`` bytes (zeroed, every page reserved), or a
    :class:`ConfigError` naming the size. Its name is ``stem`` (default: ``aiotier-`` and a
    random id) followed by the geometry, which :class:`SharedArena` checks; a name already in
    use is a :class:`ConfigError`. This process's resource tracker removes it if the process
    exits without doing so."""
    nbytes = num_blocks * block_size
    if stem is None:
        stem = f"aiotier-{secrets.token_hex(4)}"
    elif not isinstance(stem, str) or not _STEM.fullmatch(stem):
        raise ConfigError(
            f"shared memory name stem must be 1-200 letters, digits, '_', '.' or '-', got {stem!r}"
        )
    name = segment_name(stem, num_blocks, block_size)
    why = (
        f"cannot create a {nbytes}-byte shared-memory arena ({{}}); on Linux it lives in "
        f"/dev/shm, whose size limits it (containers often mount 64 MiB: raise --shm-size)"
    )
    try:
        shm = _Segment(name=name, create=True, size=nbytes)
    except FileExistsError:
        raise ConfigError(
            f"a shared-memory segment named {name!r} exists already: another process uses that "
            f"name, or one that made it was killed with its resource tracker (on Linux, remove "
            f"/dev/shm/{name} once nothing uses it)"
        ) from None
    except OSError as exc:
        raise ConfigError(why.format(exc)) from exc
    fallocate = getattr(os, "posix_fallocate", None)
    fd = getattr(shm, "_fd", -1)
    if fallocate is not None and fd >= 0:
        # a segment is sparse: without its pages reserved now, the first write past what
        # /dev/shm holds is a SIGBUS in whichever process writes
        try:
            fallocate(fd, 0, nbytes)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # cannot reserve: as before
                with contextlib.suppress(OSError):
                    shm.unlink()
                _drop_fd(shm)
                shm.close()
                raise ConfigError(why.format(exc)) from exc
    _drop_fd(shm)
    return shm


_UNTRACKED = threading.Lock()
#: The geometry a segment's name carries (``create_segment``): slots and their size.
_GEOMETRY = re.compile(r"-(\d+)x(\d+)$")


def _attach(name: str) -> shared_memory.SharedMemory:
    """Map an existing segment without registering it with a resource tracker: the tracker
    would remove it when this process exits, under the scheduler's feet (and a worker started
    by ``multiprocessing`` shares its parent's tracker, so undoing a registration there would
    undo the scheduler's own). Python 3.13 says so with ``track=False``; before, registration
    is skipped for the duration of the attach."""
    if sys.version_info >= (3, 13):
        shm: shared_memory.SharedMemory = _Segment(name=name, track=False)
    else:
        from multiprocessing import resource_tracker

        with _UNTRACKED:
            register = resource_tracker.register
            resource_tracker.register = lambda *_args: None
            try:
                shm = _Segment(name=name)
            finally:
                resource_tracker.register = register
    _drop_fd(shm)
    return shm


class SharedArena:
    """A worker's view of a scheduler's shared-memory arena: ``slot(i)`` is the writable
    ``block_size``-byte view of slot ``i``.

    ``name``, ``num_blocks`` and ``block_size`` come from the scheduler's ``PrimaryTier``
    (``shared_memory_name``, ``num_blocks``, ``block_size``). Raises ``FileNotFoundError`` when
    no such segment exists (the engine closed) and :class:`~aiotier.errors.ConfigError` when it
    is smaller than ``num_blocks * block_size`` or was made with another geometry (the name
    says). Use it as a context manager, or :meth:`close`
    it once every view it gave is released.
    """

    def __init__(self, name: str, num_blocks: int, block_size: int) -> None:
        for field, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{field} must be an int > 0, got {value!r}")
        made = _GEOMETRY.search(name)
        if made is not None and (int(made[1]), int(made[2])) != (num_blocks, block_size):
            raise ConfigError(
                f"shared arena {name!r} has {made[1]} slots of {made[2]} bytes, not "
                f"{num_blocks} of {block_size}: slot ids would name other bytes"
            )
        self._shm = _attach(name)
        self.name = name
        self.num_blocks = num_blocks
        self.block_size = block_size
        nbytes = num_blocks * block_size
        if self._shm.size < nbytes:
            size = self._shm.size
            self._shm.close()
            raise ConfigError(
                f"shared arena {name!r} holds {size} bytes, fewer than {num_blocks} x "
                f"{block_size}"
            )
        buf = self._shm.buf
        assert buf is not None
        self._view: memoryview | None = buf[:nbytes]

    def slot(self, slot_id: int) -> memoryview:
        """The whole slot ``slot_id`` (``block_size`` bytes), writable."""
        if self._view is None:
            raise ValueError(f"shared arena {self.name!r} is closed")
        if not isinstance(slot_id, int) or not 0 <= slot_id < self.num_blocks:
            raise ValueError(f"slot {slot_id!r} is not in 0..{self.num_blocks - 1}")
        off = slot_id * self.block_size
        return self._view[off : off + self.block_size]

    def slots(self) -> memoryview:
        """Every slot, writable: slot ``i`` is bytes ``i * block_size`` to ``(i + 1) *
        block_size`` (for copies of many slots at once, as a tensor over the whole arena)."""
        if self._view is None:
            raise ValueError(f"shared arena {self.name!r} is closed")
        return self._view[:]

    def close(self) -> None:
        """Unmap the segment (it stays for the scheduler). Views given out must be released
        first, else ``BufferError``."""
        if self._view is not None:
            self._view.release()
            self._view = None
        self._shm.close()

    def __enter__(self) -> SharedArena:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
