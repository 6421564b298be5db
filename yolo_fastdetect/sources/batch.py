"""The batch of original images a loader hands the predictor, and what the patched ``preprocess`` asks of it.

Stock's loop unpacks each batch as ``paths, im0s, info`` and gives ``im0s`` (a list of numpy arrays) to
``preprocess``, ``postprocess`` and, image by image, to the ``Results``. The loaders of :mod:`yolo_fastdetect.sources`
return an :class:`ImageBatch` as ``im0s``: a list of the same arrays, which every stock consumer takes as the list
it is, carrying what the images alone do not tell: ``uploads``, each image's copy on the GPU where the decoder
threads uploaded it (:mod:`.upload`), which ``preprocess`` letterboxes instead of uploading the image again.

A copy or a pickle of the batch is a plain list (the uploads are this process's GPU memory), as is a slice.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch

from .upload import Upload


class ImageBatch(list):
    """A loader's batch of original images (stock's ``im0s``) with their GPU copies.

    Args:
        images (Iterable[np.ndarray]): The batch's original images, as stock's loader gives them.
        uploads (Sequence[Upload | None]): Per image its :class:`.upload.Upload`, or None where it was not uploaded
            (empty: none was).

    Examples:
        >>> batch = ImageBatch([np.zeros((480, 640, 3), np.uint8)])
        >>> isinstance(batch, list), batch.take_uploads(torch.device("cuda", 0))
        (True, None)
    """

    def __init__(self, images: Iterable[np.ndarray] = (), uploads: Sequence[Upload | None] = ()):
        super().__init__(images)
        self.uploads = tuple(uploads)

    def take_uploads(self, device: torch.device) -> list[torch.Tensor] | None:
        """The images' copies on ``device``, usable on its current stream, where every image of the batch (as it is
        now: a callback may have replaced one) was uploaded there and is still held; None otherwise, and then the
        caller uploads the images. Taken once: the caller holds the copies from now on."""
        uploads = self.uploads
        if not uploads or len(uploads) != len(self):
            return None
        if not all(upload is not None and upload.image is image for upload, image in zip(uploads, self)):
            return None
        owner = uploads[0].owner
        if owner.device != device or any(upload.owner is not owner for upload in uploads):
            return None
        return owner.take(uploads)

    def __reduce__(self):
        return list, (list(self),)

