"""``copy_model`` (:mod:`yolo_fastdetect.model_copy`) against ``copy.deepcopy``, and the ``val_model_copy`` patch.

Real Ultralytics networks from YAML (detect, segment, pose, the attention blocks of yolo12) are copied both ways and
compared object by object: the same classes, attributes and tensors (values, dtype, strides, storage size,
``requires_grad``), none shared with the original, which stays as it was. Hand-made modules cover what takes
``deepcopy``'s way: a tensor attribute viewing a buffer, a parameter tied between two modules, a shared submodule, a
class that defines ``__deepcopy__``. With the patch, ``model.val`` validates ``copy_model``'s copy and leaves the
user's model alone.
"""

from __future__ import annotations

import copy
from unittest import mock

import pytest
import torch
from torch import nn

from conftest import detecting_model
from yolo_fastdetect import model_copy
from yolo_fastdetect.model_copy import copy_model
from yolo_fastdetect.patches import val_model_copy


def assert_same_copy(ours, stock, original, path: str = "model", seen: set | None = None) -> None:
    """``ours`` and ``stock`` (copies of ``original``) hold the same objects, tensors equal and none shared with
    ``original``."""
    seen = set() if seen is None else seen
    if id(ours) in seen:
        return
    seen.add(id(ours))
    assert type(ours) is type(stock), path
    if isinstance(stock, torch.Tensor):
        assert (ours.dtype, ours.shape, ours.stride(), ours.storage_offset(), ours.requires_grad) == \
            (stock.dtype, stock.shape, stock.stride(), stock.storage_offset(), stock.requires_grad), path
        assert ours.untyped_storage().nbytes() == stock.untyped_storage().nbytes(), path
        assert torch.equal(ours, stock), path
        assert ours.untyped_storage().data_ptr() != original.untyped_storage().data_ptr() or not ours.nbytes, \
            f"{path} shared"
    elif isinstance(stock, nn.Module):
        assert ours is not original and vars(ours).keys() == vars(stock).keys(), path
        for key, value in vars(stock).items():
            assert_same_copy(vars(ours)[key], value, vars(original)[key], f"{path}.{key}", seen)
    elif isinstance(stock, dict):
        assert type(ours) is type(stock) and list(ours) == list(stock), path
        assert ours is not original, path
        for key, value in stock.items():
            assert_same_copy(ours[key], value, original[key], f"{path}[{key!r}]", seen)
    elif isinstance(stock, (list, tuple)):
        assert len(ours) == len(stock), path
        for index, (a, b, c) in enumerate(zip(ours, stock, original)):
            assert_same_copy(a, b, c, f"{path}[{index}]", seen)
    elif isinstance(stock, set):
        assert ours == stock and ours is not original, path
    else:
        assert ours == stock or (ours != ours and stock != stock), path  # (NaN equals NaN here)


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {key: value.clone() for key, value in model.state_dict().items()}


@pytest.mark.parametrize("config", ["yolov8s.yaml", "yolo11n-seg.yaml", "yolo11n-pose.yaml", "yolo12n.yaml"])
def test_copy_of_a_network_is_deepcopys(config):
    network = detecting_model(config=config).model
    before = state(network)
    ours, stock = copy_model(network), copy.deepcopy(network)
    assert_same_copy(ours, stock, network)
    for parameter in ours.parameters():  # the copy's changes stay in the copy
        parameter.data.add_(1)
    after = network.state_dict()
    assert all(torch.equal(value, after[key]) for key, value in before.items())


class WithView(nn.Module):
    """A buffer and an attribute viewing part of it; a parameter tied with a child's; a child met twice."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.arange(12.0).reshape(3, 4))
        self.row = self.table[1]
        self.conv = nn.Conv2d(2, 2, 1)
        self.twin = nn.Conv2d(2, 2, 1)
        self.twin.weight = self.conv.weight
        self.again = self.conv
        self.frozen = nn.Parameter(torch.ones(3), requires_grad=False)
        self.settings = {"names": {0: "person"}, "strides": [8, 16]}


class OwnDeepcopy(nn.Linear):
    copies = 0

    def __deepcopy__(self, memo):
        OwnDeepcopy.copies += 1
        new = nn.Linear.__new__(OwnDeepcopy)
        memo[id(self)] = new
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return new


def test_sharing_is_kept_and_other_classes_copy_their_way():
    model = nn.Sequential(WithView(), OwnDeepcopy(3, 2))
    ours, stock = copy_model(model), copy.deepcopy(model)
    assert OwnDeepcopy.copies == 2  # its own __deepcopy__ ran for both copies
    assert_same_copy(ours, stock, model)
    view = ours[0]
    assert view.row.untyped_storage().data_ptr() == view.table.untyped_storage().data_ptr()
    view.table[1, 0] = -1
    assert view.row[0] == -1 and model[0].row[0] == 4  # the copy's view follows the copy's buffer only
    assert view.twin.weight is view.conv.weight and view.again is view.conv
    assert not view.frozen.requires_grad


def test_patched_get_model_copies_as_stocks_in_inference_mode():
    """model.val calls get_model in inference mode; stock's copy holds normal tensors (else AutoBackend copies the
    model again), and so does the patched method's."""
    from ultralytics.engine.validator import BaseValidator

    network = detecting_model(config="yolo11n.yaml").model
    copies = {}
    for patched in (False, True):  # (the package applies it on import: the test ends with it applied)
        (val_model_copy.apply if patched else val_model_copy.revert)()
        with torch.inference_mode():
            copies[patched] = BaseValidator.get_model(BaseValidator.__new__(BaseValidator), network)
    assert_same_copy(copies[True], copies[False], network)
    tensors = [*copies[True].parameters(), *copies[True].buffers()]
    assert tensors and not any(tensor.is_inference() for tensor in tensors)


def test_val_validates_the_fast_copy_and_leaves_the_model_alone(tmp_path):
    from yolo_fastdetect.bench._val_dataset import write_val_dataset

    model = detecting_model(config="yolo11n.yaml", logit_scale=2.0, background=-16.0)
    data = write_val_dataset(tmp_path / "set", model, 4, 160, "cpu", 0)
    before = state(model.model)
    assert val_model_copy.apply(), val_model_copy.PATCH.state()
    with mock.patch.object(val_model_copy, "copy_model", wraps=model_copy.copy_model) as copies:
        model.val(data=str(data), imgsz=160, batch=4, device="cpu", plots=False, project=str(tmp_path / "runs"))
    assert copies.call_count == 1 and copies.call_args.args[0] is model.model
    assert not model.model.is_fused()
    after = model.model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(value, after[key]) for key, value in before.items())
