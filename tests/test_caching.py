"""``aiotier.cached``: an async function's results through ``get_or_load``, keyed by their
arguments, values that are not bytes through a codec (never pickle)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from aiotier import BYTES, JSON, TEXT, Codec, PrimaryTier, TieringEngine, cached


async def test_equal_arguments_run_the_function_once_even_concurrently() -> None:
    calls: list[tuple[Any, ...]] = []
    async with TieringEngine(PrimaryTier(16, 256)) as e:

        @cached(e, codec=JSON)
        async def square(x: int, *, label: str = "") -> dict[str, Any]:
            calls.append((x, label))
            await asyncio.sleep(0.01)
            return {"x": x, "square": x * x, "label": label}

        results = await asyncio.gather(*(square(3) for _ in range(100)))
        assert results == [{"x": 3, "square": 9, "label": ""}] * 100
        assert await square(3, label="a") == {"x": 3, "square": 9, "label": "a"}
        assert await square(4) == {"x": 4, "square": 16, "label": ""}
        assert await square(3) == {"x": 3, "square": 9, "label": ""}
        assert calls == [(3, ""), (3, "a"), (4, "")]
        assert square.__name__ == "square"  # functools.wraps


async def test_keys_name_the_function_and_a_custom_key_is_used_as_given() -> None:
    async with TieringEngine(PrimaryTier(16, 256)) as e:

        @cached(e, key=lambda user: f"avatar:{user}")
        async def avatar(user: str) -> bytes:
            return user.encode() * 2

        @cached(e, codec=TEXT)
        async def greet(user: str) -> str:
            return f"hello {user}"

        assert await avatar("ann") == b"annann"
        assert await e.get("avatar:ann") == b"annann"
        assert await greet("ann") == "hello ann"
        # two functions with equal arguments never share an entry
        assert await greet("ann") == "hello ann"


async def test_failures_are_not_cached() -> None:
    attempts = 0
    async with TieringEngine(PrimaryTier(16, 256)) as e:

        @cached(e)
        async def flaky() -> bytes:
            nonlocal attempts
            attempts += 1
            if attempts == 1:
                raise ConnectionError("first try fails")
            return b"ok"

        with pytest.raises(ConnectionError):
            await flaky()
        assert await flaky() == b"ok"
        assert await flaky() == b"ok"
        assert attempts == 2


async def test_values_and_arguments_that_need_a_choice_get_errors_saying_what_to_do() -> None:
    async with TieringEngine(PrimaryTier(16, 256)) as e:

        @cached(e)
        async def gives_dict() -> dict[str, int]:
            return {"a": 1}

        @cached(e)
        async def takes_object(o: object) -> bytes:
            return b"x"

        with pytest.raises(TypeError, match=r"returned dict, not bytes-like: pass a codec"):
            await gives_dict()
        with pytest.raises(TypeError, match=r"not JSON values.*key="):
            await takes_object(object())


def test_codecs_round_trip_and_a_custom_codec_is_a_plain_pair_of_functions() -> None:
    assert BYTES.decode(BYTES.encode(bytearray(b"ab"))) == b"ab"
    assert TEXT.decode(TEXT.encode("žluťoučký")) == "žluťoučký"
    doc = {"k": [1, 2.5, None, True, "ü"]}
    assert JSON.decode(JSON.encode(doc)) == doc
    ints: Codec[int] = Codec("int", lambda v: v.to_bytes(8, "big"), lambda b: int.from_bytes(b))
    assert ints.decode(ints.encode(2**40)) == 2**40
