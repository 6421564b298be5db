"""GraphCache: its policy (first call eager, second captured, then replayed; LRU; fallbacks) with a fake capture on
any machine, and real CUDA-graph capture and replay where a GPU is present."""

from __future__ import annotations

import gc
import weakref
from collections import namedtuple

import pytest
import torch
from torch import nn

from yolo_fastdetect import graphs
from yolo_fastdetect.config import ConfigError
from yolo_fastdetect.graphs import GraphCache, capture_cuda_graph


class FakeCapture:
    """A capture function that records what it captured; its replay returns ``("replay", key, x)``."""

    def __init__(self, fail: bool = False):
        self.captured: list[tuple] = []
        self.fail = fail

    def __call__(self, fn, example):
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        key = (tuple(example.shape), example.dtype)
        self.captured.append(key)
        return lambda x: ("replay", key, x)


def eager(x):
    return ("eager", x)


def run(cache: GraphCache, x: torch.Tensor, owner: nn.Module, variant=()) -> str:
    """'eager' or 'replay': how the cache answered."""
    return cache(eager, x, owner, variant)[0]


def test_first_call_eager_second_captured_then_replayed():
    capture, owner = FakeCapture(), nn.Linear(2, 2)
    cache = GraphCache(max_size=4, capture=capture)
    x = torch.zeros(1, 3, 8, 8)
    assert run(cache, x, owner) == "eager"
    assert capture.captured == [] and len(cache) == 0
    assert run(cache, x, owner) == "replay"  # the capturing call answers from the graph
    assert capture.captured == [((1, 3, 8, 8), torch.float32)] and len(cache) == 1
    for _ in range(3):
        assert run(cache, x, owner) == "replay"
    assert len(capture.captured) == 1


def test_keys_separate_shape_dtype_layout_owner_and_variant():
    capture, owner, other = FakeCapture(), nn.Linear(2, 2), nn.Linear(2, 2)
    cache = GraphCache(max_size=16, capture=capture)
    x = torch.zeros(2, 3, 8, 8)
    variants = [
        (x, owner, ()),
        (torch.zeros(2, 3, 8, 16), owner, ()),
        (x.half(), owner, ()),
        (x.contiguous(memory_format=torch.channels_last), owner, ()),
        (x, other, ()),
        (x, owner, (300, False)),
    ]
    for tensor, module, variant in variants:
        assert run(cache, tensor, module, variant) == "eager"  # each is a new key
    for tensor, module, variant in variants:
        assert run(cache, tensor, module, variant) == "replay"
    assert len(cache) == len(variants)
    with torch.inference_mode():  # inference mode is part of the key too
        assert run(cache, x, owner) == "eager"
    allow_tf32 = torch.backends.cudnn.allow_tf32
    try:  # and the TF32 switch: a replay would keep the kernels of its capture
        torch.backends.cudnn.allow_tf32 = not allow_tf32
        assert run(cache, x, owner) == "eager"
    finally:
        torch.backends.cudnn.allow_tf32 = allow_tf32


def test_lru_evicts_least_recently_used():
    capture, owner = FakeCapture(), nn.Linear(2, 2)
    cache = GraphCache(max_size=2, capture=capture)
    a, b, c = (torch.zeros(1, 3, size, size) for size in (8, 16, 32))
    for x in (a, a, b, b):
        run(cache, x, owner)
    assert run(cache, a, owner) == "replay"  # a is now more recent than b
    run(cache, c, owner)
    assert run(cache, c, owner) == "replay"  # captured: b, the least recently used, is dropped
    assert len(cache) == 2
    assert run(cache, a, owner) == "replay"
    assert len(capture.captured) == 3
    assert run(cache, b, owner) == "replay"  # b was captured before: captured again at once, dropping c
    assert len(capture.captured) == 4 and len(cache) == 2


def test_thrashing_key_runs_eager_for_good():
    capture, owner = FakeCapture(), nn.Linear(2, 2)
    cache = GraphCache(max_size=1, capture=capture)
    a, b = torch.zeros(1, 1, 4, 4), torch.zeros(1, 1, 8, 8)
    answers = [run(cache, x, owner) for x in (a, b) * 6]
    # Each key is captured at most graphs.MAX_CAPTURES times; then a runs eagerly and b keeps the one graph.
    assert len(capture.captured) == 2 * graphs.MAX_CAPTURES
    assert answers[-4:] == ["eager", "replay", "eager", "replay"]


def test_failed_capture_runs_eager_and_is_not_retried():
    capture, owner = FakeCapture(fail=True), nn.Linear(2, 2)
    cache = GraphCache(max_size=4, capture=capture)
    x = torch.zeros(1, 3, 8, 8)
    assert [run(cache, x, owner) for _ in range(4)] == ["eager"] * 4
    capture.fail = False
    assert run(cache, x, owner) == "eager" and capture.captured == [] and len(cache) == 0


def test_hooks_run_eager_while_present():
    capture, owner = FakeCapture(), nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    cache = GraphCache(max_size=4, capture=capture)
    x = torch.zeros(1, 2)
    run(cache, x, owner)
    assert run(cache, x, owner) == "replay"
    handle = owner[0].register_forward_pre_hook(lambda module, args: None)
    assert run(cache, x, owner) == "eager"  # a replay would skip the hook
    handle.remove()
    assert run(cache, x, owner) == "replay"
    y = torch.zeros(3, 2)
    handle = owner[1].register_forward_hook(lambda module, args, output: None)
    assert [run(cache, y, owner) for _ in range(3)] == ["eager"] * 3  # never captured with a hook on
    handle.remove()
    global_handle = nn.modules.module.register_module_forward_hook(lambda module, args, output: None)
    try:
        assert run(cache, x, owner) == "eager"
    finally:
        global_handle.remove()
    assert len(capture.captured) == 1


def test_reallocated_parameters_drop_the_graphs():
    capture, owner = FakeCapture(), nn.Linear(2, 2)
    cache = GraphCache(max_size=4, capture=capture)
    x = torch.zeros(1, 2)
    run(cache, x, owner)
    run(cache, x, owner)
    assert len(cache) == 1
    with torch.no_grad():
        owner.weight.add_(1)  # updated in place: the graph reads the new values, nothing to drop
    assert run(cache, x, owner) == "replay"
    owner.double()  # new storage: graphs captured on the old parameters are dropped and the key starts over
    assert run(cache, x, owner) == "eager"
    assert len(cache) == 0
    assert run(cache, x, owner) == "replay" and len(capture.captured) == 2


def test_collected_owner_drops_its_graphs():
    capture = FakeCapture()
    cache = GraphCache(max_size=4, capture=capture)
    owner, survivor = nn.Linear(2, 2), nn.Linear(2, 2)
    x = torch.zeros(1, 2)
    for module in (owner, owner, survivor, survivor):
        run(cache, x, module)
    assert len(cache) == 2
    reference = weakref.ref(owner)
    del owner
    gc.collect()
    assert reference() is None  # the cache does not keep a model alive
    run(cache, x, survivor)
    assert len(cache) == 1


def test_graph_keeps_replaced_tensor_attributes_alive():
    """Detect replaces its anchors on an eager call of another shape; a graph captured earlier still reads the
    old tensor's memory, so the cache keeps it alive as long as the graph."""
    capture, owner = FakeCapture(), nn.Linear(2, 2)
    owner.anchors = torch.zeros(4)
    cache = GraphCache(max_size=4, capture=capture)
    x = torch.zeros(1, 2)
    run(cache, x, owner)
    run(cache, x, owner)
    captured_anchors = weakref.ref(owner.anchors)
    owner.anchors = torch.ones(4)
    gc.collect()
    assert captured_anchors() is not None
    cache.clear()
    gc.collect()
    assert captured_anchors() is None


def test_size_from_environment(monkeypatch):
    capture, owner = FakeCapture(), nn.Linear(2, 2)
    cache = GraphCache(capture=capture)
    a, b = torch.zeros(1, 1, 4, 4), torch.zeros(1, 1, 8, 8)
    monkeypatch.setenv(graphs.CACHE_SIZE_VARIABLE, "1")
    for x in (a, a, b, b):
        run(cache, x, owner)
    assert len(cache) == 1
    monkeypatch.setenv(graphs.CACHE_SIZE_VARIABLE, "0")
    assert run(cache, b, owner) == "eager" and len(cache) == 0  # a smaller size applies at once
    for value in ("many", "-1"):
        monkeypatch.setenv(graphs.CACHE_SIZE_VARIABLE, value)
        with pytest.raises(ConfigError, match=f"{graphs.CACHE_SIZE_VARIABLE}='{value}' is not"):
            cache.capacity()
    monkeypatch.delenv(graphs.CACHE_SIZE_VARIABLE)
    assert cache.capacity() == graphs.DEFAULT_CACHE_SIZE == 8


def test_replayed_outputs_come_in_new_containers():
    Pair = namedtuple("Pair", "first second")
    a, b, c = torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)
    output = [a, (b, {"c": c, "list": [a]}), Pair(b, c)]
    copy = graphs._new_containers(output)
    assert copy is not output and copy[1] is not output[1] and copy[1][1] is not output[1][1]
    assert copy[0] is a and copy[1][0] is b and copy[1][1]["c"] is c and copy[1][1]["list"][0] is a
    assert type(copy[2]) is Pair and copy[2].first is b and copy[2].second is c


# CUDA ------------------------------------------------------------------------------------------------------------


def small_network() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.SiLU(), nn.Conv2d(8, 4, 3, stride=2)).cuda().eval()


@pytest.mark.cuda
def test_capture_replays_like_eager():
    network = small_network()

    def forward(x):
        y = network(x)
        return {"y": y, "parts": [y.sum(1), y.amax((2, 3))]}

    with torch.inference_mode():
        first, second = torch.rand(2, 3, 32, 32, device="cuda"), torch.rand(2, 3, 32, 32, device="cuda")
        replay = capture_cuda_graph(forward, first)
        for x in (first, second, first):
            replayed, expected = replay(x), forward(x)
            for ours, theirs in zip((replayed["y"], *replayed["parts"]), (expected["y"], *expected["parts"])):
                assert torch.equal(ours, theirs)


@pytest.mark.cuda
def test_uncapturable_call_falls_back_and_leaves_cuda_usable():
    network = small_network()

    def synchronising(x):
        y = network(x)
        return y * float(y.sum())  # a host sync: illegal inside a capture

    cache = GraphCache(max_size=4)
    x = torch.rand(1, 3, 32, 32, device="cuda")
    with torch.inference_mode():
        expected = synchronising(x)
        for _ in range(3):
            torch.testing.assert_close(cache(synchronising, x, network), expected)
        assert len(cache) == 0
        torch.cuda.empty_cache()  # the allocator does not think a capture is still underway
        assert torch.cuda.current_stream() == torch.cuda.default_stream()
        other = torch.rand(2, 3, 32, 32, device="cuda")  # another key: a capturable call still captures
        for _ in range(3):
            assert torch.equal(cache(network, other, network), network(other))
        assert len(cache) == 1


@pytest.mark.cuda
def test_eviction_frees_graph_memory():
    network = small_network()
    cache = GraphCache(max_size=1)
    big = torch.rand(8, 3, 512, 512, device="cuda")
    small = torch.rand(1, 3, 64, 64, device="cuda")
    with torch.inference_mode():
        for _ in range(2):
            cache(network, big, network)
        torch.cuda.synchronize()
        with_big_graph = torch.cuda.memory_reserved()
        for _ in range(2):
            assert torch.equal(cache(network, small, network), network(small))
        assert len(cache) == 1
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        assert torch.cuda.memory_reserved() < with_big_graph  # the big graph's pool went with it
