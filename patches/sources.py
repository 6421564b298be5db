"""Patch ``DetectionPredictor.setup_source``: file sources read by :mod:`yolo_fastdetect.sources`, which decodes ahead
on a pool of threads exactly as stock decodes them.

File sources are an image, video, folder, glob, ``.txt``/``.csv`` list, or a Python list of paths (images, or videos:
read batched across the videos, where stock cannot read a list of videos); streams, URLs and in-memory inputs keep
Ultralytics' loaders, and ``YOLO_FASTDETECT_SOURCES=0`` keeps them for everything. Where ``preprocess`` letterboxes
on the GPU (:mod:`.predictor`) the loader uploads the images ahead.

The loaders subclass Ultralytics' ``LoadImagesAndVideos`` and ``LoadPilAndNumpy`` and decode with its ``imread``,
``autocast_list``, ``LoadPilAndNumpy._single_check`` and ``LoadImagesAndVideos._append_image``; the plan checks those
are there and take the model's channels (8.4.190 has them; 8.3.200-8.4.100 lack ``_append_image`` and pass
``_single_check`` a PIL mode, older releases take no channels at all). A list of paths is one batch, as stock's.
"""

from __future__ import annotations

from ultralytics.data import loaders
from ultralytics.models.yolo.detect import DetectionPredictor

from yolo_fastdetect.sources import file_loader

from ._patching import Patch, Replacement, parameters, require
from .predictor import gpu_letterbox, scale_fill


def setup_source(self: DetectionPredictor, source, stride: int | None = None) -> None:
    """``BasePredictor.setup_source`` with the parallel loader of :mod:`yolo_fastdetect.sources` for file sources
    (stock takes a ready loader as it is), which uploads the images ahead where ``preprocess`` letterboxes on the
    GPU; stock's loader for every other source."""
    channels = getattr(self.model, "channels", 3)
    gpu_input = gpu_letterbox(self) and channels == 3 and not scale_fill(self)
    loader = file_loader(source, batch=self.args.batch, vid_stride=self.args.vid_stride, channels=channels,
                         device=self.device if gpu_input else None, tracking=self.args.mode == "track")
    stock = PATCH.original("setup_source")
    # Stock takes a stride from 8.3.253 on (not 8.3.200), the source alone before.
    extra = (stride,) if stride is not None or "stride" in parameters(stock) else ()
    stock(self, source if loader is None else loader, *extra)


def _plan() -> list[Replacement]:
    """``setup_source`` on ``DetectionPredictor``, where the stock loaders are as the module docstring says."""
    stock = getattr(DetectionPredictor, "setup_source", None)
    require(callable(stock) and parameters(stock) in (["self", "source"], ["self", "source", "stride"]),
            "DetectionPredictor.setup_source is not (self, source[, stride])")
    require({"path", "batch", "vid_stride", "channels"} <= set(parameters(loaders.LoadImagesAndVideos.__init__)),
            "LoadImagesAndVideos does not take (path, batch, vid_stride, channels)")
    append = getattr(loaders.LoadImagesAndVideos, "_append_image", None)  # what the loader adds each image with
    require(callable(append) and parameters(append) == ["self", "paths", "imgs", "info", "path", "im0", "idx"],
            "LoadImagesAndVideos has no _append_image(paths, imgs, info, path, im0, idx)")
    require(callable(getattr(loaders, "imread", None)) and callable(getattr(loaders, "autocast_list", None)),
            "ultralytics.data.loaders has no imread/autocast_list")
    require(parameters(loaders.LoadPilAndNumpy._single_check) == ["im", "channels"],
            "LoadPilAndNumpy._single_check does not take (im, channels)")
    return [Replacement(DetectionPredictor, "setup_source", setup_source)]


PATCH = Patch(
    "sources",
    "DetectionPredictor.setup_source(source[, stride]); LoadImagesAndVideos(path, batch, vid_stride, channels) with "
    "_append_image, imread, autocast_list, LoadPilAndNumpy._single_check(im, channels)",
    _plan,
)
apply, revert, is_applied = PATCH.apply, PATCH.revert, PATCH.is_applied
