"""Pinned host memory within the process's budget (:mod:`yolo_fastdetect.pinned`): the host copies of frames
converted on the GPU are pinned while the pinned frames held stay under ``PINNED_BUDGET_BYTES``, counted from their
allocation to their garbage collection, and pageable past it, without CUDA, or where no pinned memory can be had. The
allocator is stood in for, so that this runs without a GPU; the CUDA tests of the video readers allocate for real."""

from __future__ import annotations

import gc

import pytest
import torch

from yolo_fastdetect import pinned

SHAPE = (2, 9, 7, 3)  # 378 bytes


@pytest.fixture
def allocator(monkeypatch):
    """CUDA present as ``state["cuda"]`` says; what ``pinned_empty`` made is noted, and it raises where
    ``state["exhausted"]``; the budget 1000 bytes, none of it held."""
    state = {"cuda": True, "exhausted": False, "pinned": []}

    def pinned_empty(shape, dtype):
        if state["exhausted"]:
            raise RuntimeError("cudaHostAlloc failed")
        made = torch.empty(shape, dtype=dtype)
        state["pinned"].append(made)
        return made

    monkeypatch.setattr(torch.cuda, "is_available", lambda: state["cuda"])
    monkeypatch.setattr(pinned, "pinned_empty", pinned_empty)
    monkeypatch.setattr(pinned, "PINNED_BUDGET_BYTES", 1000)
    monkeypatch.setattr(pinned, "_held_bytes", 0)
    return state


@pytest.mark.parametrize(("held", "cuda", "exhausted", "is_pinned"), [
    (0, True, False, True), (1000 - 378, True, False, True),  # within the budget, to the byte
    (1000 - 377, True, False, False),  # one byte over it
    (0, False, False, False),  # no CUDA
    (0, True, True, False),  # no pinned memory to be had
])
def test_host_copy_buffer_is_pinned_within_the_budget_only(allocator, monkeypatch, held, cuda, exhausted, is_pinned):
    allocator["cuda"], allocator["exhausted"] = cuda, exhausted
    monkeypatch.setattr(pinned, "_held_bytes", held)
    buffer = pinned.host_copy_buffer(SHAPE)
    assert buffer.shape == SHAPE and buffer.dtype == torch.uint8 and buffer.device.type == "cpu"
    assert any(buffer.data_ptr() == made.data_ptr() for made in allocator["pinned"]) == is_pinned
    assert pinned.pinned_bytes_held() == held + (378 if is_pinned else 0)


def test_frames_are_counted_until_they_are_collected(allocator):
    """Each pinned frame counts from its allocation to its garbage collection, through the numpy views that keep it
    alive; a frame refused or made pageable counts nothing."""
    frames = [pinned.pinned_array(SHAPE), pinned.host_copy_buffer(SHAPE)]
    assert pinned.pinned_bytes_held() == 2 * 378
    views = [frames[0][1:], frames[1].numpy()[0]]
    allocator["pinned"].clear()
    del frames
    gc.collect()
    assert pinned.pinned_bytes_held() == 2 * 378  # the views hold their frames
    del views
    gc.collect()
    assert pinned.pinned_bytes_held() == 0


def test_a_frame_array_is_pinned_within_the_budget_only(allocator, monkeypatch):
    monkeypatch.setattr(pinned, "_held_bytes", 1000 - 378)
    held = pinned.pinned_array(SHAPE)
    assert held.shape == SHAPE
    assert pinned.pinned_array(SHAPE) is None  # the reader then retrieves as stock does
    del held
    gc.collect()
    allocator["exhausted"] = True
    monkeypatch.setattr(pinned, "_held_bytes", 0)
    assert pinned.pinned_array(SHAPE) is None
    assert pinned.pinned_bytes_held() == 0
