"""The ``fuse_summary`` patch (``patches/fuse_summary.py``): with Ultralytics' logger below INFO the patched ``fuse``
gives stock's fused model without measuring the summary; at INFO it logs stock's summary line."""

from __future__ import annotations

import copy
import logging
from unittest import mock

import pytest
import torch
import ultralytics.utils.torch_utils as torch_utils
from torch.utils._pytree import tree_flatten
from ultralytics.utils import LOGGER

from conftest import detecting_model
from yolo_fastdetect.patches import fuse_summary


@pytest.fixture(autouse=True)
def stock_fuse():
    """Each test starts with stock's ``fuse`` (the patch's record of it made); the patch's state and the logger's
    level are restored after it (a patch left off would turn the package off for the tests after)."""
    applied = fuse_summary.is_applied()
    assert fuse_summary.apply(), fuse_summary.PATCH.state()
    fuse_summary.revert()
    level = LOGGER.level
    yield
    (fuse_summary.apply if applied else fuse_summary.revert)()
    LOGGER.setLevel(level)


def fused(model, patched: bool):
    """A fused copy of ``model`` (an Ultralytics ``YOLO``'s network) by stock's or the patched ``fuse``, with the
    times ``get_flops`` (the summary's GFLOPs) ran."""
    (fuse_summary.apply if patched else fuse_summary.revert)()
    with mock.patch.object(torch_utils, "get_flops", wraps=torch_utils.get_flops) as flops:
        made = copy.deepcopy(model).fuse()
    return made, flops.call_count


@pytest.mark.parametrize("config", ["yolo11n.yaml", "yolo12n.yaml"])
def test_quiet_fuse_is_stocks_without_the_summary(config, generator):
    """Logger at ERROR (``YOLO_VERBOSE=False``): the patched ``fuse`` measures no GFLOPs, and its model's state and
    outputs on a random non-square batch are stock's fused model's, bit for bit."""
    network = detecting_model(config=config).model
    LOGGER.setLevel(logging.ERROR)
    stock, stock_flops = fused(network, patched=False)
    ours, our_flops = fused(network, patched=True)
    assert (stock_flops, our_flops) == (1, 0)
    assert stock.is_fused() and ours.is_fused()
    assert stock.state_dict().keys() == ours.state_dict().keys()
    for key, value in stock.state_dict().items():
        assert torch.equal(value, ours.state_dict()[key]), key
    images = torch.rand(2, 3, 224, 320, generator=generator)
    with torch.inference_mode():
        expected, got = tree_flatten(stock.eval()(images))[0], tree_flatten(ours.eval()(images))[0]
    assert len(expected) == len(got) > 0
    assert all(torch.equal(a, b) for a, b in zip(expected, got))


def test_summary_is_logged_as_stock_logs_it():
    """Logger at INFO: the patched ``fuse`` runs stock's call, summary and GFLOPs included, word for word."""
    network = detecting_model(config="yolo11n.yaml").model
    LOGGER.setLevel(logging.INFO)
    lines = {}
    for patched in (False, True):
        with mock.patch.object(LOGGER, "info") as info:
            _, flops = fused(network, patched)
        lines[patched] = ([call.args for call in info.call_args_list], flops)
    assert lines[True] == lines[False]
    assert lines[True][1] == 1 and any("GFLOPs" in str(args) for args in lines[True][0])
