"""Patch ``DetectionPredictor.preprocess`` and ``.inference``: letterbox on the GPU, forward pass from CUDA graphs
(the file sources' parallel decoding is :mod:`.sources`).

- ``preprocess`` (CUDA): letterboxes in the ``letterbox`` operator on the GPU, uploading the original images
  (bit-identical input).
- ``inference`` (CUDA): replays the forward pass from a CUDA graph per input shape (:mod:`yolo_fastdetect.graphs`):
  a shape's first batch runs eagerly, its second is captured. Under Ultralytics' ``compile=`` that is the compiled
  forward: the modes that capture graphs of their own (``reduce-overhead``, ``max-autotune``) compile without them
  (``attempt_compile``, as Ultralytics' predictor module calls it), where these graphs replay the forward.
  ``YOLO_FASTDETECT_GRAPHS=0`` turns the replay off, ``YOLO_FASTDETECT_GRAPH_CACHE`` bounds the number of graphs kept
  (default 8).

``DetectionPredictor`` inherits both methods from ``BasePredictor``; ``apply()`` sets them on ``DetectionPredictor``
(so Segment, Pose and OBB predictors get them too), and ``attempt_compile`` in ``ultralytics.engine.predictor`` where
that module has it (8.3.200 on); ``revert()`` restores both as they were. The GPU letterbox learns the stock
letterbox's minimal padding (``auto``) from a probe of the predictor's own ``pre_transform``, so it follows each
release's rule. Everything else (CPU preprocessing and inference, other model formats,
``augment``/``embed``/``visualize``, a custom ``pre_transform``, forward hooks such as the tracker's ReID hook, extra
arguments) runs the stock method.

The replayed outputs are the graph's static tensors and are overwritten by the next replay of that shape. The stock
loop post-processes a batch before it runs the next one, and NMS makes new tensors for the ``Results``, so nothing a
user keeps refers to them; code calling ``predictor.inference`` itself must use (or clone) the outputs before the
next call.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import numpy as np
import torch
import torch._dynamo
import torch._inductor
import ultralytics.engine.predictor as engine_predictor
from ultralytics.engine.predictor import BasePredictor
from ultralytics.models.yolo.detect import DetectionPredictor
from ultralytics.nn.autobackend import AutoBackend
from ultralytics.nn.tasks import DetectionModel, OBBModel, PoseModel, SegmentationModel

from yolo_fastdetect import _ext, config
from yolo_fastdetect.graphs import default_cache
from yolo_fastdetect.ops.letterbox import letterbox
from yolo_fastdetect.sources.batch import ImageBatch

from ._patching import Patch, Replacement, parameters, require

GRAPHS_VARIABLE = "YOLO_FASTDETECT_GRAPHS"

# Networks whose forward pass is plain tensor work on the input. Subclasses such as YOLO-World and YOLOE keep
# prompt embeddings in attributes that set_classes replaces, which a replay would not see: they run eagerly.
_GRAPHED_NETWORKS = (DetectionModel, SegmentationModel, PoseModel, OBBModel)

# Compile modes with CUDA graphs of their own, and the same mode without them (torch._inductor.list_mode_options).
# Where our graphs replay the forward, these compile without theirs: reduce-overhead's graphs were slower than ours
# replaying the eager forward, or the compile=True one (see benchmarks/RESULTS.md, End to end).
_WITHOUT_OWN_GRAPHS = {"reduce-overhead": "default", "max-autotune": "max-autotune-no-cudagraphs"}
_COMPILED_FOR_OUR_GRAPHS: weakref.WeakSet = weakref.WeakSet()  # what attempt_compile compiled without its graphs

def _stock(predictor: DetectionPredictor, name: str) -> Callable:
    """The method ``name`` as it was before the patch (inherited or not), bound to ``predictor``."""
    return PATCH.original(name).__get__(predictor)


def scale_fill(predictor: DetectionPredictor) -> bool:
    """Whether the predictor stretches images instead of letterboxing them (an attribute in 8.4.190, not 8.4.100)."""
    return bool(getattr(predictor, "scale_fill", False))


# Probe images for the stock letterbox's padding rule: the letterbox fills one side of each exactly, and `auto` pads
# the other only to the stride. No imgsz has both aspects, so one of them tells `auto` apart.
_PROBES = (np.zeros((1, 7, 3), np.uint8), np.zeros((7, 1, 3), np.uint8))


def _stock_pads_minimally(predictor: DetectionPredictor) -> bool:
    """Whether the predictor's stock ``pre_transform`` letterboxes a batch of equal-shaped images with minimal padding
    (LetterBox's ``auto``), as the release computes it from the model, ``rect`` and ``scale_fill``; learnt by probing
    it with tiny images, once per model and arguments."""
    key = (id(predictor.model), bool(getattr(predictor.args, "rect", False)), tuple(predictor.imgsz),
           scale_fill(predictor))
    known = predictor.__dict__.setdefault("_yolo_fastdetect_pads_minimally", {})
    if key not in known:
        shapes = [predictor.pre_transform([probe])[0].shape[:2] for probe in _PROBES]
        known[key] = any(shape != tuple(predictor.imgsz) for shape in shapes)
    return known[key]


def letterbox_options(predictor: DetectionPredictor, im) -> dict | None:
    """Arguments of :func:`yolo_fastdetect.letterbox` that reproduce the predictor's stock ``pre_transform`` +
    ``preprocess`` of ``im``, or None where they cannot (not a list of BGR uint8 images, a custom ``pre_transform``,
    ``scale_fill``, a model that is not 3-channel). Device-independent: the caller decides where it runs."""
    if not isinstance(im, list) or not im or scale_fill(predictor):
        return None
    if getattr(predictor.pre_transform, "__func__", None) is not BasePredictor.pre_transform:
        return None
    if getattr(predictor.model, "channels", 3) != 3:
        return None
    if not all(isinstance(x, np.ndarray) and x.dtype == np.uint8 and x.ndim == 3 and x.shape[2] == 3 for x in im):
        return None
    model = predictor.model
    # Every release's pre_transform pads minimally only for a batch of one image shape.
    auto = len({x.shape for x in im}) == 1 and _stock_pads_minimally(predictor)
    return {
        "new_shape": tuple(predictor.imgsz),
        "auto": bool(auto),
        "stride": model.stride,
        "dtype": torch.float16 if model.fp16 else torch.float32,
    }


def gpu_letterbox(predictor: DetectionPredictor) -> bool:
    """Whether ``preprocess`` may letterbox on the GPU (the images decide the rest, see :func:`letterbox_options`)."""
    device = predictor.device
    return device is not None and device.type == "cuda" and _ext.cuda_fast_path()


def preprocess(self: DetectionPredictor, im) -> torch.Tensor:
    """``BasePredictor.preprocess`` with the letterbox on the GPU (from the copies the loader uploaded ahead, where it
    did); the stock method where that does not apply."""
    if gpu_letterbox(self):
        options = letterbox_options(self, im)
        if options is not None:
            uploaded = im.take_uploads(self.device) if isinstance(im, ImageBatch) else None
            return letterbox(im if uploaded is None else uploaded, device=self.device, **options)[0]
    return _stock(self, "preprocess")(im)


def replayed_backend(predictor: DetectionPredictor) -> AutoBackend | None:
    """The ``AutoBackend`` whose forward pass ``predictor.inference`` may replay from CUDA graphs: the predictor's
    model, or the one that Ultralytics' ``compile=`` wrapped where the compiled forward captures no CUDA graphs of
    its own (``True``/``"default"``, ``"max-autotune-no-cudagraphs"``, and what :func:`attempt_compile` compiled
    without them: the compiled forward is then replayed as the plain one is; ``"reduce-overhead"`` and
    ``"max-autotune"`` compiled elsewhere replay their own graphs). None for anything else."""
    model = predictor.model
    if isinstance(model, torch._dynamo.eval_frame.OptimizedModule):
        if model not in _COMPILED_FOR_OUR_GRAPHS:
            mode = "default" if predictor.args.compile is True else predictor.args.compile
            try:
                if torch._inductor.list_mode_options(mode).get("triton.cudagraphs", False):
                    return None
            except (RuntimeError, TypeError):  # a mode this torch does not know
                return None
        if model._forward_hooks or model._forward_pre_hooks:
            return None
        model = model._orig_mod
    return model if isinstance(model, AutoBackend) else None


def replay_on() -> bool:
    """Whether ``YOLO_FASTDETECT_GRAPHS`` leaves the replay on (unset or ``1``), read at each call."""
    return config.get(GRAPHS_VARIABLE)


def _pytorch_backend(backend: AutoBackend) -> bool:
    """Whether the backend runs a PyTorch model: ``format == "pt"`` (8.4.100 on), the ``pt`` flag before."""
    if hasattr(backend, "format"):
        return backend.format == "pt"
    return bool(getattr(backend, "pt", False))


def _graphable(backend: AutoBackend) -> bool:
    """Whether the backend's own forward pass is one that CUDA graphs may replay (the input decides the rest)."""
    return (
        _pytorch_backend(backend)
        and not (backend._forward_hooks or backend._forward_pre_hooks)
        and type(backend.model) in _GRAPHED_NETWORKS
    )


def graphed_backend(predictor: DetectionPredictor, im: torch.Tensor) -> AutoBackend | None:
    """The backend whose stock call ``predictor.model(im, ...)`` ``predictor.inference(im)`` may replay from a CUDA
    graph (see :func:`replayed_backend`), or None where the stock method must run."""
    args, backend = predictor.args, replayed_backend(predictor)
    replayable = (
        replay_on()
        and isinstance(im, torch.Tensor)
        and im.is_cuda
        and not (args.augment or args.embed or args.visualize)
        and backend is not None
        and _graphable(backend)
        and not backend.model.training
        and not torch.is_grad_enabled()
    )
    return backend if replayable else None


def inference(self: DetectionPredictor, im: torch.Tensor, *args, **kwargs):
    """``BasePredictor.inference`` replayed from a CUDA graph per input shape; the stock method where that does not
    apply. The outputs are overwritten by the next replay of the same shape (see the module docstring)."""
    backend = None if args or kwargs else graphed_backend(self, im)
    if backend is None:
        return _stock(self, "inference")(im, *args, **kwargs)
    model, augment, embed = self.model, self.args.augment, self.args.embed
    network = backend.model
    head = network.model[-1]
    # stream_inference sets these on end-to-end heads at every run, and their forward reads them as Python values.
    # A compiled forward's graphs are kept apart from the plain forward's of the same network.
    variant = (getattr(head, "max_det", None), getattr(head, "agnostic_nms", None), model is not backend)
    return default_cache()(lambda x: model(x, augment=augment, embed=embed), im, owner=network, variant=variant)


def attempt_compile(model: torch.nn.Module, device: torch.device, imgsz: int = 640, use_autocast: bool = False,
                    warmup: bool = False, mode: bool | str = "default") -> torch.nn.Module:
    """Ultralytics' ``attempt_compile`` (what ``BasePredictor.setup_model`` calls for ``compile=``); a mode with CUDA
    graphs of its own compiles without them where :func:`inference` will replay the compiled forward from ours: a
    ``"pt"`` network of :data:`_GRAPHED_NETWORKS` on a CUDA device, ``YOLO_FASTDETECT_GRAPHS`` not 0. One graph
    capture, not two, and ours measured faster (see :data:`_WITHOUT_OWN_GRAPHS`)."""
    replayed_by_ours = (
        replay_on()
        and device.type == "cuda"
        and isinstance(model, AutoBackend)
        and _graphable(model)
    )
    ours = _WITHOUT_OWN_GRAPHS.get(mode) if replayed_by_ours and isinstance(mode, str) else None
    compiled = PATCH.original("attempt_compile")(model, device=device, imgsz=imgsz, use_autocast=use_autocast,
                                             warmup=warmup, mode=ours or mode)
    if ours is not None and compiled is not model:  # it falls back to the model where compile is unavailable
        _COMPILED_FOR_OUR_GRAPHS.add(compiled)
    return compiled


_METHODS = {"preprocess": preprocess, "inference": inference}
# What stock's method must take, in its order, for the patched one to stand in for it.
_STOCK_PARAMETERS = {"preprocess": ["self", "im"], "inference": ["self", "im", "args", "kwargs"]}


def _plan() -> list[Replacement]:
    """The two methods on ``DetectionPredictor`` (after checking stock's signatures and that ``pre_transform``, which
    the GPU letterbox probes, is there), and ``attempt_compile`` where ``ultralytics.engine.predictor`` calls one."""
    for name, expected in _STOCK_PARAMETERS.items():
        stock = getattr(DetectionPredictor, name, None)
        require(callable(stock), f"DetectionPredictor has no {name}")
        require(parameters(stock) == expected, f"DetectionPredictor.{name} is not ({', '.join(expected)})")
    require(callable(getattr(BasePredictor, "pre_transform", None)), "BasePredictor has no pre_transform")
    replacements = [Replacement(DetectionPredictor, name, method) for name, method in _METHODS.items()]
    stock_compile = getattr(engine_predictor, "attempt_compile", None)
    if stock_compile is not None:  # compile= (8.3.200 on)
        require({"model", "device", "imgsz", "use_autocast", "warmup", "mode"} <= set(parameters(stock_compile)),
                "attempt_compile does not take (model, device, imgsz, use_autocast, warmup, mode)")
        replacements.append(Replacement(engine_predictor, "attempt_compile", attempt_compile))
    return replacements


PATCH = Patch(
    "predictor",
    "DetectionPredictor.preprocess(im), inference(im, *args, **kwargs) and pre_transform; "
    "ultralytics.engine.predictor.attempt_compile where compile= exists",
    _plan,
    on_revert=lambda: default_cache().clear(),
)
apply, revert, is_applied = PATCH.apply, PATCH.revert, PATCH.is_applied
