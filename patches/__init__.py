"""Ultralytics integration: one module per patched place, each with ``apply()`` / ``revert()`` / ``is_applied()``.

Patches swap methods on Ultralytics classes (never module instances), record the originals and restore them
exactly. A patched method takes its fast path only where it applies and otherwise calls the original.
"""

from __future__ import annotations

from . import detect_head, nms, postprocess, predictor, results

PATCHES = (detect_head, nms, predictor, results, postprocess)

SUPPORTED_ULTRALYTICS = ("8.4.",)


def ultralytics_supported() -> bool:
    """Whether the installed Ultralytics is a version whose head and NMS the patches were written against."""
    import ultralytics

    return ultralytics.__version__.startswith(SUPPORTED_ULTRALYTICS)


def apply_all() -> None:
    """Apply every patch (idempotent)."""
    for patch in PATCHES:
        patch.apply()


def revert_all() -> None:
    """Revert every patch, restoring the original Ultralytics attributes (idempotent)."""
    for patch in reversed(PATCHES):
        patch.revert()


def applied() -> bool:
    """Whether every patch is currently applied."""
    return all(patch.is_applied() for patch in PATCHES)
