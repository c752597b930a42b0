"""ObjectStoreTier against a real SeaweedFS S3 gateway: exact bytes, objects on the server, framing,
hostile keys, corruption, immutable keys, the concurrency bound, retries and deadlines."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import obstore
import pytest
from helpers import check_written_views_may_be_reused, lookup_one, read_one, remove_one, write_one
from seaweedfs_fixtures import (
    ACCESS_KEY,
    READER_KEY,
    READER_SECRET,
    SECRET_KEY,
    S3Endpoint,
    use_credentials,
)

from aiotier import ConfigError, LookupResult, ObjectStoreTier, TierSetup, TierUnavailableError
from aiotier.errors import BlockCorruptedError, TieringError
from aiotier.tiers.framing import HEADER, block_digest, encode_frame
from aiotier.tiers.objectstore.client import Refused, ServerBusy, Unreachable, classify

pytestmark = pytest.mark.s3

HIT, MISS = LookupResult.HIT, LookupResult.MISS


@pytest.fixture(autouse=True)
def credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials in the environment for every test, also those without a server: without
    them obstore would ask the instance metadata service, which is not on this machine."""
    use_credentials(monkeypatch, ACCESS_KEY, SECRET_KEY)


def buf(n: int = 1 << 16) -> memoryview:
    return memoryview(bytearray(n))


def tier_on(s3: S3Endpoint, **kwargs: Any) -> ObjectStoreTier:
    kwargs.setdefault("prefix", s3.prefix)
    return ObjectStoreTier(s3.bucket, endpoint_url=s3.url, **kwargs)


@pytest.fixture
async def tier(s3: S3Endpoint) -> AsyncIterator[ObjectStoreTier]:
    t = tier_on(s3)
    await t.open()
    try:
        yield t
    finally:
        await t.aclose()


async def listed(s3: S3Endpoint) -> dict[str, int]:
    """Every object under the test's prefix, as the server lists it: name -> size."""
    out: dict[str, int] = {}
    async for chunk in obstore.list(s3.store(), prefix=s3.prefix):  # type: ignore[arg-type]
        for meta in chunk:
            out[meta["path"]] = meta["size"]
    return out


async def raw_get(s3: S3Endpoint, name: str) -> bytes:
    result = await obstore.get_async(s3.store(), name)  # type: ignore[arg-type]
    return bytes(await result.bytes_async())


async def read_back(t: ObjectStoreTier, key: bytes) -> bytes | None:
    """What ``t`` reads for ``key``; None when it has nothing."""
    b = buf()
    n = await read_one(t, key, b)
    return None if n < 0 else bytes(b[:n])


async def raw_put(s3: S3Endpoint, name: str, data: bytes) -> None:
    await obstore.put_async(s3.store(), name, data)  # type: ignore[arg-type]


# -- bytes, names, frames -------------------------------------------------------------------------


async def test_a_new_tier_reads_exactly_what_another_wrote(
    s3: S3Endpoint, tier: ObjectStoreTier
) -> None:
    blocks = {f"k{i}".encode(): bytes([i]) * (1000 + i) for i in range(10)}
    assert await tier.write_many(list(blocks.items())) == [None] * 10
    other = tier_on(s3)
    await other.open()
    try:
        keys = [*blocks, b"never-written"]
        assert await other.lookup_many(keys) == [HIT] * 10 + [MISS]
        bufs = [buf() for _ in keys]
        lengths = await other.read_many_into(keys, bufs)
        assert lengths == [len(v) for v in blocks.values()] + [-1]
        for b, (n, want) in zip(bufs, zip(lengths, blocks.values(), strict=False), strict=False):
            assert bytes(b[:n]) == want
    finally:
        await other.aclose()


async def test_a_written_view_s_buffer_may_be_reused_at_once(tier: ObjectStoreTier) -> None:
    await check_written_views_may_be_reused(tier)


async def test_objects_are_frames_named_by_a_hash_of_the_key_under_the_prefix(
    s3: S3Endpoint, tier: ObjectStoreTier
) -> None:
    await write_one(tier, b"alpha", b"payload-alpha")
    name = s3.prefix + block_digest(b"alpha").hex()
    assert tier.object_name(b"alpha") == name
    assert await listed(s3) == {name: len(encode_frame(b"alpha", b"payload-alpha"))}
    assert await raw_get(s3, name) == encode_frame(b"alpha", b"payload-alpha")


@pytest.mark.parametrize(
    "key",
    [
        b"../../../escape",
        b"/absolute/path",
        b"a/../../b",
        b"\x00\xff\xfe nul and high bytes",
        "ключ/ünicode?query=1#frag".encode(),
        b"%2e%2e%2f",
        b"x" * 1024,
        b"",
    ],
    ids=["dotdot", "absolute", "mixed", "binary", "unicode", "percent", "longest", "empty"],
)
async def test_hostile_keys_stay_under_the_prefix(
    s3: S3Endpoint, tier: ObjectStoreTier, key: bytes
) -> None:
    await write_one(tier, key, b"v" + key[:16])
    names = await listed(s3)
    assert list(names) == [s3.prefix + block_digest(key).hex()]
    b = buf()
    n = await read_one(tier, key, b)
    assert bytes(b[:n]) == b"v" + key[:16]
    assert await remove_one(tier, key) is True
    assert await listed(s3) == {}


@pytest.mark.parametrize(
    "prefix", ["no-slash", "/lead/", "a//b/", "./", "a/../", "sp ace/", "ü/", 7]
)
def test_prefix_that_could_escape_or_be_rewritten_is_refused(prefix: object) -> None:
    with pytest.raises(ConfigError, match="prefix"):
        ObjectStoreTier("bucket", prefix=prefix)  # type: ignore[arg-type]


def test_other_bad_arguments_are_config_errors() -> None:
    for kwargs in (
        {"max_concurrency": 0},
        {"timeout": 0},
        {"endpoint_url": "ftp://x"},
        {"failure_threshold": 0},
    ):
        with pytest.raises(ConfigError):
            ObjectStoreTier("bucket", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="bucket"):
        ObjectStoreTier("a/b")


async def test_block_longer_than_the_buffer_is_refused_untouched(tier: ObjectStoreTier) -> None:
    await write_one(tier, b"big", b"z" * 100)
    small = buf(10)
    with pytest.raises(ValueError, match="100 bytes, buffer holds 10"):
        await read_one(tier, b"big", small)
    assert bytes(small) == bytes(10)


# -- corruption -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "corrupt",
    ["garbage", "flipped payload byte", "truncated", "frame of another key", "empty"],
)
async def test_overwritten_object_is_a_counted_miss_and_never_returned(
    s3: S3Endpoint, tier: ObjectStoreTier, corrupt: str
) -> None:
    payload = bytes(range(256)) * 64
    await write_one(tier, b"victim", payload)
    name = tier.object_name(b"victim")
    good = encode_frame(b"victim", payload)
    flipped = bytearray(good)
    flipped[-1] ^= 0xFF
    bad = {
        "garbage": b"\x80\x04pickled?" + b"\x00" * 100,
        "flipped payload byte": bytes(flipped),
        "truncated": good[:-1],
        "frame of another key": encode_frame(b"intruder", payload),
        "empty": b"",
    }[corrupt]
    await raw_put(s3, name, bad)  # through the plain client, behind the tier's back

    reader = tier_on(s3)  # knows nothing of the object: asks the server
    await reader.open()
    try:
        assert await lookup_one(reader, b"victim") is HIT  # a HEAD cannot tell
        b = buf(len(payload))
        with pytest.raises(BlockCorruptedError, match="object tier 'object'"):
            await read_one(reader, b"victim", b)
        assert bytes(b) == bytes(len(payload))  # nothing of the bad object was copied
        assert reader.corrupted == 1
        assert reader.contains_hint(b"victim") is None
        # The tier now knows that object by its ETag: a MISS without another GET.
        assert await lookup_one(reader, b"victim") is MISS
        # A fresh write of the key is served again.
        await write_one(tier, b"victim", payload)
        assert await lookup_one(reader, b"victim") is HIT
        assert await read_one(reader, b"victim", b) == len(payload)
        assert bytes(b) == payload
        assert reader.corrupted == 1
    finally:
        await reader.aclose()


class AnswerLost:
    """The tier's client, except that a PUT reaches the server and its answer never comes back
    (a reset connection, a deadline): the tier cannot tell it from a PUT that never landed."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def put(self, name: str, frame: bytes) -> None:
        await self.inner.put(name, frame)
        raise Unreachable("connection reset")

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)


async def test_a_write_whose_answer_was_lost_that_lands_late_is_never_read(
    s3: S3Endpoint,
) -> None:
    """The server may carry out such a PUT (or one of its retries) after a later write or
    remove of the key: that copy is never read, any other is."""
    t = tier_on(s3, timeout=0.3, retry_base=0.01, failure_threshold=100)
    await t.open()
    try:
        real = t.client
        t.client = AnswerLost(real)  # type: ignore[assignment]
        errors = await t.write_many([(b"k", b"OLD"), (b"r", b"OLD")])
        assert all(isinstance(e, TierUnavailableError) for e in errors)
        t.client = real
        names = [t.object_name(b"k"), t.object_name(b"r")]
        late = [await raw_get(s3, n) for n in names]
        assert await read_back(t, b"k") == b"OLD"  # nothing newer acknowledged: the newest tried
        await write_one(t, b"k", b"NEW")
        assert await remove_one(t, b"r")
        for name, frame in zip(names, late, strict=True):  # they land again, after those
            await raw_put(s3, name, frame)
        assert await read_back(t, b"k") is None and await read_back(t, b"r") is None
        assert await lookup_one(t, b"k") is MISS  # known by its ETag now: no request
        await raw_put(s3, names[0], encode_frame(b"k", b"THEIRS"))  # another engine's write
        assert await read_back(t, b"k") == b"THEIRS"
        await write_one(t, b"k", b"NEWER")
        assert await read_back(t, b"k") == b"NEWER"
    finally:
        await t.aclose()


async def test_two_writes_of_a_key_in_one_batch_send_only_the_last(tier: ObjectStoreTier) -> None:
    before = tier.requests
    items = [(b"k", b"OLD"), (b"a", b"A"), (bytearray(b"k"), b"NEW")]  # bytes-like keys too
    assert await tier.write_many(items) == [None] * 3  # type: ignore[arg-type]
    assert tier.requests - before == 2  # the PUTs of one batch run at once: either could win
    assert await read_back(tier, b"k") == b"NEW"
    assert await tier.remove_many([bytearray(b"a")]) == [True]  # type: ignore[list-item]


# -- lookups, hints, usage, removes ---------------------------------------------------------------


async def test_recent_writes_and_reads_answer_without_a_request(
    s3: S3Endpoint, tier: ObjectStoreTier
) -> None:
    assert tier.contains_hint(b"k") is None
    await write_one(tier, b"k", b"v")
    assert tier.contains_hint(b"k") is True
    sent = tier.requests
    assert await tier.lookup_many([b"k", b"k"]) == [HIT, HIT]
    assert tier.requests == sent
    assert await lookup_one(tier, b"absent") is MISS
    assert tier.requests == sent + 1  # one HEAD
    assert tier.contains_hint(b"absent") is None  # never False: the bucket is shared

    reader = tier_on(s3, recent_ttl=0.05)
    await reader.open()
    try:
        assert reader.contains_hint(b"k") is None
        await read_one(reader, b"k", buf())
        assert reader.contains_hint(b"k") is True
        deadline = time.monotonic() + 5
        while reader.contains_hint(b"k") is True:  # forgotten after recent_ttl
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        assert reader.contains_hint(b"k") is None
    finally:
        await reader.aclose()


async def test_usage_is_what_this_tier_wrote(s3: S3Endpoint, tier: ObjectStoreTier) -> None:
    await tier.write_many([(b"a", b"1" * 10), (b"b", b"2" * 20)])
    frames = len(encode_frame(b"a", b"1" * 10)) + len(encode_frame(b"b", b"2" * 20))
    usage = tier.usage()
    assert (usage.blocks, usage.bytes_used, usage.capacity_bytes) == (2, frames, None)
    await write_one(tier, b"a", b"1" * 10)  # rewriting counts once
    assert tier.usage().blocks == 2
    assert sum((await listed(s3)).values()) == frames
    assert await tier.remove_many([b"a", b"b", b"c"]) == [True, True, False]
    assert tier.usage() == type(usage)(0, 0, None)
    assert await listed(s3) == {}


async def test_a_key_removed_by_someone_else_leaves_usage_on_the_next_lookup(
    s3: S3Endpoint,
) -> None:
    t = tier_on(s3, recent_ttl=0)
    await t.open()
    try:
        await write_one(t, b"gone", b"v")
        await obstore.delete_async(s3.store(), t.object_name(b"gone"))  # type: ignore[arg-type]
        assert t.usage().blocks == 1
        assert await lookup_one(t, b"gone") is MISS
        assert t.usage().blocks == 0
    finally:
        await t.aclose()


# -- look-ahead: a lookup's GET serves the read ----------------------------------------------------


async def written(s3: S3Endpoint, items: list[tuple[bytes, bytes]]) -> None:
    writer = tier_on(s3)
    await writer.open()
    assert await writer.write_many(items) == [None] * len(items)
    await writer.aclose()


async def test_a_lookup_fetches_what_it_finds_and_the_read_uses_it(s3: S3Endpoint) -> None:
    items = [(k, k * 3000) for k in (b"a", b"b", b"c")]
    await written(s3, items)
    reader = tier_on(s3)
    await reader.open()
    try:
        assert await reader.lookup_many([b"a", b"b", b"c", b"absent"]) == [HIT] * 3 + [MISS]
        assert reader.requests == 4  # one GET each
        bufs = [buf() for _ in items]
        assert await reader.read_many_into([k for k, _ in items], bufs) == [3000] * 3
        assert [bytes(b[:3000]) for b in bufs] == [v for _, v in items]
        assert (reader.requests, reader.lookahead_reads) == (4, 3)
        # a body is handed out once: the next read GETs
        assert await reader.read_many_into([b"a"], [buf()]) == [3000]
        assert reader.requests == 5
    finally:
        await reader.aclose()


async def test_the_look_ahead_budget_bounds_what_lookups_fetch(s3: S3Endpoint) -> None:
    keys = [f"k{i}".encode() for i in range(5)]
    await written(s3, [(k, bytes(4096)) for k in keys])
    frame = HEADER.size + 2 + 4096
    reader = tier_on(s3, lookahead_bytes=2 * frame)
    await reader.open(TierSetup(block_size=4096))  # what the engine does
    try:
        assert await reader.lookup_many(keys) == [HIT] * 5  # 2 GETs, 3 HEADs
        assert await reader.read_many_into(keys, [buf() for _ in keys]) == [4096] * 5
        assert (reader.requests, reader.lookahead_reads) == (5 + 3, 2)
    finally:
        await reader.aclose()

    heads_only = tier_on(s3, lookahead_bytes=0)
    await heads_only.open()
    try:
        assert await heads_only.lookup_many(keys) == [HIT] * 5
        assert await heads_only.read_many_into(keys, [buf() for _ in keys]) == [4096] * 5
        assert (heads_only.requests, heads_only.lookahead_reads) == (10, 0)
    finally:
        await heads_only.aclose()


async def test_a_write_through_the_tier_after_a_lookup_is_what_the_read_returns(
    s3: S3Endpoint,
) -> None:
    await written(s3, [(b"k", b"old" * 100)])
    reader = tier_on(s3)
    await reader.open()
    try:
        assert await lookup_one(reader, b"k") is HIT  # fetched b"old..."
        await write_one(reader, b"k", b"new" * 100)
        assert await read_back(reader, b"k") == b"new" * 100
        assert reader.lookahead_reads == 0
    finally:
        await reader.aclose()


class HeldClient:
    """The real client, but requests of one kind (``held``: get, put or delete) wait for
    ``release``: before they reach the server, or with ``answered=True`` after the answer."""

    def __init__(self, inner: Any, held: str, *, answered: bool = False) -> None:
        self.inner, self.held, self.answered = inner, held, answered
        self.reached = asyncio.Event()
        self.release = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        request = getattr(self.inner, name)
        if name != self.held:
            return request

        async def held(*args: Any) -> Any:
            got = await request(*args) if self.answered else None
            self.reached.set()
            await self.release.wait()
            return got if self.answered else await request(*args)

        return held


async def test_a_body_fetched_across_a_write_of_its_key_is_not_kept(s3: S3Endpoint) -> None:
    await written(s3, [(b"k", b"old" * 100)])
    reader = tier_on(s3)
    slow = HeldClient(reader.client, "get", answered=True)
    reader.client = slow  # type: ignore[assignment]
    await reader.open()
    try:
        lookup = asyncio.create_task(lookup_one(reader, b"k"))
        await asyncio.wait_for(slow.reached.wait(), 10)  # the GET has the old bytes ...
        await write_one(reader, b"k", b"new" * 100)  # ... when the tier writes new ones
        slow.release.set()
        assert await lookup is HIT
        assert await read_back(reader, b"k") == b"new" * 100
        assert reader.lookahead_reads == 0
    finally:
        await reader.aclose()


@pytest.mark.parametrize("change", ["write", "remove"])
async def test_a_lookup_during_a_write_or_remove_does_not_keep_the_old_body(
    s3: S3Endpoint, change: str
) -> None:
    await written(s3, [(b"k", b"old" * 100)])
    t = tier_on(s3)
    held = HeldClient(t.client, "put" if change == "write" else "delete")
    t.client = held  # type: ignore[assignment]
    await t.open()
    try:
        mutation = asyncio.create_task(
            write_one(t, b"k", b"new" * 100) if change == "write" else remove_one(t, b"k")
        )
        await asyncio.wait_for(held.reached.wait(), 10)  # the request is under way ...
        assert await lookup_one(t, b"k") is HIT  # ... and this GET finds the old object
        held.release.set()
        await mutation
        assert await read_back(t, b"k") == (b"new" * 100 if change == "write" else None)
        assert t.lookahead_reads == 0
    finally:
        await t.aclose()


async def test_clear_deletes_every_block_under_the_prefix_and_nothing_else(
    s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("aiotier.tiers.objectstore.tier._CLEAR_PAGE", 4)  # several pages
    keys = [f"c{i}".encode() for i in range(10)]
    await written(s3, [(k, k) for k in keys])
    store = s3.store()
    await obstore.put_async(store, s3.prefix + "notes.txt", b"mine")  # type: ignore[arg-type]
    await obstore.put_async(store, s3.prefix + "sub/" + "0" * 32, b"x")  # type: ignore[arg-type]
    t = tier_on(s3)
    await t.open()
    try:
        assert await t.lookup_many(keys) == [HIT] * 10  # (bodies fetched for the look-ahead)
        await t.clear()
        assert await t.lookup_many(keys) == [MISS] * 10
        assert await t.read_many_into(keys[:2], [buf(), buf()]) == [-1, -1]
        assert sorted(await listed(s3)) == [s3.prefix + "notes.txt", s3.prefix + "sub/" + "0" * 32]
        assert t.usage().blocks == 0
    finally:
        await t.aclose()


# -- immutable keys -------------------------------------------------------------------------------


async def test_immutable_keys_skip_writes_the_bucket_already_holds(
    s3: S3Endpoint, tier: ObjectStoreTier
) -> None:
    await write_one(tier, b"doc-hash", b"first")
    writer = tier_on(s3, immutable_keys=True)
    await writer.open()
    try:
        sent = writer.requests
        assert await writer.write_many([(b"doc-hash", b"first"), (b"new", b"n")]) == [None, None]
        assert writer.skipped_writes == 1
        assert writer.requests == sent + 3  # HEAD, HEAD, PUT: no PUT of the held key
        assert writer.usage().blocks == 1  # only what it wrote itself
        await write_one(writer, b"doc-hash", b"first")  # known now: no request at all
        assert (writer.skipped_writes, writer.requests) == (2, sent + 3)
        assert await raw_get(s3, writer.object_name(b"doc-hash")) == encode_frame(
            b"doc-hash", b"first"
        )
    finally:
        await writer.aclose()


async def test_immutable_keys_rewrite_an_object_that_failed_verification(
    s3: S3Endpoint, tier: ObjectStoreTier
) -> None:
    writer = tier_on(s3, immutable_keys=True)
    await writer.open()
    try:
        await raw_put(s3, writer.object_name(b"k"), b"junk")
        with pytest.raises(BlockCorruptedError):
            await read_one(writer, b"k", buf())
        await write_one(writer, b"k", b"good")
        assert writer.skipped_writes == 0
        assert await raw_get(s3, writer.object_name(b"k")) == encode_frame(b"k", b"good")
    finally:
        await writer.aclose()


# -- the concurrency bound ------------------------------------------------------------------------


class CountingClient:
    """Wraps the tier's client and records how many requests were in it at once."""

    def __init__(self, inner: Any, delay: float = 0.0) -> None:
        self.inner = inner
        self.delay = delay
        self.now = 0
        self.most = 0

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        method = getattr(self.inner, name)

        async def counted(*args: Any) -> Any:
            self.now += 1
            self.most = max(self.most, self.now)
            try:
                await asyncio.sleep(self.delay)  # widen the window in which calls overlap
                return await method(*args)
            finally:
                self.now -= 1

        return counted


async def test_no_more_than_max_concurrency_requests_are_in_flight(s3: S3Endpoint) -> None:
    t = tier_on(s3, max_concurrency=4)
    await t.open()
    counting = CountingClient(t.client, delay=0.005)
    t.client = counting  # type: ignore[assignment]
    try:
        blocks = [(f"c{i}".encode(), bytes([i]) * 5000) for i in range(40)]
        assert await t.write_many(blocks) == [None] * 40
        assert counting.most == 4
        counting.most = 0
        fresh = tier_on(s3, max_concurrency=4)
        fresh.client = CountingClient(fresh.client, delay=0.005)  # type: ignore[assignment]
        await fresh.open()
        keys = [k for k, _ in blocks]
        assert await fresh.lookup_many(keys) == [HIT] * 40
        bufs = [buf(5000) for _ in keys]
        assert await fresh.read_many_into(keys, bufs) == [5000] * 40
        assert [bytes(b) for b in bufs] == [d for _, d in blocks]
        assert fresh.client.most == 4  # type: ignore[attr-defined]
        assert fresh.max_inflight == 4
        await fresh.aclose()
    finally:
        await t.aclose()


# -- failures: refused, down, busy ----------------------------------------------------------------


async def test_open_refuses_a_missing_bucket_and_wrong_credentials(
    s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match="bucket does not exist"):
        await ObjectStoreTier("no-such-bucket", endpoint_url=s3.url).open()
    use_credentials(monkeypatch, "nobody", "wrong")
    with pytest.raises(ConfigError, match="403"):
        await tier_on(s3).open()


async def test_a_read_only_identity_reads_and_its_writes_fail_without_retries(
    s3: S3Endpoint, tier: ObjectStoreTier, monkeypatch: pytest.MonkeyPatch
) -> None:
    await write_one(tier, b"shared", b"bytes")
    use_credentials(monkeypatch, READER_KEY, READER_SECRET)
    reader = tier_on(s3)
    await reader.open()
    try:
        b = buf()
        assert await read_one(reader, b"shared", b) == 5
        (failure,) = await reader.write_many([(b"mine", b"x")])
        assert isinstance(failure, TieringError)
        assert "403" in str(failure)
        assert reader.retries == 0 and reader.available  # refused is not an outage
    finally:
        await reader.aclose()


async def test_no_server_is_a_quick_unavailable_tier_not_an_error_at_open() -> None:
    from aiotier_bench.servers import free_ports

    (port,) = free_ports(1)
    t = ObjectStoreTier(
        "b", endpoint_url=f"http://127.0.0.1:{port}", timeout=1.0, probe_interval=0.05
    )
    await t.open()  # logs, opens the circuit
    try:
        assert not t.available
        started = time.monotonic()
        with pytest.raises(TierUnavailableError, match="circuit open"):
            await lookup_one(t, b"k")
        assert await t.write_many([(b"k", b"v")]) != [None]
        assert time.monotonic() - started < 0.5
        assert t.errors >= 3
    finally:
        await t.aclose()


class ScriptedClient:
    """A client whose answers are scripted per call: exceptions are raised, values returned."""

    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)
        self.calls = 0

    async def _next(self, *_args: object) -> object:
        self.calls += 1
        answer = self.answers.pop(0) if self.answers else self.answers_default
        if isinstance(answer, Exception):
            raise answer
        return answer

    answers_default: object = '"etag"'
    head = get = put = delete = probe = _next


async def test_busy_answers_are_retried_with_jittered_backoff_within_the_deadline() -> None:
    # lookups HEAD (no look-ahead): the scripted answers are HEAD's
    t = ObjectStoreTier("b", endpoint_url="http://127.0.0.1:1", retry_base=0.001, lookahead_bytes=0)
    scripted = ScriptedClient(ServerBusy("503 Slow Down", 503), ServerBusy("429", 429), '"e"')
    t.client = scripted  # type: ignore[assignment]
    assert await lookup_one(t, b"k") is HIT
    assert (scripted.calls, t.retries, t.errors) == (3, 2, 0)

    t = ObjectStoreTier(
        "b", endpoint_url="http://127.0.0.1:1", timeout=0.3, retry_base=0.01, lookahead_bytes=0
    )
    always = ScriptedClient()
    always.answers_default = ServerBusy("500 Internal Server Error", 500)
    t.client = always  # type: ignore[assignment]
    started = time.monotonic()
    with pytest.raises(TierUnavailableError, match="500"):
        await lookup_one(t, b"k")
    assert time.monotonic() - started < 0.3 + 0.1  # gave up before the deadline
    assert always.calls > 2 and t.retries == always.calls - 1
    assert t.available  # an answering server is not an outage


async def test_a_hung_request_ends_at_the_deadline_and_counts_for_the_breaker() -> None:
    class Hung(ScriptedClient):
        async def head(self, *_args: object) -> object:
            await asyncio.sleep(3600)
            return None

    t = ObjectStoreTier(
        "b", endpoint_url="http://127.0.0.1:1", timeout=0.1, failure_threshold=2, lookahead_bytes=0
    )
    t.client = Hung()  # type: ignore[assignment]
    for _ in range(2):
        with pytest.raises(TierUnavailableError, match=r"timed out after 0\.1s"):
            await lookup_one(t, b"k")
    assert not t.available
    await t.aclose()


def test_obstore_failures_are_sorted_by_what_another_try_can_change() -> None:
    def generic(text: str) -> Exception:
        return obstore.exceptions.GenericError(text)

    assert classify(FileNotFoundError("Object at location x not found")) is None
    assert isinstance(
        classify(generic("Server returned non-2xx status code: 503 Service Unavailable")),
        ServerBusy,
    )
    assert isinstance(classify(generic("status code: 429 Too Many Requests")), ServerBusy)
    assert isinstance(classify(generic("status code: 400 Bad Request")), Refused)
    assert isinstance(classify(generic("HTTP error: error sending request")), Unreachable)
    assert isinstance(classify(obstore.exceptions.PermissionDeniedError("no")), Refused)


async def test_without_obstore_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "obstore", None)
    with pytest.raises(ImportError, match=r"aiotier\[s3\]"):
        ObjectStoreTier("bucket")


# -- construction from a URL and from configuration -----------------------------------------------


def test_from_url_names_bucket_prefix_and_endpoint() -> None:
    aws = ObjectStoreTier.from_url("s3://kv-cache/llama3/kv-v1")
    assert (aws.bucket, aws.prefix, aws.endpoint_url) == ("kv-cache", "llama3/kv-v1/", None)
    local = ObjectStoreTier.from_url("http://127.0.0.1:8333/kv-cache/", timeout=1.0)
    assert (local.bucket, local.prefix, local.endpoint_url) == (
        "kv-cache", "aiotier/", "http://127.0.0.1:8333",
    )  # fmt: skip
    assert local.timeout == 1.0
    with pytest.raises(ConfigError, match="s3://BUCKET"):
        ObjectStoreTier.from_url("ftp://host/bucket")


def test_config_builds_an_object_tier() -> None:
    from aiotier.config import config_from_env, engine_from_config

    env = {
        "AIOTIER_PRIMARY_NUM_BLOCKS": "8",
        "AIOTIER_PRIMARY_BLOCK_SIZE": "4096",
        "AIOTIER_TIERS_0_TYPE": "s3",
        "AIOTIER_TIERS_0_BUCKET": "kv-cache",
        "AIOTIER_TIERS_0_PREFIX": "model-a/",
        "AIOTIER_TIERS_0_ENDPOINT_URL": "http://127.0.0.1:8333",
        "AIOTIER_TIERS_0_IMMUTABLE_KEYS": "true",
        "AIOTIER_TIERS_0_MAX_CONCURRENCY": "8",
    }
    (tier,) = engine_from_config(config_from_env(env)).tiers
    assert isinstance(tier, ObjectStoreTier)
    assert (tier.bucket, tier.prefix, tier.endpoint_url) == (
        "kv-cache", "model-a/", "http://127.0.0.1:8333",
    )  # fmt: skip
    assert tier.immutable_keys and tier.max_concurrency == 8
    with pytest.raises(ConfigError, match=r"tiers\[0\]\.secret"):
        engine_from_config(
            {"primary": {"num_blocks": 1, "block_size": 64},
             "tiers": [{"type": "s3", "bucket": "b", "secret": "no credentials in config"}]}
        )  # fmt: skip
