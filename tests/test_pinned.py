"""Pinned host memory within the process's budget (:mod:`yolo_fastdetect.pinned`): the host copies of frames
converted on the GPU are pinned while the pinned memory in use stays under ``PINNED_BUDGET_BYTES``, and pageable past
it, where it cannot be read, or where no pinned memory can be had. The allocator is stood in for, so that this runs
without a GPU; the CUDA tests of the video readers allocate for real."""

from __future__ import annotations

import pytest
import torch

from yolo_fastdetect import pinned

SHAPE = (2, 9, 7, 3)  # 378 bytes


@pytest.fixture
def allocator(monkeypatch):
    """Pinned memory in use as ``state["active"]`` says (a RuntimeError where it is None: no CUDA); what
    ``pinned_empty`` made is noted, and it raises where ``state["exhausted"]``."""
    state = {"active": 0, "exhausted": False, "pinned": []}

    def host_memory_stats():
        if state["active"] is None:
            raise RuntimeError("no CUDA")
        return {"active_bytes.current": state["active"]}

    def pinned_empty(shape, dtype):
        if state["exhausted"]:
            raise RuntimeError("cudaHostAlloc failed")
        made = torch.empty(shape, dtype=dtype)
        state["pinned"].append(made)
        return made

    monkeypatch.setattr(torch.cuda, "host_memory_stats", host_memory_stats)
    monkeypatch.setattr(pinned, "pinned_empty", pinned_empty)
    monkeypatch.setattr(pinned, "PINNED_BUDGET_BYTES", 1000)
    return state


@pytest.mark.parametrize(("active", "exhausted", "is_pinned"), [
    (0, False, True), (1000 - 378, False, True),  # within the budget, to the byte
    (1000 - 377, False, False),  # one byte over it
    (None, False, False),  # the pinned memory in use cannot be read
    (0, True, False),  # no pinned memory to be had
])
def test_host_copy_buffer_is_pinned_within_the_budget_only(allocator, active, exhausted, is_pinned):
    allocator["active"], allocator["exhausted"] = active, exhausted
    buffer = pinned.host_copy_buffer(SHAPE)
    assert buffer.shape == SHAPE and buffer.dtype == torch.uint8 and buffer.device.type == "cpu"
    assert any(buffer is made for made in allocator["pinned"]) == is_pinned
    assert pinned.within_pinned_budget(378) == (active is not None and active + 378 <= 1000)


def test_a_frame_array_is_pinned_within_the_budget_only(allocator):
    allocator["active"] = 1000 - 378
    assert pinned.pinned_array(SHAPE).shape == SHAPE
    allocator["active"] += 1
    assert pinned.pinned_array(SHAPE) is None  # the reader then retrieves as stock does
