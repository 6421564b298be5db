"""Patch ``BaseModel.fuse``: no model summary computed where Ultralytics' logger would drop it.

``AutoBackend`` fuses the model it is given (``model.val``'s copy of the user's model, each call; a predictor's, at
set-up) with ``fuse(verbose=True)``, and ``fuse`` then logs the model's summary: ``model_info`` counts its layers
and parameters and measures its GFLOPs, which runs ``thop`` over another deep copy of the model. That is one of the
larger parts of a ``model.val`` call's set-up (docs/design.md, Validation). With Ultralytics' logger set below INFO
(``YOLO_VERBOSE=False``, or a level set by hand) the line is dropped and nothing else reads the numbers: ``fuse``
returns the model either way. The patched method asks stock's ``fuse`` for ``verbose=False`` exactly then, so the
same fused model comes back without the summary; wherever the logger would print it, stock's call runs unchanged.
"""

from __future__ import annotations

import logging

from ultralytics.nn.tasks import BaseModel
from ultralytics.utils import LOGGER

from ._patching import Patch, Replacement, parameters, require


def summary_is_printed() -> bool:
    """Whether Ultralytics' logger prints INFO lines, the model summary among them."""
    return LOGGER.isEnabledFor(logging.INFO)


def fuse(self: BaseModel, verbose: bool = True, *args, **kwargs) -> BaseModel:
    """Stock's ``fuse``, with ``verbose`` off where Ultralytics' logger would not print its summary."""
    return PATCH.original("fuse")(self, verbose and summary_is_printed(), *args, **kwargs)


def _plan() -> list[Replacement]:
    """``fuse(verbose=True, ...)`` on ``BaseModel``, whose ``verbose=False`` only leaves out the summary."""
    stock = getattr(BaseModel, "fuse", None)
    require(callable(stock) and parameters(stock)[:2] == ["self", "verbose"],
            "BaseModel.fuse is not (self, verbose, ...)")
    require(isinstance(LOGGER, logging.Logger), "ultralytics.utils.LOGGER is not a logging.Logger")
    return [Replacement(BaseModel, "fuse", fuse)]


PATCH = Patch(
    "fuse_summary",
    "BaseModel.fuse(verbose, ...) logging the model summary through ultralytics.utils.LOGGER",
    _plan,
)
apply, revert, is_applied = PATCH.apply, PATCH.revert, PATCH.is_applied
