"""Image files, folders, globs, ``.txt``/``.csv`` lists and videos: ``LoadImagesAndVideos`` with parallel,
read-ahead decoding.

Stock ``LoadImagesAndVideos`` decodes a batch of images only when the predictor asks for it (one at a time below
batch 8, else in a ``ThreadPool`` of at most 8 threads made for that batch) and reads video frames on the
predictor's thread. :class:`FileLoader` keeps its ``__init__`` (the same files, order, and errors for a missing
path), and decodes ahead: images with Ultralytics' own ``imread`` on a pool of threads, videos on background
threads, one per video, several consecutive videos of a folder at once, each a batch ahead (:mod:`.video`; converted
on the GPU where ``gpu_video`` allows and that gives cv2's frames, :mod:`.converted_video`). Its
batches are stock's: the next ``batch`` images that decode (an unreadable one is skipped
with stock's "Image Read Error" warning), images before videos, a batch never spanning two videos, and the same
``info`` strings, ``mode``, ``frame``, ``frames``, ``fps`` and ``count`` as each batch is returned.
"""

from __future__ import annotations

import threading
from functools import partial
from pathlib import Path

import cv2
import numpy as np
import torch
from ultralytics.data import loaders
from ultralytics.data.loaders import LoadImagesAndVideos, SourceTypes

from .batch import ImageBatch
from .converted_video import GpuVideo
from .gpu_jpeg import EncodedJpeg, decode_on_gpu, read_for_gpu
from .prefetch import OrderedPrefetch, read_ahead_window
from .upload import Upload, Uploads, loader_uploads
from .video import VIDEO_END, VideoReader, VideosInOrder, VideoStart, nvdec_decoders, videos_open_at_once

# Ultralytics decodes these suffixes (HEIC, AVIF, ...) through lazily registered PIL plugins, which it keeps serial
# because their registration is not thread-safe; one lock keeps them serial here too.
_PIL_FALLBACK_LOCK = threading.Lock()


def _decode(path: str, flags: int) -> np.ndarray | None:
    """One image as ``LoadImagesAndVideos`` decodes it: Ultralytics' ``imread`` (None when unreadable)."""
    if Path(path).suffix.lower() in loaders.PIL_FALLBACK_SUFFIXES:
        with _PIL_FALLBACK_LOCK:
            return loaders.imread(path, flags=flags)
    return loaders.imread(path, flags=flags)


def _decode_and_upload(path: str, flags: int, uploads: Uploads | None) -> tuple[np.ndarray | None, Upload | None]:
    """One image decoded as :func:`_decode` does, and its upload ahead by ``uploads`` (when given and it applies)."""
    image = _decode(path, flags)
    return image, None if uploads is None else uploads.put(image)


def _read_or_decode(path: str, flags: int, uploads: Uploads | None) -> tuple[EncodedJpeg | np.ndarray | None,
                                                                            Upload | None]:
    """With GPU JPEG decoding: a JPEG for the GPU as its bytes, any other file as :func:`_decode_and_upload`."""
    jpeg = read_for_gpu(path) if flags == cv2.IMREAD_COLOR else None
    return (jpeg, None) if jpeg is not None else _decode_and_upload(path, flags, uploads)


class FileLoader(LoadImagesAndVideos):
    """``LoadImagesAndVideos`` whose images decode on ``threads`` threads and videos on a background thread, up to
    ``read_ahead`` batches ahead of the consumer (images: at least one per thread, so that batch 1 keeps every
    thread busy).

    Args:
        path: What ``LoadImagesAndVideos`` takes: an image or video file, a folder, a glob, a ``.txt``/``.csv`` list
            of paths, or a list of those.
        batch (int): Batch size.
        vid_stride (int): Video frame-rate stride.
        channels (int): Image channels of the model (1 grayscale, 3 BGR).
        threads (int): Image decoder threads; several videos decode at once, as many (at least two, see
            :func:`.video.videos_open_at_once`).
        read_ahead (int): Batches decoded ahead of the consumer.
        upload_to (torch.device | None): A CUDA device to upload the decoded images to from the decoder threads
            (:mod:`.upload`; each batch carries its images' copies, :class:`.batch.ImageBatch`), or None.
        gpu_jpeg (torch.device | None): A CUDA device to decode the baseline JPEGs on (:mod:`.gpu_jpeg`, opt-in:
            not stock's pixels), or None.
        gpu_video (GpuVideo | None): Where and with which decoder the GPU converts the videos' frames where that
            gives cv2's: decoded by PyAV to planes (:mod:`.av_planes`) or by NVDEC (:mod:`.nvdec`); their copies ride
            in :attr:`uploads`. None: cv2 reads them.
        lower_priority (bool): Decoder threads below the caller's priority (:class:`.OrderedPrefetch`; for a
            predictor on a GPU).

    Examples:
        >>> for paths, images, info in FileLoader("path/to/folder", batch=16, threads=8, read_ahead=2):
        ...     pass
    """

    def __init__(self, path, batch: int = 1, vid_stride: int = 1, channels: int = 3, threads: int = 1,
                 read_ahead: int = 2, upload_to: torch.device | None = None, gpu_jpeg: torch.device | None = None,
                 gpu_video: GpuVideo | None = None, lower_priority: bool = False):
        super().__init__(path, batch=batch, vid_stride=vid_stride, channels=channels)
        if self.cap:  # stock opened the first video to read its fps and frame count; the reader opens its own
            self.cap.release()
            self.cap = None
        self.source_type = SourceTypes()  # what load_inference_source gives a file source: no stream, no arrays
        self.threads, self.read_ahead, self.lower_priority = threads, read_ahead, lower_priority
        videos = self.nf - self.ni
        self.open_videos = min(videos_open_at_once(threads, batch), videos) if videos > 1 else 1
        converted_on = gpu_video.device if gpu_video is not None and videos else None  # (none for images only)
        self.uploads = loader_uploads(upload_to or gpu_jpeg or converted_on, batch, threads, read_ahead,
                                      self.open_videos)
        self._upload_ahead, self._gpu_jpeg, self._gpu_video = upload_to is not None, gpu_jpeg is not None, gpu_video
        self._images: OrderedPrefetch | None = None
        self._videos: VideoReader | VideosInOrder | None = None
        self._in_video = False

    def __iter__(self) -> FileLoader:
        self.close()
        self.count = 0
        if self.ni:
            decode = partial(_read_or_decode if self._gpu_jpeg else _decode_and_upload, flags=self.cv2_flag,
                             uploads=self.uploads if self._upload_ahead else None)
            window = read_ahead_window(self.bs, self.threads, self.read_ahead)
            self._images = OrderedPrefetch(decode, self.files[: self.ni], self.threads, window, self.lower_priority)
        if self.nf > self.ni:
            gray = self.cv2_flag == cv2.IMREAD_GRAYSCALE
            uploading = {"upload_ahead": self.uploads if self._upload_ahead else None,
                         "gpu_frames": self.uploads if self._gpu_video is not None else None,
                         "gpu_video": self._gpu_video, "decoders": nvdec_decoders(self.open_videos)}
            if self.open_videos > 1:
                self._videos = VideosInOrder(self.files[self.ni :], self.vid_stride, gray, self.bs, self.open_videos,
                                             **uploading)
            else:
                self._videos = VideoReader(self.files[self.ni :], self.vid_stride, gray, self.read_ahead * self.bs,
                                           **uploading)
        return self

    def __next__(self) -> tuple[list[str], ImageBatch, list[str]]:
        while True:
            paths, images, info, uploads = self._next_batch()
            if self._gpu_jpeg:
                self._decode_jpegs(paths, images, info, uploads)
            if paths:  # (empty only where every file of the batch failed on both decoders)
                return paths, ImageBatch(images, uploads), info

    def _decode_jpegs(self, paths: list, images: list, info: list, uploads: list) -> None:
        """Replace the batch's :class:`EncodedJpeg` items by their images, decoded on the GPU in one call (their GPU
        copies in ``uploads``, with uploads of the batch's other images), or on the CPU where that call fails; a
        file neither decodes is dropped with stock's warning."""
        jobs = [i for i, image in enumerate(images) if isinstance(image, EncodedJpeg)]
        if not jobs:
            return
        decoded = decode_on_gpu([images[i] for i in jobs], self.uploads.device)
        for n, i in enumerate(jobs):
            if decoded is None:
                images[i] = loaders.imread(paths[i], flags=self.cv2_flag)
            else:
                images[i], copy = decoded[n]
                uploads[i] = self.uploads.add(images[i], copy)
        if decoded is not None:  # the batch's CPU-decoded files join it on the GPU, so that it is letterboxed there
            for i in set(range(len(images))) - set(jobs):
                uploads[i] = uploads[i] or self.uploads.put(images[i])  # (at batch 1 the decoder threads did)
        for i in reversed(jobs):
            if images[i] is None:
                loaders.LOGGER.warning(f"Image Read Error {paths[i]}")
                del paths[i], images[i], info[i], uploads[i]

    def _next_batch(self) -> tuple[list[str], list, list[str], list[Upload | None]]:
        """The next batch's paths, images, ``info`` strings and, per image, its upload (None where not uploaded)."""
        paths, images, info, uploads = [], [], [], []
        while len(images) < self.bs:
            if self.count >= self.nf:
                if images:
                    return paths, images, info, uploads
                # The uploads stay: the last batch's may not be taken yet (stock's prefetch thread asks for the next
                # batch while the predictor letterboxes this one); close() drops them.
                self._stop_decoders()
                raise StopIteration
            if self.video_flag[self.count]:
                if self._next_frame(paths, images, info, uploads):
                    break
            else:
                self.mode = "image"
                image, upload = next(self._images)
                before = len(images)
                self._append_image(paths, images, info, self.files[self.count], image, self.count + 1)
                if len(images) > before:  # stock's method skips an unreadable image with its warning
                    uploads.append(upload)
                self.count += 1
                if self.count >= self.ni and images:  # flush the images before the videos start
                    break
        return paths, images, info, uploads

    def _next_frame(self, paths: list, images: list, info: list, uploads: list) -> bool:
        """Add the current video's next frame to the batch; True when the batch ends here (its video ended)."""
        self.mode = "video"
        if not self._in_video:
            start: VideoStart = self._videos.get()
            self.frame, self.fps, self.frames, self._in_video = 0, start.fps, start.frames, True
        item = self._videos.get()
        if item is VIDEO_END:
            self.count += 1
            self._in_video = False
            return bool(images)
        path = self.files[self.count]
        self.frame += 1
        paths.append(path)
        images.append(item.image)
        uploads.append(item.upload)
        info.append(f"video {self.count + 1}/{self.nf} (frame {self.frame}/{self.frames}) {path}: ")
        if item.last:
            self.count += 1
            self._in_video = False
        return item.last

    def _stop_decoders(self) -> None:
        """Stop the decoder threads and release the videos (idempotent)."""
        for reader in (self._images, self._videos):
            if reader is not None:
                reader.close()
        self._images = self._videos = None
        self._in_video = False

    def close(self) -> None:
        """Stop the decoder threads, release the videos and drop the uploads not taken (idempotent; the predictor
        calls it when it stops)."""
        self._stop_decoders()
        if self.uploads is not None:
            self.uploads.clear()
