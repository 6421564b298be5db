"""The mechanism every patch shares: what it requires of Ultralytics, what it replaces, the originals, its state.

A :class:`Patch` is built from a ``plan``: a function that imports what the patch replaces, checks that it is there
and shaped as the patch expects (attributes, call signatures, what a stock method returns on a cheap probe) and
returns the :class:`Replacement` list, or raises :class:`Declined` with the reason it cannot. The plan runs once, at
the first ``apply()``; a declined patch stays off and Ultralytics keeps its own methods there.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_ABSENT = object()  # the owner's own namespace had no such entry (a class inheriting the method)


class Declined(Exception):
    """A patch's plan found Ultralytics without what the patch replaces, or with it in another shape; the message
    says what."""


@dataclass(frozen=True)
class Replacement:
    """``owner.name = new`` (``owner`` a class or a module)."""

    owner: Any
    name: str
    new: Any


@dataclass
class _Original:
    own: Any  # the owner's own entry, or _ABSENT: what revert() puts back
    resolved: Any  # what ``owner.name`` found before the patch (inherited included): what the patch calls


class Patch:
    """One patched place of Ultralytics, applied and reverted as a whole.

    Args:
        name: Short name for logs (``detect_head``, ``nms``, ...).
        requires: What the patch needs of Ultralytics, in words (``yolo-fastdetect info`` and the version guard print
            it).
        plan: Checks Ultralytics and returns the replacements; raises :class:`Declined` where it cannot patch.
        on_revert: Called after the originals are back (e.g. to drop cached CUDA graphs).
    """

    def __init__(self, name: str, requires: str, plan: Callable[[], list[Replacement]],
                 on_revert: Callable[[], None] | None = None) -> None:
        self.name, self.requires = name, requires
        self._plan, self._on_revert = plan, on_revert
        self._replacements: list[Replacement] | None = None
        self._originals: dict[str, _Original] = {}
        self.reason: str | None = None  # why the plan declined, once it has

    def _planned(self) -> list[Replacement] | None:
        """The replacements, planning them at the first call; None where the plan declined."""
        if self._replacements is None and self.reason is None:
            try:
                self._replacements = self._plan()
            except Declined as declined:
                self.reason = str(declined)
            except Exception as error:  # noqa: BLE001 - an Ultralytics the checks did not foresee: stock, said why
                self.reason = f"checking Ultralytics failed: {type(error).__name__}: {error}"
        return self._replacements

    def available(self) -> bool:
        """Whether the plan's checks pass on this Ultralytics (running them now if they have not run)."""
        return self._planned() is not None

    def apply(self) -> bool:
        """Install the replacements, recording the originals (idempotent); False where the patch declines."""
        if self.is_applied():
            return True
        replacements = self._planned()
        if replacements is None:
            return False
        for replacement in replacements:
            owner, name = replacement.owner, replacement.name
            self._originals[name] = _Original(vars(owner).get(name, _ABSENT), inspect.getattr_static(owner, name))
            setattr(owner, name, replacement.new)
        return True

    def revert(self) -> None:
        """Restore the originals exactly (an inherited method is inherited again) and run ``on_revert``
        (idempotent). The record stays, so a patched method still held somewhere keeps calling the original."""
        if not self.is_applied():
            return
        for replacement in self._replacements:
            own = self._originals[replacement.name].own
            if own is _ABSENT:
                delattr(replacement.owner, replacement.name)
            else:
                setattr(replacement.owner, replacement.name, own)
        if self._on_revert is not None:
            self._on_revert()

    def is_applied(self) -> bool:
        """Whether every replacement is in place."""
        return self._replacements is not None and all(
            vars(r.owner).get(r.name) is r.new for r in self._replacements)

    def original(self, name: str) -> Any:
        """What ``owner.name`` was before the patch (a function as the class holds it: call it with ``self``).

        Raises:
            KeyError: The patch has never been applied, so there is no record of ``name``.
        """
        return self._originals[name].resolved

    def state(self) -> str:
        """``on``, ``off`` (reverted or never applied) or ``off (reason)`` where the plan declined."""
        if self.is_applied():
            return "on"
        return f"off ({self.reason})" if self.reason else "off"


def declined(name: str, reason: str) -> Patch:
    """A patch that always declines with ``reason`` (its module could not be imported on this Ultralytics)."""

    def plan() -> list[Replacement]:
        raise Declined(reason)

    return Patch(name, "", plan)


def parameters(function: Callable) -> list[str]:
    """Names of ``function``'s parameters, ``self`` included for a function a class holds."""
    return list(inspect.signature(function).parameters)


def require(condition: bool, reason: str) -> None:
    """Raise :class:`Declined` with ``reason`` unless ``condition``.

    Raises:
        Declined: ``condition`` is false.
    """
    if not condition:
        raise Declined(reason)
