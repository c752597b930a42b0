"""Opening an SSD tier directory (on one of the tier's threads): create or check it, take its
lock, learn or record its geometry, load the index, and reserve the slot files' space.

Space is reserved with ``posix_fallocate`` for every byte of every slot file, so a running
tier never meets ENOSPC: writes only ever overwrite reserved blocks. Where the space is not
there, ``open()`` fails naming the file, the size and the free space, and leaves nothing of
what it tried to reserve behind. (On copy-on-write file systems, btrfs or ZFS, an overwrite
allocates anew and reserving cannot promise this.)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from dataclasses import dataclass, field

from ...errors import ConfigError, TierUnavailableError
from .index import SSDIndex
from .layout import (
    FORMAT,
    LOCK_NAME,
    MARKER_NAME,
    TMP_PREFIX,
    Geometry,
    slot_file_index,
    slot_file_name,
)
from .startup import SSDStart, load_index, write_last_open
from .syscalls import O_CLOEXEC, O_NOFOLLOW, open_regular, replace_file, unlink_quiet

__all__ = ["SlotFiles", "format1_message", "open_directory", "open_slot_files", "read_marker"]

_RW: int = os.O_RDWR | O_CLOEXEC | O_NOFOLLOW
#: Our own names besides the slot files (the checkpoint and last-open are read by name).
_OURS = frozenset({MARKER_NAME, LOCK_NAME, "checkpoint", "last-open", "expiry"})


@dataclass(slots=True)
class SlotFiles:
    """An open, locked tier directory: its geometry and a descriptor per slot file."""

    root: str
    #: The directory's own descriptor and its lock file's, each locked (see :func:`_lock`).
    lock_fds: tuple[int, int]
    geometry: Geometry
    #: File index -> read-write descriptor, for every slot file of :attr:`geometry`.
    fds: dict[int, int] = field(default_factory=dict)

    def path(self, index: int) -> str:
        return os.path.join(self.root, slot_file_name(index))

    def close(self) -> None:
        """Close every descriptor, the locks' last (on a thread: ``close`` may block)."""
        for fd in self.fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()
        _unlock(self.lock_fds)


def format1_message(where: str) -> str:
    return (
        f"{where}: this directory holds SSD tier format 1 (one file per block), which this "
        f"version of aiotier no longer reads; its blocks are a cache: delete the directory, or "
        f"give the tier another path, and it starts empty in format {FORMAT}"
    )


def read_marker(root: str, where: str) -> str | None:
    """The marker's text (format 2 checked), or None when there is none."""
    try:
        fd = open_regular(os.path.join(root, MARKER_NAME), os.O_RDONLY)
        try:
            text = os.read(fd, 4096).decode("ascii")
        finally:
            os.close(fd)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise TierUnavailableError(f"{where}: cannot read {MARKER_NAME}: {exc}") from exc
    first = text.split("\n", 1)[0]
    if first == f"{MARKER_NAME} 1":
        raise ConfigError(format1_message(where))
    if first != f"{MARKER_NAME} {FORMAT}":
        raise ConfigError(f"{where}: unsupported on-disk format {first.strip()!r}")
    return text


def _geometry(text: str | None, capacity: int, block_size: int | None, where: str) -> Geometry:
    if text is not None:
        g = Geometry.from_marker(text, capacity, where)
        if block_size is not None and block_size != g.block_size:
            raise ConfigError(
                f"{where}: the directory holds blocks of {g.block_size} bytes, the tier is "
                f"configured for {block_size}; use another path, or delete the directory (its "
                f"blocks are a cache)"
            )
    elif block_size is None:
        raise ConfigError(
            f"{where}: the block size is not known: an engine gives it when it opens the tier; "
            f"a tier used on its own takes it as SSDTier(..., block_size=N)"
        )
    else:
        g = Geometry.new(block_size, capacity)
    if g.slots == 0:
        raise ConfigError(
            f"{where}: capacity_bytes={capacity} holds no slot: a slot of blocks of "
            f"{g.block_size} bytes takes {g.slot_size} bytes (header and key included)"
        )
    return g


_LOCKED_MESSAGE = (
    "directory is locked by another open SSDTier (this or another process); one tier per "
    "directory"
)


def _lock(root: str, where: str) -> tuple[int, int]:
    """The directory and its lock file, each open and locked.

    The lock that keeps the directory to one tier is on the directory itself: operators and
    temporary-file cleaners remove or replace files (the lock file's times never change), but
    not a directory full of slot files. The lock file is locked as well, for older versions
    of aiotier, which lock only that."""
    try:
        dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | O_CLOEXEC)
    except OSError as exc:
        raise TierUnavailableError(f"{where}: cannot open the directory: {exc}") from exc
    try:
        fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        st, mine = os.stat(root), os.fstat(dir_fd)
        if (st.st_dev, st.st_ino) != (mine.st_dev, mine.st_ino):
            raise FileNotFoundError(root)
        return dir_fd, _lock_file(root, where)
    except BlockingIOError as exc:
        os.close(dir_fd)
        raise TierUnavailableError(f"{where}: {_LOCKED_MESSAGE}") from exc
    except FileNotFoundError as exc:  # an opener that made it failed, and removed it
        os.close(dir_fd)
        raise TierUnavailableError(
            f"{where}: the directory was removed or replaced while opening; try again"
        ) from exc
    except BaseException:
        os.close(dir_fd)
        raise


def _unlock(fds: tuple[int, int]) -> None:
    for fd in reversed(fds):
        with contextlib.suppress(OSError):
            os.close(fd)


def _lock_file(root: str, where: str) -> int:
    """The directory's lock file, open and locked. A lock file removed after we opened it (a
    new tier whose open failed removes its own) locks nothing: then again, on the new one."""
    path = os.path.join(root, LOCK_NAME)
    for _ in range(100):  # each turn, another opener removed the file we locked
        try:
            fd = os.open(path, _RW | os.O_CREAT, 0o600)
        except OSError as exc:
            raise TierUnavailableError(
                f"{where}: directory is not writable ({exc.strerror or exc})"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(fd)
            raise TierUnavailableError(f"{where}: {_LOCKED_MESSAGE}") from exc
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)
    raise TierUnavailableError(f"{where}: its lock file keeps being replaced; is it shared?")


def _make_root(root: str, where: str) -> bool:
    """Create the tier's directory (mode 0700); whether this call made it."""
    try:
        os.makedirs(os.path.dirname(root), exist_ok=True)
        os.mkdir(root, 0o700)
    except FileExistsError:
        return False
    except OSError as exc:
        raise TierUnavailableError(f"{where}: cannot create the directory: {exc}") from exc
    return True


def open_slot_files(
    root: str, where: str, *, writable: bool
) -> tuple[dict[int, int], dict[int, int], int]:
    """Open the slot files there are: descriptors and sizes by file index, and how many
    entries are not the tier's. When ``writable`` (a tier opening, not a tool looking),
    temporaries of a crashed process are removed."""
    fds: dict[int, int] = {}
    sizes: dict[int, int] = {}
    foreign = 0
    flags = _RW if writable else os.O_RDONLY
    try:
        for name in os.listdir(root):
            index = slot_file_index(name)
            if index is None:
                if name.startswith(TMP_PREFIX):
                    if writable:
                        unlink_quiet(os.path.join(root, name))
                elif name not in _OURS:
                    foreign += 1
                continue
            path = os.path.join(root, name)
            try:
                fd = open_regular(path, flags)
            except OSError as exc:
                raise ConfigError(f"{where}: cannot open {name} ({exc.strerror or exc})") from exc
            fds[index] = fd
            sizes[index] = os.fstat(fd).st_size
    except BaseException:
        for fd in fds.values():
            os.close(fd)
        raise
    return fds, sizes, foreign


def _reserve(files: SlotFiles, sizes: dict[int, int], where: str) -> None:
    """Make every slot file exactly its geometry's size, every byte reserved; remove files
    past the last. On failure, undo what this call created or grew, then raise."""
    g = files.geometry
    made: list[tuple[int, int | None]] = []  # (file index, size before; None: created)
    try:
        for i in range(g.files):
            size = g.file_size(i)
            fd = files.fds.get(i)
            if fd is None:
                fd = os.open(files.path(i), _RW | os.O_CREAT | os.O_EXCL, 0o600)
                files.fds[i] = fd
                made.append((i, None))
            elif sizes[i] != size:
                made.append((i, sizes[i]))
            if sizes.get(i, 0) > size:
                os.ftruncate(fd, size)
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                free = _free_bytes(files.root)
                raise TierUnavailableError(
                    f"{where}: cannot reserve {size} bytes for {files.path(i)} "
                    f"({exc.strerror or exc}); the tier's {g.files} slot files take "
                    f"{g.nbytes} bytes in all and the file system has {free} bytes free; "
                    f"lower capacity_bytes or free space"
                ) from exc
    except BaseException:
        for i, before in made:
            with contextlib.suppress(OSError):
                if before is None:
                    os.close(files.fds.pop(i))
                    os.unlink(files.path(i))
                else:
                    os.ftruncate(files.fds[i], before)
        raise
    for i in [i for i in files.fds if i >= g.files]:
        os.close(files.fds.pop(i))
        unlink_quiet(files.path(i))


def _check_room(files: SlotFiles, sizes: dict[int, int], where: str) -> None:
    """Refuse, before anything is allocated, slot files the file system has no room for."""
    g = files.geometry
    growth = sum(max(g.file_size(i) - sizes.get(i, 0), 0) for i in range(g.files))
    free = _free_bytes(files.root)
    if isinstance(free, int) and growth > free:
        raise ConfigError(
            f"{where}: capacity_bytes={g.nbytes} needs {growth} more bytes on disk for its "
            f"{g.files} slot files, and the file system has {free} bytes free; lower "
            f"capacity_bytes or free space"
        )


def _free_bytes(root: str) -> int | str:
    try:
        st = os.statvfs(root)
    except OSError:
        return "unknown"
    return st.f_bavail * st.f_frsize


def open_directory(
    path: str, capacity: int, block_size: int | None, tier_name: str
) -> tuple[SlotFiles, SSDIndex, SSDStart]:
    """Open the tier directory ``path`` for ``capacity`` bytes of slots of ``block_size``
    (None: the directory's own): the open files, the index and how the start went."""
    t0 = time.perf_counter()
    root = os.path.abspath(path)
    where = f"ssd tier {tier_name!r} at {root!r}"
    if os.path.lexists(root) and not os.path.isdir(root):
        raise ConfigError(f"{where}: path exists and is not a directory")
    made_root = _make_root(root, where)
    made_lock = not os.path.lexists(os.path.join(root, LOCK_NAME))
    lock_fds = _lock(root, where)
    files: SlotFiles | None = None
    new = wrote_marker = False
    try:  # the marker is read under the lock: another opener may be creating the tier
        text = read_marker(root, where)
        new = text is None
        if new:
            extra = set(os.listdir(root)) - {LOCK_NAME}
            if extra:
                raise ConfigError(
                    f"{where}: directory is not empty and has no {MARKER_NAME} marker; "
                    f"refusing to use it (found e.g. {sorted(extra)[0]!r})"
                )
        g = _geometry(text, capacity, block_size, where)
        files = SlotFiles(root, lock_fds, g)
        if new:
            try:
                marker = g.marker_text().encode()
                replace_file(root, MARKER_NAME, marker, tmp_prefix=TMP_PREFIX, sync=True)
            except OSError as exc:
                raise TierUnavailableError(
                    f"{where}: directory is not writable ({exc.strerror or exc})"
                ) from exc
            wrote_marker = True
        files.fds, sizes, foreign = open_slot_files(root, where, writable=True)
        _check_room(files, sizes, where)
        index, start = load_index(root, files.fds, sizes, g, new=new)
        start.foreign = foreign
        _reserve(files, sizes, where)
        start.seconds = time.perf_counter() - t0
        write_last_open(root, start)
    except BaseException:
        # a tier that never started leaves nothing behind, removed under the lock (and a
        # directory it did not make keeps any file it did not write)
        if wrote_marker:
            unlink_quiet(os.path.join(root, MARKER_NAME))
        if wrote_marker or made_root or made_lock:
            unlink_quiet(os.path.join(root, LOCK_NAME))
        if made_root:
            with contextlib.suppress(OSError):
                os.rmdir(root)
        if files is not None:
            files.close()
        else:
            _unlock(lock_fds)
        raise
    return files, index, start
