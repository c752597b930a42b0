"""``ArenaWorker``: vLLM's ``OffloadingWorker`` over aiotier's primary arena in shared memory.

vLLM runs it in each worker process. A job names GPU blocks (``GPULoadStoreSpec``: block ids,
grouped per KV-cache group, each group starting at a block index of its request) and primary
slots (the manager's spec: ``block_ids`` are slot ids, the only part that crosses processes).
One slot is one offloaded chunk of ``blocks_per_chunk`` GPU blocks; within it each worker owns
``chunk_bytes`` at ``offset`` (its rank's part), laid out tensor by tensor, each tensor's
``blocks_per_chunk`` pages in order. A group whose first block index is not a multiple of
``blocks_per_chunk`` starts inside its first chunk, as in vLLM's own CPU worker.

Copies are synchronous (``submit_*`` returns when the bytes are there) and batched per tensor
with one gather or scatter; their sizes and times go back to vLLM through ``get_finished``, so
``vllm:kv_offload_{load,store}_{bytes,time}`` count them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from vllm.v1.kv_offload import base as vllm_base

from aiotier.shared_arena import SharedArena, segment_name

__all__ = ["ArenaWorker"]


class ArenaWorker(vllm_base.OffloadingWorker):
    """Copies between this worker's KV-cache tensors and its part of the arena's slots.

    The arena is mapped at the first transfer, by the name :func:`segment_name` gives for
    ``arena_stem`` and the geometry: vLLM builds workers before the scheduler's manager, which
    creates the segment, and schedules no transfer before that.
    """

    def __init__(
        self,
        kv_caches: Any,
        *,
        arena_stem: str,
        num_blocks: int,
        block_size: int,
        blocks_per_chunk: int,
        offset: int,
        chunk_bytes: int,
    ) -> None:
        self._gpu = [
            t.tensor.view(torch.int8).view(-1, t.page_size_bytes) for t in kv_caches.tensors
        ]
        pages = [int(g.shape[1]) for g in self._gpu]
        if sum(pages) * blocks_per_chunk != chunk_bytes:
            raise ValueError(
                f"this worker's KV tensors hold {sum(pages)} bytes per block, "
                f"{sum(pages) * blocks_per_chunk} per chunk of {blocks_per_chunk} blocks; the "
                f"scheduler sized {chunk_bytes}: the two sides disagree on vLLM's KV layout"
            )
        #: per KV-cache group: the tensors its layers live in
        self._group_tensors = [
            sorted({ref.tensor_idx for ref in refs}) for refs in kv_caches.group_data_refs
        ]
        self._pages = pages
        self._starts = [offset + sum(pages[:i]) * blocks_per_chunk for i in range(len(pages))]
        self.name = segment_name(arena_stem, num_blocks, block_size)
        self.num_blocks, self.block_size = num_blocks, block_size
        self.blocks_per_chunk = blocks_per_chunk
        self._arena: SharedArena | None = None
        self._chunks: list[torch.Tensor] = []  # per tensor: (slots, blocks_per_chunk, page)
        self._finished: list[Any] = []

    # -- the arena -------------------------------------------------------------------------------

    def _views(self) -> list[torch.Tensor]:
        if self._arena is None:
            try:
                arena = SharedArena(self.name, self.num_blocks, self.block_size)
            except FileNotFoundError:
                raise RuntimeError(
                    f"aiotier's shared arena {self.name!r} does not exist: vLLM's scheduler "
                    "has not made its manager, or has exited"
                ) from None
            whole = torch.frombuffer(arena.slots(), dtype=torch.int8)
            rows = whole.view(self.num_blocks, self.block_size)
            self._chunks = [
                rows[:, start : start + page * self.blocks_per_chunk].unflatten(
                    1, (self.blocks_per_chunk, page)
                )
                for start, page in zip(self._starts, self._pages, strict=True)
            ]
            self._arena = arena
        return self._chunks

    # -- jobs --------------------------------------------------------------------------------------

    def _plan(
        self, gpu_spec: Any, slot_ids: Sequence[int]
    ) -> list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Per group: (group, GPU block ids, slot ids, block positions within the slot)."""
        gpu_ids = np.asarray(gpu_spec.block_ids, dtype=np.int64)
        slots = np.asarray(slot_ids, dtype=np.int64)
        if slots.size and (slots.min() < 0 or slots.max() >= self.num_blocks):
            raise ValueError(f"slot ids out of 0..{self.num_blocks - 1}: {slots.tolist()}")
        sizes = gpu_spec.group_sizes
        indices = gpu_spec.block_indices
        if len(sizes) != len(self._group_tensors):
            raise ValueError(
                f"a job for {len(sizes)} KV-cache groups; this worker has "
                f"{len(self._group_tensors)}"
            )
        plan = []
        gpu_at = slot_at = 0
        for group, (size, first) in enumerate(zip(sizes, indices, strict=True)):
            if size == 0:
                continue
            skip = int(first) % self.blocks_per_chunk
            position = np.arange(skip, skip + size)
            n_slots = -(-(skip + size) // self.blocks_per_chunk)
            group_slots = slots[slot_at : slot_at + n_slots]
            if len(group_slots) != n_slots:
                raise ValueError(
                    f"group {group}: {size} GPU blocks from block {first} need {n_slots} "
                    f"slots, the job has {len(group_slots)}"
                )
            plan.append((
                group,
                torch.from_numpy(gpu_ids[gpu_at : gpu_at + size]),
                torch.from_numpy(group_slots[position // self.blocks_per_chunk]),
                torch.from_numpy(position % self.blocks_per_chunk),
            ))  # fmt: skip
            gpu_at += size
            slot_at += n_slots
        if gpu_at != len(gpu_ids) or slot_at != len(slots):
            raise ValueError(
                f"a job of {len(gpu_ids)} GPU blocks and {len(slots)} slots; its groups "
                f"cover {gpu_at} and {slot_at}"
            )
        return plan

    def _transfer(self, job_id: int, gpu_spec: Any, slot_spec: Any, store: bool) -> bool:
        started = time.perf_counter()
        chunks = self._views()
        nbytes = 0
        for group, gpu_ids, slots, within in self._plan(gpu_spec, slot_spec.block_ids):
            for t in self._group_tensors[group]:
                gpu, arena = self._gpu[t], chunks[t]
                if store:
                    arena[slots, within] = gpu[gpu_ids.to(gpu.device)].to("cpu")
                else:
                    gpu[gpu_ids.to(gpu.device)] = arena[slots, within].to(gpu.device)
                nbytes += len(gpu_ids) * self._pages[t]
        self._finished.append(
            vllm_base.TransferResult(
                job_id=job_id,
                success=True,
                transfer_size=nbytes,
                transfer_time=time.perf_counter() - started,
            )
        )
        return True

    def submit_store(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
        """GPU blocks to arena slots."""
        return self._transfer(job_id, src_spec, dst_spec, store=True)

    def submit_load(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
        """Arena slots to GPU blocks."""
        return self._transfer(job_id, dst_spec, src_spec, store=False)

    def get_finished(self) -> list[Any]:
        done, self._finished = self._finished, []
        return done

    def wait(self, job_ids: set[int]) -> None:
        """Nothing to wait for: every job finished in its ``submit_*``."""

    def shutdown(self) -> None:
        """Unmap the arena (the scheduler removes it)."""
        self._chunks = []
        if self._arena is not None:
            arena, self._arena = self._arena, None
            with contextlib.suppress(BufferError):  # a tensor still views it: unmapped with it
                arena.close()
