"""Admission: whether a block may enter a tier at all, decided from how often its key is seen.

A *sighting* is one call naming a key: ``lookup``, ``lookup_prefix`` (each key up to where the
prefix stops), ``get`` and ``prepare_store``. A policy that counts sightings keeps them in a
:class:`FrequencySketch`: a count-min sketch of a fixed size (its memory never grows with the
number of keys) whose counts may overestimate (two keys can share a counter) but never
underestimate, and which halves every count each time it has taken ``10 x width`` sightings,
so old popularity fades.

The primary applies its policy in ``prepare_store`` (a key not admitted is left out of
``keys_to_store`` and evicts nothing; ``put`` always stores); a secondary tier applies its policy
to every write into it (demotions, write-through, the write-down at close).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence

from ..errors import ConfigError

__all__ = [
    "AdmissionPolicy",
    "AdmitAfter",
    "AdmitAll",
    "AdmitTinyLFU",
    "FrequencySketch",
    "parse_admission",
]

_HALF = bytes(i >> 1 for i in range(256))  # a translation table that halves every counter


class FrequencySketch:
    """Approximate sighting counts of keys in four rows of ``width`` bytes (``width``: a power
    of two at least ``capacity``); each count saturates at 255.

    A key's cell in row ``i`` is ``(h + i * step) & mask`` (double hashing from its hash ``h``),
    computed from the masked parts of ``h`` so that no step makes a large int: the hot loops
    below are where LFUDA and the admission policies spend most of their time.
    """

    __slots__ = ("_mask", "_rows", "_sample", "_seen", "width")

    def __init__(self, capacity: int, *, window: int = 10) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ConfigError(f"sketch capacity must be an int >= 1, got {capacity!r}")
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise ConfigError(f"sketch window must be an int >= 1, got {window!r}")
        width = 1 << max(capacity - 1, 1).bit_length()
        self.width = width
        self._mask = width - 1
        self._rows: tuple[bytearray, bytearray, bytearray, bytearray] = (
            bytearray(width),
            bytearray(width),
            bytearray(width),
            bytearray(width),
        )
        self._sample = window * width
        self._seen = 0

    @property
    def nbytes(self) -> int:
        """Its memory, fixed at creation."""
        return 4 * self.width

    def _cells(self, key: bytes) -> tuple[int, int, int, int]:
        h, m = hash(key), self._mask
        a, step = h & m, (h >> 32 & m) | 1
        b = (a + step) & m
        c = (b + step) & m
        return a, b, c, (c + step) & m

    def add(self, keys: Iterable[bytes]) -> None:
        """One sighting of each key."""
        m = self._mask
        r0, r1, r2, r3 = self._rows
        n = 0
        for h in map(hash, keys):  # _cells, inlined; a saturated count stays at 255
            a, step = h & m, (h >> 32 & m) | 1
            b = (a + step) & m
            c = (b + step) & m
            d = (c + step) & m
            if (ca := r0[a] + 1) < 256:
                r0[a] = ca
            if (cb := r1[b] + 1) < 256:
                r1[b] = cb
            if (cc := r2[c] + 1) < 256:
                r2[c] = cc
            if (cd := r3[d] + 1) < 256:
                r3[d] = cd
            n += 1
        self._seen += n
        if self._seen >= self._sample:
            self._halve()

    def increment(self, key: bytes) -> int:
        """One sighting of ``key``, and its estimate after it (``add`` then ``estimate`` of one
        key, in one pass)."""
        (count,) = self._increment_run((key,))
        if self._seen >= self._sample:
            self._halve()
            return count >> 1
        return count

    def increment_many(self, keys: Sequence[bytes]) -> list[int]:
        """:meth:`increment` of each key, in order: their estimates after each one's sighting."""
        if self._seen + len(keys) >= self._sample:
            return [self.increment(k) for k in keys]  # a halving on the way
        return self._increment_run(keys)

    def _increment_run(self, keys: Sequence[bytes]) -> list[int]:
        """:meth:`increment_many` with no halving due."""
        out: list[int] = []
        append = out.append
        m = self._mask
        r0, r1, r2, r3 = self._rows
        for h in map(hash, keys):  # _cells, inlined; a saturated count stays at 255
            a, step = h & m, (h >> 32 & m) | 1
            b = (a + step) & m
            c = (b + step) & m
            d = (c + step) & m
            ca = r0[a] + 1  # compared after the add: one step fewer than before it
            if ca < 256:
                r0[a] = ca
            else:
                ca = 255
            cb = r1[b] + 1
            if cb < 256:
                r1[b] = cb
            else:
                cb = 255
            cc = r2[c] + 1
            if cc < 256:
                r2[c] = cc
            else:
                cc = 255
            cd = r3[d] + 1
            if cd < 256:
                r3[d] = cd
            else:
                cd = 255
            if cb < ca:  # min(ca, cb, cc, cd), without a call
                ca = cb
            if cd < cc:
                cc = cd
            append(ca if ca < cc else cc)
        self._seen += len(keys)
        return out

    def _halve(self) -> None:
        r0, r1, r2, r3 = self._rows
        self._rows = (r0.translate(_HALF), r1.translate(_HALF), r2.translate(_HALF),
                      r3.translate(_HALF))  # fmt: skip
        self._seen //= 2

    def estimate(self, key: bytes) -> int:
        """How often ``key`` was seen (recently); never less than the truth."""
        r0, r1, r2, r3 = self._rows
        a, b, c, d = self._cells(key)
        return min(r0[a], r1[b], r2[c], r3[d])

    def estimate_many(self, keys: Iterable[bytes]) -> list[int]:
        """:meth:`estimate` of each key."""
        m = self._mask
        r0, r1, r2, r3 = self._rows
        out: list[int] = []
        append = out.append
        for h in map(hash, keys):  # _cells, inlined
            a, step = h & m, (h >> 32 & m) | 1
            b = (a + step) & m
            c = (b + step) & m
            ca, cb, cc = r0[a], r1[b], r2[c]
            cd = r3[(c + step) & m]
            if cb < ca:  # min(ca, cb, cc, cd), without a call
                ca = cb
            if cd < cc:
                cc = cd
            append(ca if ca < cc else cc)
        return out


class AdmissionPolicy(ABC):
    """Decides which blocks may enter a tier. One instance may serve several tiers."""

    #: Whether the engine must report sightings (``saw``); False spares the lookups that cost.
    counts_sightings: bool = True
    #: Whether ``admit`` looks at its ``victim``; False spares finding the victims.
    weighs_victims: bool = True

    def saw(self, keys: Iterable[bytes]) -> None:  # noqa: B027 - optional hook
        """Each key was named by one call (a sighting)."""

    @abstractmethod
    def admit(self, key: bytes, victim: bytes | None) -> bool:
        """Whether ``key`` may enter the primary, where it would evict ``victim`` (None: it
        takes a free slot)."""

    def admit_below(self, key: bytes) -> bool:
        """Whether ``key`` may be written into a secondary tier, whose victims (it evicts by
        its own budget) the engine cannot see."""
        return self.admit(key, None)

    def admit_into_primary(
        self, keys: Sequence[bytes], free: int, victims: Sequence[bytes]
    ) -> list[bytes]:
        """Which of ``keys`` (in order) enter a primary with ``free`` free slots, whose next
        victims are ``victims`` in eviction order: the first admitted keys take the free
        slots, each later one is weighed against the block it would evict."""
        upcoming = iter(victims)
        victim = None
        admitted: list[bytes] = []
        for k in keys:
            if len(admitted) >= free and victim is None:
                victim = next(upcoming, None)
            if self.admit(k, victim):
                admitted.append(k)
                victim = None
        return admitted


class AdmitAll(AdmissionPolicy):
    """Every block is admitted (the default for every tier)."""

    counts_sightings = False
    weighs_victims = False

    def admit(self, key: bytes, victim: bytes | None) -> bool:
        return True

    def admit_into_primary(
        self, keys: Sequence[bytes], free: int, victims: Sequence[bytes]
    ) -> list[bytes]:
        return list(keys)

    def __repr__(self) -> str:
        return "AdmitAll()"


class AdmitAfter(AdmissionPolicy):
    """Admit a key once it has been seen at least ``n`` times (the current call included): a
    reuse filter, as vLLM's offloading manager stores only blocks looked up N times.

    Sightings live in a :class:`FrequencySketch` of ``capacity`` counters per row (4 bytes
    each): with more distinct keys than that in one window, some keys are admitted early.
    """

    weighs_victims = False

    def __init__(self, n: int, *, capacity: int = 1 << 18) -> None:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ConfigError(f"AdmitAfter needs an int n >= 1, got {n!r}")
        self.n = n
        self.sketch = FrequencySketch(capacity)

    def saw(self, keys: Iterable[bytes]) -> None:
        self.sketch.add(keys)

    def admit(self, key: bytes, victim: bytes | None) -> bool:
        return self.sketch.estimate(key) >= self.n

    def admit_into_primary(
        self, keys: Sequence[bytes], free: int, victims: Sequence[bytes]
    ) -> list[bytes]:
        n, seen = self.n, self.sketch.estimate_many(keys)
        return [k for k, times in zip(keys, seen, strict=True) if times >= n]

    def __repr__(self) -> str:
        return f"AdmitAfter({self.n})"


class AdmitTinyLFU(AdmissionPolicy):
    """TinyLFU: admit a newcomer into the primary only if it has been seen more often than the
    block it would evict (a free slot takes anyone). Into a secondary tier, whose victims the
    engine cannot see, a newcomer seen at least twice is admitted: one-hit wonders stay out.
    """

    def __init__(self, *, capacity: int = 1 << 18) -> None:
        self.sketch = FrequencySketch(capacity)

    def saw(self, keys: Iterable[bytes]) -> None:
        self.sketch.add(keys)

    def admit(self, key: bytes, victim: bytes | None) -> bool:
        return victim is None or self.sketch.estimate(key) > self.sketch.estimate(victim)

    def admit_into_primary(
        self, keys: Sequence[bytes], free: int, victims: Sequence[bytes]
    ) -> list[bytes]:
        # the base class's walk, with every estimate taken in two batches
        estimate = self.sketch.estimate_many
        upcoming = iter(estimate(victims))
        victim: int | None = None  # the next victim's estimate
        admitted: list[bytes] = []
        for k, seen in zip(keys, estimate(keys), strict=True):
            if len(admitted) >= free and victim is None:
                victim = next(upcoming, None)
            if victim is None or seen > victim:
                admitted.append(k)
                victim = None
        return admitted

    def admit_below(self, key: bytes) -> bool:
        return self.sketch.estimate(key) >= 2

    def __repr__(self) -> str:
        return "AdmitTinyLFU()"


def parse_admission(spec: str) -> AdmissionPolicy:
    """A policy from its configuration string: ``all``, ``after:N`` or ``tinylfu``."""
    if not isinstance(spec, str):
        raise ConfigError(f"admission policy must be a string, got {spec!r}")
    name, _, arg = spec.strip().lower().partition(":")
    if name == "all" and not arg:
        return AdmitAll()
    if name == "after" and arg.isdigit():
        return AdmitAfter(int(arg))
    if name == "tinylfu" and not arg:
        return AdmitTinyLFU()
    raise ConfigError(f"unknown admission policy {spec!r}; expected 'all', 'after:N' or 'tinylfu'")
