"""A huge object planted under a block's name is never downloaded: its size comes with the
response's headers, and a GET announcing more than a block is dropped before its body.

Memory is measured in a child process (its peak RSS before and after, with nothing else
running in it): obstore's buffers live outside Python's allocator.
"""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap

import obstore
import pytest
from seaweedfs_fixtures import ACCESS_KEY, SECRET_KEY, S3Endpoint, use_credentials

from aiotier import ObjectStoreTier

pytestmark = pytest.mark.s3

MiB = 1 << 20

_CHILD = textwrap.dedent(
    """
    import asyncio, json, os, resource, sys
    from aiotier import ObjectStoreTier, TierSetup

    async def main(url, bucket, prefix, block_size):
        tier = ObjectStoreTier(bucket, endpoint_url=url, prefix=prefix)
        await tier.open(TierSetup(block_size=block_size or None))
        try:
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            looked = await tier.lookup_many([b"k"])
            got = await tier.read_many_into([b"k"], [memoryview(bytearray(256 * 1024))])
            grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        finally:
            await tier.aclose()
        print(json.dumps({"lookup": looked[0].name, "read": type(got[0]).__name__,
                          "message": str(got[0]), "corrupted": tier.corrupted,
                          "grown_mib": grown / 1024}))

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
    sys.stdout.flush()
    os._exit(0)  # not through interpreter teardown, where obstore's runtime now and then aborts
    """
)


@pytest.fixture(autouse=True)
def credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    use_credentials(monkeypatch, ACCESS_KEY, SECRET_KEY)


@pytest.mark.parametrize(
    ("block_size", "lookup", "read"),
    [(256 * 1024, "MISS", "BlockCorruptedError"), (0, "HIT", "ValueError")],
)
async def test_a_96_mib_object_under_a_block_name_is_not_downloaded(
    s3: S3Endpoint, block_size: int, lookup: str, read: str
) -> None:
    """With the engine's block size known the object is no block of it: a MISS, refused by
    its ETag; a tier used alone answers its lookup as a HEAD would, and the read refuses it."""
    name = ObjectStoreTier(s3.bucket, prefix=s3.prefix).object_name(b"k")
    await obstore.put_async(s3.store(), name, bytes(96 * MiB))  # type: ignore[arg-type]
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CHILD, s3.url, s3.bucket, s3.prefix, str(block_size),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(120):
        stdout, stderr = await child.communicate()
    assert child.returncode == 0, stderr.decode()
    seen = json.loads(stdout)
    assert (seen["lookup"], seen["read"]) == (lookup, read), seen
    assert "not read" in seen["message"]
    assert seen["corrupted"] == (2 if block_size else 0)  # the lookup, then the read
    assert seen["grown_mib"] < 24, f"peak RSS grew {seen['grown_mib']:.0f} MiB: it was read"
