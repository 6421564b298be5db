"""Patch ``DetectionPredictor.setup_source``, ``.preprocess`` and ``.inference``: parallel read-ahead decoding of
file sources, letterbox on the GPU, forward pass from CUDA graphs.

- ``setup_source`` (every device): file sources (an image, video, folder, glob, ``.txt``/``.csv`` list, or a Python
  list of paths) are read by :mod:`yolo_fastdetect.sources`, which decodes ahead on a pool of threads exactly as
  stock decodes them; streams, URLs and in-memory inputs keep Ultralytics' loaders. ``YOLO_FASTDETECT_SOURCES=0``
  keeps them for everything.
- ``preprocess`` (CUDA): letterboxes in the ``letterbox`` operator on the GPU, uploading the original images
  (bit-identical input).
- ``inference`` (CUDA): replays the forward pass from a CUDA graph per input shape (:mod:`yolo_fastdetect.graphs`):
  a shape's first batch runs eagerly, its second is captured. Under Ultralytics' ``compile=`` that is the compiled
  forward: the modes that capture graphs of their own (``reduce-overhead``, ``max-autotune``) compile without them
  (``attempt_compile``, as Ultralytics' predictor module calls it), where these graphs replay the forward.
  ``YOLO_FASTDETECT_GRAPHS=0`` turns the replay off, ``YOLO_FASTDETECT_GRAPH_CACHE`` bounds the number of graphs kept
  (default 8).

``DetectionPredictor`` inherits these methods from ``BasePredictor``; ``apply()`` sets them on ``DetectionPredictor``
(so Segment, Pose and OBB predictors get them too), and ``attempt_compile`` in ``ultralytics.engine.predictor``;
``revert()`` restores both as they were. Everything else (CPU preprocessing and inference, other model formats,
``augment``/``embed``/``visualize``, a custom ``pre_transform``, forward hooks such as the tracker's ReID hook, extra
arguments) runs the stock method.

The replayed outputs are the graph's static tensors and are overwritten by the next replay of that shape. The stock
loop post-processes a batch before it runs the next one, and NMS makes new tensors for the ``Results``, so nothing a
user keeps refers to them; code calling ``predictor.inference`` itself must use (or clone) the outputs before the
next call.
"""

from __future__ import annotations

import os
import weakref

import numpy as np
import torch
import torch._dynamo
import torch._inductor
import ultralytics.engine.predictor as engine_predictor
from ultralytics.engine.predictor import BasePredictor
from ultralytics.models.yolo.detect import DetectionPredictor
from ultralytics.nn.autobackend import AutoBackend
from ultralytics.nn.tasks import DetectionModel, OBBModel, PoseModel, SegmentationModel

from yolo_fastdetect import _ext
from yolo_fastdetect.graphs import default_cache
from yolo_fastdetect.ops.letterbox import letterbox
from yolo_fastdetect.sources import file_loader

GRAPHS_VARIABLE = "YOLO_FASTDETECT_GRAPHS"

# Networks whose forward pass is plain tensor work on the input. Subclasses such as YOLO-World and YOLOE keep
# prompt embeddings in attributes that set_classes replaces, which a replay would not see: they run eagerly.
_GRAPHED_NETWORKS = (DetectionModel, SegmentationModel, PoseModel, OBBModel)

# Compile modes with CUDA graphs of their own, and the same mode without them (torch._inductor.list_mode_options).
# Where our graphs replay the forward, these compile without theirs: on the H200 (yolov8s fp16, 568e18d and 586f41a)
# reduce-overhead's graphs took 1.759 ms for the inference stage at batch 1 (0.161 at batch 64), ours 1.327 of the
# eager forward in the same run and 1.157 (0.141) of the compile=True forward.
_WITHOUT_OWN_GRAPHS = {"reduce-overhead": "default", "max-autotune": "max-autotune-no-cudagraphs"}
_COMPILED_FOR_OUR_GRAPHS: weakref.WeakSet = weakref.WeakSet()  # what attempt_compile compiled without its graphs

_MISSING = object()  # DetectionPredictor.__dict__ had no such entry
_ORIGINALS: dict[str, object] = {}


def _stock(predictor: DetectionPredictor, name: str):
    """The method ``name`` as it was before the patch, bound to ``predictor``."""
    original = _ORIGINALS.get(name, _MISSING)
    if original is _MISSING:  # inherited: BasePredictor's (or whatever follows DetectionPredictor in the MRO)
        return getattr(super(DetectionPredictor, predictor), name)
    return original.__get__(predictor)


def letterbox_options(predictor: DetectionPredictor, im) -> dict | None:
    """Arguments of :func:`yolo_fastdetect.letterbox` that reproduce the predictor's stock ``pre_transform`` +
    ``preprocess`` of ``im``, or None where they cannot (not a list of BGR uint8 images, a custom ``pre_transform``,
    ``scale_fill``, a model that is not 3-channel). Device-independent: the caller decides where it runs."""
    if not isinstance(im, list) or not im or predictor.scale_fill:
        return None
    if getattr(predictor.pre_transform, "__func__", None) is not BasePredictor.pre_transform:
        return None
    if getattr(predictor.model, "channels", 3) != 3:
        return None
    if not all(isinstance(x, np.ndarray) and x.dtype == np.uint8 and x.ndim == 3 and x.shape[2] == 3 for x in im):
        return None
    model = predictor.model
    same_shapes = len({x.shape for x in im}) == 1
    # LetterBox's auto exactly as BasePredictor.pre_transform (8.4) computes it.
    auto = (
        same_shapes
        and predictor.args.rect
        and not predictor.scale_fill
        and (model.format == "pt" or (getattr(model, "dynamic", False) and model.format != "imx"))
    )
    return {
        "new_shape": tuple(predictor.imgsz),
        "auto": bool(auto),
        "stride": model.stride,
        "dtype": torch.float16 if model.fp16 else torch.float32,
    }


def _gpu_letterbox(predictor: DetectionPredictor) -> bool:
    """Whether ``preprocess`` may letterbox on the GPU (the images decide the rest, see :func:`letterbox_options`)."""
    device = predictor.device
    return device is not None and device.type == "cuda" and _ext.cuda_fast_path()


def setup_source(self: DetectionPredictor, source, stride: int | None = None) -> None:
    """``BasePredictor.setup_source`` with the parallel loader of :mod:`yolo_fastdetect.sources` for file sources
    (stock takes a ready loader as it is), which uploads the images ahead where ``preprocess`` letterboxes on the
    GPU; stock's loader for every other source."""
    channels = getattr(self.model, "channels", 3)
    gpu_input = _gpu_letterbox(self) and channels == 3 and not self.scale_fill
    loader = file_loader(source, batch=self.args.batch, vid_stride=self.args.vid_stride, channels=channels,
                         device=self.device if gpu_input else None)
    _stock(self, "setup_source")(source if loader is None else loader, stride)


def preprocess(self: DetectionPredictor, im) -> torch.Tensor:
    """``BasePredictor.preprocess`` with the letterbox on the GPU; the stock method where that does not apply."""
    if self.args.rect and getattr(self.dataset, "same_shapes", True) is False:
        # A list of paths arrives in batches (PathListLoader), where stock letterboxes it as one batch: with `auto`
        # (minimal padding) only when every image of the list has one shape. So no batch of this list takes `auto`.
        self.args.rect = False
        try:
            return _letterboxed(self, im)
        finally:
            self.args.rect = True
    return _letterboxed(self, im)


def _letterboxed(self: DetectionPredictor, im) -> torch.Tensor:
    """The model input of ``im``: the letterbox operator on a CUDA device (from the copies the loader uploaded ahead,
    where it did), else the stock method."""
    if _gpu_letterbox(self):
        options = letterbox_options(self, im)
        if options is not None:
            uploads = getattr(self.dataset, "uploads", None)
            uploaded = uploads.take(im) if uploads is not None and uploads.device == self.device else None
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
    """Whether ``YOLO_FASTDETECT_GRAPHS`` leaves the replay on (anything but ``0``), read at each call."""
    return os.environ.get(GRAPHS_VARIABLE, "1") != "0"


def _graphable(backend: AutoBackend) -> bool:
    """Whether the backend's own forward pass is one that CUDA graphs may replay (the input decides the rest)."""
    return (
        backend.format == "pt"
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
    compiled = _ORIGINALS["attempt_compile"](model, device=device, imgsz=imgsz, use_autocast=use_autocast,
                                             warmup=warmup, mode=ours or mode)
    if ours is not None and compiled is not model:  # it falls back to the model where compile is unavailable
        _COMPILED_FOR_OUR_GRAPHS.add(compiled)
    return compiled


_METHODS = {"setup_source": setup_source, "preprocess": preprocess, "inference": inference}


def apply() -> None:
    """Install the patched methods on ``DetectionPredictor``, and :func:`attempt_compile` (idempotent)."""
    if not is_applied():
        for name, method in _METHODS.items():
            _ORIGINALS[name] = DetectionPredictor.__dict__.get(name, _MISSING)
            setattr(DetectionPredictor, name, method)
        _ORIGINALS["attempt_compile"] = engine_predictor.attempt_compile
        engine_predictor.attempt_compile = attempt_compile


def revert() -> None:
    """Restore ``DetectionPredictor``'s ``__dict__`` (in 8.4 it inherits all three methods) and Ultralytics'
    ``attempt_compile``, and drop the graphs (idempotent)."""
    if is_applied():
        for name in _METHODS:
            original = _ORIGINALS.pop(name)
            if original is _MISSING:
                delattr(DetectionPredictor, name)
            else:
                setattr(DetectionPredictor, name, original)
        engine_predictor.attempt_compile = _ORIGINALS.pop("attempt_compile")
        default_cache().clear()


def is_applied() -> bool:
    """Whether the three methods and ``attempt_compile`` are the patched ones."""
    return (all(DetectionPredictor.__dict__.get(name) is method for name, method in _METHODS.items())
            and engine_predictor.attempt_compile is attempt_compile)
