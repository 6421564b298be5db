"""yolo_fastdetect: hand-written CUDA/CPU kernels for Ultralytics YOLO inference, output-identical to stock.

``import yolo_fastdetect`` patches Ultralytics (set ``YOLO_FASTDETECT=0`` to opt out); ``disable()`` restores it, and
``with yolo_fastdetect.disabled():`` runs a block stock.
The operators are compiled on first use and cached; if that fails the package warns once and Ultralytics
runs stock.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

__version__ = "0.1.0"

# In a source checkout the integration lives in ../patches; installed, it is the subpackage yolo_fastdetect.patches.
if not (Path(__file__).parent / "patches").is_dir() and (Path(__file__).parent.parent / "patches").is_dir():
    __path__.append(str(Path(__file__).parent.parent))  # noqa: F821 - the package's own search path

from . import config  # noqa: E402
from .features import capture_head_inputs, detection_rois, roi_features  # noqa: E402
from .ops import (  # noqa: E402
    LetterboxGeometry,
    MultiScaleRoIAlign,
    RoIAlign,
    batched_nms,
    detect_decode,
    detect_decode_reference,
    letterbox,
    letterbox_geometry,
    multiscale_roi_align,
    non_max_suppression,
    non_max_suppression_reference,
    roi_align,
    roi_align_reference,
    scale_boxes_batch,
)

__all__ = [
    "LetterboxGeometry",
    "MultiScaleRoIAlign",
    "RoIAlign",
    "__version__",
    "batched_nms",
    "capture_head_inputs",
    "detect_decode",
    "detect_decode_reference",
    "detection_rois",
    "disable",
    "disabled",
    "enable",
    "is_enabled",
    "letterbox",
    "letterbox_geometry",
    "multiscale_roi_align",
    "non_max_suppression",
    "non_max_suppression_reference",
    "roi_align",
    "roi_align_reference",
    "roi_features",
    "scale_boxes_batch",
]


def enable() -> bool:
    """Patch Ultralytics to use the fast kernels: every patch whose checks pass on the installed Ultralytics applies,
    the others stay stock, with one warning naming them and why (see ``yolo-fastdetect info``).

    Returns:
        Whether any patch is applied (False on an Ultralytics where none applies, or with none installed).
    """
    from . import patches

    return patches.apply_all()


def disable() -> None:
    """Restore stock Ultralytics."""
    from . import patches

    patches.revert_all()


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Run a block with stock Ultralytics, then put the patch back as it was, even if the block raises.

    The state after the block is the state before it: enabled again if the package was enabled, still disabled if
    it was disabled already (even if the block enabled it).

    Examples:
        >>> import yolo_fastdetect
        >>> with yolo_fastdetect.disabled():
        ...     yolo_fastdetect.is_enabled()
        False
    """
    was_enabled = is_enabled()
    disable()
    try:
        yield
    finally:
        if was_enabled:
            enable()
        else:
            disable()


def is_enabled() -> bool:
    """Whether the Ultralytics patches are applied.

    Applied patches run the operators where they can: on a CUDA device that needs CUDA kernels, which a build
    without a CUDA toolkit lacks. There Ultralytics runs stock on the GPU and the first such model warns once with
    the cause and the fix; ``yolo-fastdetect info`` (or :func:`yolo_fastdetect.cli.gpu_state`) says which runs, and
    ``yolo-fastdetect check`` proves it on a device.

    Examples:
        >>> import yolo_fastdetect
        >>> yolo_fastdetect.is_enabled()  # doctest: +SKIP
        True
    """
    import sys

    patches = sys.modules.get(f"{__name__}.patches")
    return patches is not None and patches.applied()


def _switched_on() -> bool:
    """``YOLO_FASTDETECT`` read at import: a value other than 0 or 1 warns and leaves Ultralytics stock, since an
    import must not fail because of us."""
    try:
        return bool(config.get("YOLO_FASTDETECT"))
    except config.ConfigError as error:
        import warnings

        warnings.warn(f"yolo_fastdetect: {error}; Ultralytics runs stock", RuntimeWarning, stacklevel=3)
        return False


if _switched_on():
    enable()
