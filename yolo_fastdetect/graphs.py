"""CUDA-graph replay of a module's forward pass, one graph per input shape: :class:`GraphCache`.

At batch 1 a YOLO forward pass is hundreds of small kernels, and the GPU waits on Python launching them. A CUDA
graph records the launches once and replays them with one call. :class:`GraphCache` does that per key
``(module, input shape, strides, dtype, device, inference/autocast/TF32 settings, caller's variant)``:

- the first call of a key runs eagerly (a shape seen once, such as the short last batch of a run, is not worth a
  capture);
- the second call captures it (a few warm-up runs on a side stream, then ``torch.cuda.graph``, as the PyTorch
  CUDA-graph notes prescribe) and replays it;
- later calls copy the input into the graph's static input and replay; they return the graph's static outputs in
  the structure the module returns (tensors in tuples, lists, dicts), in new containers.

Anything that does not apply runs eagerly, with no error: a capture that raises (a host synchronisation in the
forward pass, out of memory, ...) marks the key as eager for good; a module with forward hooks runs eagerly (a
replay would skip them; Ultralytics' tracker and ``yolo_fastdetect.capture_head_inputs`` use hooks). The cache is
a bounded LRU of graphs; dropping a graph frees its memory pool. A module whose parameters move or change dtype
(``model.half()``, ``.to()``) loses its graphs; parameters updated in place are read by the replays as they are.

Outputs are overwritten by the next replay: consume them (Ultralytics' post-processing does, before the next
batch's inference) or clone them before calling the module again.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from . import config

__all__ = ["CapturedGraph", "GraphCache", "capture_cuda_graph", "default_cache"]

CACHE_SIZE_VARIABLE = "YOLO_FASTDETECT_GRAPH_CACHE"
DEFAULT_CACHE_SIZE = config.VARIABLES[CACHE_SIZE_VARIABLE].default
WARMUP_RUNS = 3
MAX_CAPTURES = 2  # a key captured this often (evicted in between) thrashes the cache: it runs eagerly from then on
MAX_REMEMBERED_KEYS = 1024  # keys seen but not captured (or eager for good) that the cache remembers

Replay = Callable[[torch.Tensor], Any]


@dataclass
class CapturedGraph:
    """One captured call: replaying reads ``static_input`` and rewrites the tensors of ``static_output``."""

    graph: torch.cuda.CUDAGraph
    static_input: torch.Tensor
    static_output: Any

    def __call__(self, x: torch.Tensor) -> Any:
        """Replay on ``x`` (same shape, strides, dtype and device as the captured input); the outputs are the
        static tensors, in new containers."""
        self.static_input.copy_(x)
        self.graph.replay()
        return _new_containers(self.static_output)


def _new_containers(output: Any) -> Any:
    """``output`` with its lists, tuples and dicts rebuilt around the same tensors (a caller may change them)."""
    if isinstance(output, dict):
        return type(output)((key, _new_containers(value)) for key, value in output.items())
    if isinstance(output, tuple) and hasattr(output, "_fields"):  # namedtuple
        return type(output)(*(_new_containers(value) for value in output))
    if isinstance(output, (list, tuple)):
        return type(output)(_new_containers(value) for value in output)
    return output


def capture_cuda_graph(fn: Callable[[torch.Tensor], Any], example: torch.Tensor, warmup: int = WARMUP_RUNS) -> Replay:
    """Capture ``fn(static_input)`` into a CUDA graph; return the replay callable (a :class:`CapturedGraph`).

    ``fn`` runs ``warmup`` times on a side stream first (lazy initialisation, cuDNN/cuBLAS workspaces and the
    module's own caches, such as Detect's anchors, happen outside the capture). On failure the exception
    propagates after the allocator has been handed back its pool and the caller's stream is current again.
    """
    device = example.device
    static_input = torch.empty_like(example)
    static_input.copy_(example)
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    graph = torch.cuda.CUDAGraph()
    pool = torch.cuda.graph_pool_handle()
    # The outer stream context restores the caller's stream even when the capture fails before its own exit.
    with torch.cuda.device(device), torch.cuda.stream(stream):
        for _ in range(warmup):
            fn(static_input)
        try:
            # thread_local, as torch.compile's CUDA graphs: a capture must not make another thread's CUDA call fail.
            with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
                static_output = fn(static_input)
        except BaseException:
            _release_failed_capture(graph, pool, device.index)
            raise
    torch.cuda.current_stream(device).wait_stream(stream)
    return CapturedGraph(graph, static_input, static_output)


def _release_failed_capture(graph: torch.cuda.CUDAGraph, pool, device_index: int) -> None:
    """Undo the allocator and random-generator state of a capture whose end failed.

    When the capture was invalidated (an illegal call inside it), ``capture_end`` raises before it tells the
    caching allocator that the capture is over; the allocator would then believe a capture is still underway and
    refuse to empty its cache. Ending and releasing the pool is what a successful ``capture_end`` plus the graph's
    destruction would have done. ``capture_end`` also never ended the capture of the device's default random
    generator, after which every random draw on the device raises ("Offset increment outside graph capture"); a
    trivial capture that ends properly ends it. A capture that did end (the exception came after it) owns its pool
    already and left the generator alone.
    """
    try:
        graph.pool()  # raises when the capture never ended
    except RuntimeError:
        with contextlib.suppress(RuntimeError):
            torch._C._cuda_endAllocateToPool(device_index, pool)
            torch._C._cuda_releasePool(device_index, pool)
        with torch.cuda.device(device_index), torch.cuda.graph(torch.cuda.CUDAGraph()):
            torch.zeros(1, device=torch.device("cuda", device_index))


def _hook_tables(module: nn.Module) -> tuple[dict, ...]:
    """The forward (pre-)hook dicts of ``module`` and its submodules; registering a hook adds to them in place, and
    holding them does not keep the modules alive."""
    return tuple(table for m in module.modules() for table in (m._forward_hooks, m._forward_pre_hooks))


def _has_hooks(hook_tables: tuple[dict, ...]) -> bool:
    """Whether a call would run forward hooks (per module or global), which a replay would skip."""
    from torch.nn.modules import module as module_globals

    return bool(module_globals._global_forward_hooks or module_globals._global_forward_pre_hooks) or any(hook_tables)


def _modes(device_type: str) -> tuple:
    """Global settings that change which kernels a call runs: a replay keeps those of its capture."""
    return (
        torch.is_inference_mode_enabled(),
        torch.is_autocast_enabled(device_type),
        torch.backends.cudnn.allow_tf32,
        torch.backends.cudnn.deterministic,
        torch.get_float32_matmul_precision(),
    )


def _fingerprint(module: nn.Module) -> tuple:
    """Cheap identity of a module's weights: ``.to()``, ``.half()`` and friends allocate new parameter storage."""
    parameter = next(module.parameters(), None)
    return () if parameter is None else (parameter.data_ptr(), parameter.dtype, parameter.device)


@dataclass
class _Owner:
    """A module the cache holds graphs for: a weak reference (the cache never keeps a model alive) and the
    fingerprint its graphs were captured with."""

    ref: weakref.ref
    fingerprint: tuple


@dataclass
class _Entry:
    """A captured key: the replay, the hook tables checked before each replay, and tensors kept alive for it."""

    replay: Replay
    hook_tables: tuple[dict, ...]
    # Tensors held as plain module attributes when the capture ran (Detect's anchors and strides): the graph reads
    # their memory, and an eager call on another shape replaces (frees) them.
    keep_alive: tuple[torch.Tensor, ...]


_EAGER = -1  # history value of a key that runs eagerly for good


class GraphCache:
    """Replays ``fn(x)`` from CUDA graphs, one per key; see the module docstring for the policy.

    Args:
        max_size (int | None): Most graphs kept (least recently used dropped first); None reads
            ``YOLO_FASTDETECT_GRAPH_CACHE`` (default 8) at each call; 0 captures nothing.
        capture (Callable): ``capture(fn, example) -> replay``; :func:`capture_cuda_graph` by default (tests pass a
            fake to check the policy without a GPU).
    """

    def __init__(
        self, max_size: int | None = None, capture: Callable[[Callable, torch.Tensor], Replay] = capture_cuda_graph
    ):
        self.max_size = max_size
        self._capture = capture
        self._graphs: OrderedDict[tuple, _Entry] = OrderedDict()
        self._history: OrderedDict[tuple, int] = OrderedDict()  # key -> captures so far, or _EAGER
        self._owners: dict[int, _Owner] = {}
        self._dead: list[int] = []  # ids of owners collected since the last call (filled by weakref callbacks)
        self._lock = threading.RLock()

    def __len__(self) -> int:
        """Number of graphs held."""
        return len(self._graphs)

    def capacity(self) -> int:
        """Most graphs kept: ``max_size``, or the environment variable's value."""
        if self.max_size is not None:
            return self.max_size
        return config.get(CACHE_SIZE_VARIABLE)

    def clear(self) -> None:
        """Drop every graph (freeing its memory pool) and forget every key."""
        with self._lock:
            self._graphs.clear()
            self._history.clear()
            self._owners.clear()

    def __call__(
        self, fn: Callable[[torch.Tensor], Any], x: torch.Tensor, owner: nn.Module, variant: Hashable = ()
    ) -> Any:
        """``fn(x)``, replayed from a graph where the policy allows.

        Args:
            fn: The call to capture: runs ``owner`` on ``x`` (possibly wrapped, e.g. by Ultralytics' AutoBackend).
            x: Its only tensor input.
            owner: The module whose parameters and state ``fn`` reads; its identity is part of the key.
            variant: Python values ``fn`` depends on besides ``x`` (a replay bakes them in): part of the key.
        """
        with self._lock:
            replay = self._replay_for(fn, x, owner, variant)
            if replay is not None:
                return replay(x)
        return fn(x)

    def _replay_for(self, fn: Callable, x: torch.Tensor, owner: nn.Module, variant: Hashable) -> Replay | None:
        """The replay callable for this call, capturing it if this is the key's second call; None: run eagerly."""
        self._forget_dead_owners()
        self._check_owner(owner)
        capacity = self.capacity()
        while len(self._graphs) > capacity:  # also applies a smaller size set since the last capture
            self._graphs.popitem(last=False)
        key = (id(owner), variant, x.shape, x.stride(), x.dtype, x.device, *_modes(x.device.type))
        entry = self._graphs.get(key)
        if entry is not None:
            if _has_hooks(entry.hook_tables):
                return None
            self._graphs.move_to_end(key)
            return entry.replay
        hook_tables = _hook_tables(owner)
        if capacity == 0 or _has_hooks(hook_tables):
            return None
        captures = self._history.get(key)
        if captures is None or captures == _EAGER or captures >= MAX_CAPTURES:
            self._remember(key, 0 if captures is None else _EAGER)
            return None
        try:
            replay = self._capture(fn, x)
        except Exception:  # noqa: BLE001 - an uncapturable call runs eagerly, as it would without the cache
            self._remember(key, _EAGER)
            return None
        keep_alive = tuple(v for m in owner.modules() for v in vars(m).values() if isinstance(v, torch.Tensor))
        self._graphs[key] = _Entry(replay, hook_tables, keep_alive)
        self._remember(key, captures + 1)
        if len(self._graphs) > capacity:
            self._graphs.popitem(last=False)
        return replay

    def _remember(self, key: tuple, value: int) -> None:
        self._history[key] = value
        self._history.move_to_end(key)
        while len(self._history) > MAX_REMEMBERED_KEYS:
            self._history.popitem(last=False)

    def _check_owner(self, owner: nn.Module) -> None:
        """Register ``owner``, or drop its graphs if its parameters were reallocated since they were captured."""
        owner_id, fingerprint = id(owner), _fingerprint(owner)
        known = self._owners.get(owner_id)
        if known is not None and known.ref() is owner and known.fingerprint == fingerprint:
            return
        self._drop_owner(owner_id)
        dead = self._dead  # the callback must not hold the cache (nor the owner) alive
        self._owners[owner_id] = _Owner(weakref.ref(owner, lambda _, i=owner_id: dead.append(i)), fingerprint)

    def _forget_dead_owners(self) -> None:
        while self._dead:
            owner_id = self._dead.pop()
            known = self._owners.get(owner_id)
            if known is not None and known.ref() is None:
                self._drop_owner(owner_id)

    def _drop_owner(self, owner_id: int) -> None:
        self._owners.pop(owner_id, None)
        for table in (self._graphs, self._history):
            for key in [key for key in table if key[0] == owner_id]:
                del table[key]


_default_cache = GraphCache()


def default_cache() -> GraphCache:
    """The process-wide cache the patched Ultralytics predictor uses."""
    return _default_cache
