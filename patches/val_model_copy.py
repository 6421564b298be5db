"""Patch ``BaseValidator.get_model``: the copy of the user's model that ``model.val`` validates, made faster.

Standalone validation starts by deep-copying the user's model (Ultralytics 8.4.1xx on), so that ``AutoBackend``'s
move to the device, fuse and half leave the user's model alone. The copy is ``copy.deepcopy``: about 50-90 ms of a
``model.val`` call on the development CPU for yolo12n (docs/design.md, Validation). The patched method returns
:func:`yolo_fastdetect.model_copy.copy_model`'s copy, the same modules, attributes and tensors in about half the
time, made outside inference mode as stock's method makes it (``AutoBackend`` copies a model holding inference tensors
once more); validation during training (the trainer's EMA, not copied) and anything but an ``nn.Module`` run stock's.

The plan checks behaviour: stock's method must hand back a copy of a probe model, equal to it and sharing no tensor
with it, and the trainer's EMA itself. Releases without ``get_model`` validate the user's model without copying it:
there is nothing to make faster.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn
from ultralytics.engine.validator import BaseValidator

from yolo_fastdetect.model_copy import copy_model

from ._patching import Patch, Replacement, parameters, require


def get_model(self: BaseValidator, model, trainer=None, *args, **kwargs):
    """Stock's ``get_model``, with :func:`~yolo_fastdetect.model_copy.copy_model` copying a model to validate
    alone."""
    if trainer is None and isinstance(model, nn.Module) and not args and not kwargs:
        # As stock's decorator runs it: tensors made in inference mode would have AutoBackend copy the model again.
        with torch.inference_mode(False), torch.no_grad():
            return copy_model(model)
    return PATCH.original("get_model")(self, model, trainer, *args, **kwargs)


def _is_independent_copy(copied, model: nn.Module) -> bool:
    """Whether ``copied`` is a copy of ``model`` with equal tensors, none of them shared."""
    if not isinstance(copied, type(model)) or copied is model:
        return False
    pairs = list(zip(copied.state_dict().values(), model.state_dict().values(), strict=True))
    return all(torch.equal(a, b) and a.data_ptr() != b.data_ptr() for a, b in pairs)


def _plan() -> list[Replacement]:
    """``get_model(model, trainer=None)`` on ``BaseValidator``, deep-copying a model to validate alone."""
    stock = getattr(BaseValidator, "get_model", None)
    require(callable(stock), "no BaseValidator.get_model: this release validates the model without copying it")
    require(parameters(stock)[:3] == ["self", "model", "trainer"],
            "BaseValidator.get_model is not (self, model, trainer, ...)")
    probe = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    with torch.inference_mode():  # where model.val calls it
        copied = stock(SimpleNamespace(), probe, None)
    require(_is_independent_copy(copied, probe), "BaseValidator.get_model does not return a deep copy of the model")
    require(not any(tensor.is_inference() for tensor in copied.state_dict().values()),
            "BaseValidator.get_model makes inference tensors in inference mode")
    ema = SimpleNamespace(ema=probe)
    require(stock(SimpleNamespace(), None, SimpleNamespace(ema=ema)) is probe,
            "BaseValidator.get_model does not return the trainer's EMA in training")
    return [Replacement(BaseValidator, "get_model", get_model)]


PATCH = Patch(
    "val_model_copy",
    "BaseValidator.get_model(model, trainer) deep-copying the model validated alone",
    _plan,
)
apply, revert, is_applied = PATCH.apply, PATCH.revert, PATCH.is_applied
