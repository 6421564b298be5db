"""Ultralytics integration: one module per patched place, each a :class:`~._patching.Patch` (``PATCH``) with
module-level ``apply()`` / ``revert()`` / ``is_applied()``.

Patches swap methods on Ultralytics classes (never module instances), record the originals and restore them
exactly. Each checks, when it is first applied, that what it replaces is there and shaped as it expects, and
otherwise declines with a reason while the others apply; a patched method takes its fast path only where it applies
and otherwise calls the original. Nothing here raises on another Ultralytics release, or with none installed.
"""

from __future__ import annotations

import importlib
import re
import warnings

from ._patching import Patch, declined

# The releases the version matrix (tests/test_versions.py) runs: the oldest and the newest.
OLDEST_TESTED, NEWEST_TESTED = "8.3.0", "8.4.190"

_NAMES = ("detect_head", "nms", "predictor", "sources", "results", "postprocess", "val_loader", "val_metrics",
          "val_matching", "fuse_summary", "val_model_copy", "profile_sync", "area_attention")


def _load(name: str) -> Patch:
    """The module's ``PATCH``, or one that declines where the module cannot be imported on this Ultralytics."""
    try:
        return importlib.import_module(f"{__name__}.{name}").PATCH
    except Exception as error:  # noqa: BLE001 - an absent or different Ultralytics must never break the import
        return declined(name, f"cannot import what it patches: {type(error).__name__}: {error}")


PATCHES: tuple[Patch, ...] = tuple(_load(name) for name in _NAMES)
_warned: set[str] = set()


def ultralytics_version() -> str | None:
    """The installed Ultralytics' version string, or None where there is none (or it cannot be imported)."""
    try:
        import ultralytics
    except Exception:  # noqa: BLE001 - a broken install counts as none
        return None
    return str(getattr(ultralytics, "__version__", "unknown"))


def release(version: str) -> tuple[int, ...]:
    """``"8.4.190"`` -> ``(8, 4, 190)``; the leading numbers only (``"8.5.0rc1"`` -> ``(8, 5, 0)``)."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


def untested_note(version: str | None) -> str | None:
    """One line saying the installed release is outside the tested range, or None inside it."""
    if version is None:
        return "Ultralytics is not installed (or cannot be imported)"
    if not release(version) or not release(OLDEST_TESTED) <= release(version) <= release(NEWEST_TESTED):
        return f"Ultralytics {version} is untested (tested: {OLDEST_TESTED} to {NEWEST_TESTED})"
    return None


def apply_all() -> bool:
    """Apply every patch whose checks pass (idempotent) and warn once per message about the others and about an
    untested release. Returns whether any patch is applied."""
    applied_any = any([patch.apply() for patch in PATCHES])  # a list: every patch is tried
    version = ultralytics_version()
    messages = [untested_note(version)]
    off = [f"{patch.name} ({patch.reason})" for patch in PATCHES if patch.reason]
    if off:
        messages.append(f"on Ultralytics {version or '(none)'} these patches are off, running stock there: "
                        f"{'; '.join(off)}")
    for message in filter(None, messages):
        if message not in _warned:
            _warned.add(message)
            warnings.warn(f"yolo_fastdetect: {message}", stacklevel=3)
    return applied_any


def revert_all() -> None:
    """Revert every patch, restoring the original Ultralytics attributes (idempotent)."""
    for patch in reversed(PATCHES):
        patch.revert()


def applied() -> bool:
    """Whether the package is enabled: every patch whose checks pass is applied, and at least one does."""
    return (any(patch.is_applied() for patch in PATCHES)
            and all(patch.is_applied() or patch.reason for patch in PATCHES))


def states() -> dict[str, str]:
    """Each patch's :meth:`~._patching.Patch.state`, by name."""
    return {patch.name: patch.state() for patch in PATCHES}
