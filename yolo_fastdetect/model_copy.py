"""A deep copy of a model, the copy ``copy.deepcopy`` makes, in a fraction of its time.

Stock ``model.val`` starts by deep-copying the user's model (``BaseValidator.get_model``), so that moving, fusing and
halving it for validation leaves the user's model alone. ``copy.deepcopy`` spends most of that copy in its generic
machinery: every module goes through ``__reduce_ex__``, each of its dozen hook dictionaries (empty) is rebuilt
through ``OrderedDict.__reduce__``, and each buffer goes through ``Tensor.__deepcopy__``, which wraps its storage in
a ``TypedStorage`` to copy it (docs/design.md, Validation: the copy of yolo12n took about 90 ms on the development
CPU, 40 of them its buffers).

:func:`copy_model` walks the module tree itself and takes the short way where it gives the same result: a module
whose class pickles as ``nn.Module`` does gets a new instance, and its ``__setstate__`` a copy of its state; its
parameters are copied as ``Parameter.__deepcopy__`` copies them; a plain buffer that alone fills its storage is
cloned, which is what ``Tensor.__deepcopy__`` makes of it; an empty ``dict``, ``OrderedDict`` or ``set`` becomes a
new empty one of its type. Everything else (other attributes, tensors that share storage or carry attributes,
modules of classes that pickle otherwise) goes through ``copy.deepcopy`` with the same memo, so shared objects stay
shared in the copy.
"""

from __future__ import annotations

import copy
import copyreg
from collections import OrderedDict

import torch
from torch import nn

__all__ = ["copy_model"]

_EMPTY_CONTAINERS = (dict, OrderedDict, set)


def _pickles_as_module(cls: type) -> bool:
    """Whether ``copy.deepcopy`` copies instances of ``cls`` as it copies a plain ``nn.Module``: a new instance
    (``object.__reduce_ex__``, no slots) given a copy of what ``__getstate__`` returns through ``__setstate__``."""
    return (cls.__reduce_ex__ is object.__reduce_ex__ and cls.__reduce__ is object.__reduce__
            and getattr(cls, "__deepcopy__", None) is None and cls not in copyreg.dispatch_table
            and cls.__getstate__ is nn.Module.__getstate__ and not copyreg._slotnames(cls))


def _storage_address(tensor: torch.Tensor) -> int:
    """Where a strided tensor's storage starts."""
    return tensor.data_ptr() - tensor.storage_offset() * tensor.element_size()


def _unshared_storages(model: nn.Module) -> set[int]:
    """Storage addresses of the model's parameters, buffers and tensor attributes held by one tensor each."""
    counts: dict[int, int] = {}
    for module in model.modules():
        for value in (*module._parameters.values(), *module._buffers.values(), *vars(module).values()):
            if isinstance(value, torch.Tensor) and value.layout == torch.strided:
                address = _storage_address(value)
                counts[address] = counts.get(address, 0) + 1
    return {address for address, count in counts.items() if count == 1}


def _fills_its_storage(tensor: torch.Tensor) -> bool:
    """A plain dense leaf tensor, alone in a storage it fills from the start: ``Tensor.__deepcopy__`` makes a clone
    of it (same strides, a storage of the same size)."""
    return (type(tensor) is torch.Tensor and tensor.is_leaf and tensor.layout == torch.strided
            and tensor.device.type in ("cpu", "cuda") and tensor.grad is None and not tensor.__dict__
            and not tensor.is_conj() and not tensor.is_neg() and not tensor.is_quantized
            and tensor.storage_offset() == 0 and tensor.is_contiguous()
            and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size())


class _Copier:
    """One copy: the memo (as ``copy.deepcopy``'s) and the storages a clone may take."""

    def __init__(self, model: nn.Module):
        self.memo: dict[int, object] = {}
        self.unshared = _unshared_storages(model)

    def module(self, module: nn.Module) -> nn.Module:
        if id(module) in self.memo:
            return self.memo[id(module)]
        cls = type(module)
        if not _pickles_as_module(cls):
            return copy.deepcopy(module, self.memo)
        new = cls.__new__(cls)
        self.memo[id(module)] = new
        state = {}
        for key, value in module.__getstate__().items():
            if key == "_modules":
                state[key] = self.container(value, lambda child: None if child is None else self.module(child))
            elif key == "_parameters":
                state[key] = self.container(value, self.parameter)
            elif key == "_buffers":
                state[key] = self.container(value, self.buffer)
            else:
                state[key] = self.value(value)
        new.__setstate__(state)
        return new

    def container(self, mapping: dict, copy_item) -> dict:
        """A copy of the dict of ``_modules``, ``_parameters`` or ``_buffers``, its values copied by ``copy_item``."""
        if id(mapping) in self.memo:
            return self.memo[id(mapping)]
        if type(mapping) not in (dict, OrderedDict):
            return copy.deepcopy(mapping, self.memo)
        new = type(mapping)()
        self.memo[id(mapping)] = new
        for key, item in mapping.items():
            new[key] = copy_item(item)
        return new

    def parameter(self, parameter: nn.Parameter | None) -> nn.Parameter | None:
        if parameter is None or id(parameter) in self.memo or type(parameter) is not nn.Parameter:
            return copy.deepcopy(parameter, self.memo)
        new = nn.Parameter(parameter.data.clone(memory_format=torch.preserve_format), parameter.requires_grad)
        self.memo[id(parameter)] = new  # what Parameter.__deepcopy__ makes
        return new

    def buffer(self, tensor: torch.Tensor | None) -> torch.Tensor | None:
        if (tensor is None or id(tensor) in self.memo or not _fills_its_storage(tensor)
                or _storage_address(tensor) not in self.unshared):
            return copy.deepcopy(tensor, self.memo)
        with torch.no_grad():
            new = tensor.clone()
        if tensor.requires_grad:
            new.requires_grad_()
        self.memo[id(tensor)] = new
        return new

    def value(self, value: object) -> object:
        if isinstance(value, torch.Tensor):
            return self.buffer(value)
        if type(value) in _EMPTY_CONTAINERS and not value and id(value) not in self.memo:
            new = type(value)()
            self.memo[id(value)] = new
            return new
        return copy.deepcopy(value, self.memo)


def copy_model(model: nn.Module) -> nn.Module:
    """``copy.deepcopy(model)``, made faster: the same module tree, attributes and tensors, none shared with
    ``model`` (see the module docstring).

    Args:
        model (nn.Module): The model to copy; left unchanged.

    Returns:
        (nn.Module): The copy.

    Examples:
        >>> model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))
        >>> twin = copy_model(model)
        >>> twin is not model and torch.equal(twin[1].running_var, model[1].running_var)
        True
    """
    copier = _Copier(model)
    copied = copier.module(model)
    copier.memo.clear()  # (what deepcopy keeps alive in its memo is ours to drop)
    return copied
