"""YOLO12's area-attention block in one operator call (``ops/area_attention.py``, ``patches/area_attention.py``):
the operator against its Python reference and against stock's fused ``ABlock``, bit for bit, a whole yolo12n.yaml
with the patch on and off, where the patch gives way to stock's method, and the plan's probe."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from torch import nn
from ultralytics.nn.modules.block import ABlock
from ultralytics.nn.tasks import DetectionModel

from yolo_fastdetect.ops import area_attention_block, area_attention_block_reference
from yolo_fastdetect.patches import area_attention
from yolo_fastdetect.patches._patching import Declined

STOCK_FORWARD = area_attention.PATCH.original("forward") if area_attention.is_applied() else ABlock.forward


@pytest.fixture(autouse=True)
def patched():
    """Each test starts with the patch applied (its plan run) and leaves it so."""
    assert area_attention.apply(), area_attention.PATCH.state()
    yield
    area_attention.apply()


def random_case(generator: torch.Generator, dtype: torch.dtype = torch.float32):
    """A fused block of random width, heads and area, and a non-square input whose tokens the area divides."""
    heads = int(torch.randint(1, 4, (1,), generator=generator))
    dim = 32 * heads * int(torch.randint(1, 3, (1,), generator=generator))
    area = [1, 2, 4][int(torch.randint(0, 3, (1,), generator=generator))]
    height, width = 4 * int(torch.randint(1, 5, (1,), generator=generator)), 4 * int(torch.randint(1, 6, (1,),
                                                                                                   generator=generator))
    block = area_attention.fused_block(dim, heads, area, seed=int(torch.randint(0, 2**31, (1,), generator=generator)))
    x = torch.randn(int(torch.randint(1, 4, (1,), generator=generator)), dim, height, width, generator=generator)
    return block.to(dtype), x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_operator_is_the_reference_and_stocks_block(generator, dtype):
    with torch.no_grad():
        for _ in range(6):
            block, x = random_case(generator, dtype)
            arguments = area_attention.operator_arguments(block, x)
            assert arguments is not None
            for scale_queries in (True, False):
                reference = area_attention_block_reference(x, *arguments, scale_queries)
                assert torch.equal(area_attention_block(x, *arguments, scale_queries), reference), scale_queries
            assert torch.equal(area_attention_block(x, *arguments, area_attention._scale_queries),
                               STOCK_FORWARD(block, x)), (x.shape, block.attn.area)


def counted_operator():
    """The patch's operator call, wrapped to count its calls."""
    return mock.patch.object(area_attention, "area_attention_block", wraps=area_attention.area_attention_block)


def yolo12n(device: str = "cpu") -> DetectionModel:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = DetectionModel("yolo12n.yaml", verbose=False)
    return model.fuse(verbose=False).eval().to(device)


def test_patched_model_is_stocks(generator):
    """yolo12n.yaml (eight blocks, areas 4 and 1), a batch of two non-square images: the same outputs, with every
    block through the operator."""
    model = yolo12n()
    x = torch.rand(2, 3, 224, 288, generator=generator)
    with torch.inference_mode():
        with counted_operator() as calls:
            ours = model(x)
        area_attention.revert()
        stock = model(x)
    assert calls.call_count == sum(isinstance(module, ABlock) for module in model.modules()) == 8
    assert torch.equal(ours[0], stock[0])


@pytest.mark.filterwarnings("ignore:`torch.jit.trace:FutureWarning")
def test_stocks_method_runs_where_the_operator_does_not_apply(generator):
    """Gradients on, an unfused block, a hook on a part, a tracer, a part replaced after a first call: stock's method,
    the same output."""
    block, x = random_case(generator)
    unfused = ABlock(64, 2, area=4).eval()
    cases = {
        "gradients": (block, x, torch.enable_grad),
        "unfused": (unfused, torch.randn(1, 64, 8, 8, generator=generator), torch.no_grad),
    }
    for case, (module, tensor, mode) in cases.items():
        with mode(), counted_operator() as calls:
            assert torch.equal(module(tensor), STOCK_FORWARD(module, tensor)), case
        assert calls.call_count == 0, case
    with torch.no_grad():
        handle = block.attn.pe.conv.register_forward_hook(lambda *args: None)
        with counted_operator() as calls:
            block(x)
        handle.remove()
        with counted_operator() as calls_after:
            block(x)
        with counted_operator() as traced:
            torch.jit.trace(block, x, check_trace=False)
        block.mlp[0].act = nn.ReLU()
        with counted_operator() as replaced:
            assert torch.equal(block(x), STOCK_FORWARD(block, x))
    assert (calls.call_count, calls_after.call_count, traced.call_count, replaced.call_count) == (0, 1, 0, 0)


def test_export_sees_stocks_calls(generator):
    """``torch.export`` (under which ONNX's exporter and others trace) records the modules' calls, not the operator."""
    block, x = random_case(generator)
    with torch.no_grad(), counted_operator() as calls:
        program = torch.export.export(block, (x,))
    assert calls.call_count == 0
    assert "yolo_fastdetect" not in str(program.graph)
    assert torch.equal(program.module()(x), STOCK_FORWARD(block, x))


def test_operator_names_bad_arguments(generator):
    block, x = random_case(generator)
    weights, biases, paddings, groups, heads, _ = area_attention.operator_arguments(block, x)
    with pytest.raises(RuntimeError, match="must each hold 5 entries"):
        area_attention_block(x, weights[:4], biases, paddings, groups, heads, 1, True)
    with pytest.raises(RuntimeError, match="must be a multiple of area"):
        area_attention_block(x[..., :3, :3], weights, biases, paddings, groups, heads, 2, True)
    with pytest.raises(RuntimeError, match=r"x must be \(B, C, H, W\)"):
        area_attention_block(x[0], weights, biases, paddings, groups, heads, 1, True)


def test_plan_learns_the_scaling_and_declines_otherwise(monkeypatch):
    """Releases up to 8.4.0 scale the attention's product, later ones its queries; a block computing something else
    keeps stock's method. The probe leaves the global random state as it was."""
    state = torch.get_rng_state()
    assert area_attention.matching_scaling(STOCK_FORWARD) is True
    assert torch.equal(torch.get_rng_state(), state)

    def product_scaled(self, x):
        return area_attention_block_reference(x, *area_attention.operator_arguments(self, x), False)

    assert area_attention.matching_scaling(product_scaled) is False
    monkeypatch.setattr(area_attention, "_scale_queries", area_attention._scale_queries)  # restored after the test
    monkeypatch.setattr(ABlock, "forward", lambda self, x: product_scaled(self, x) * 1.0001)
    with pytest.raises(Declined, match="computes otherwise"):
        area_attention._plan()


@pytest.mark.cuda
@pytest.mark.parametrize("half", [False, True])
def test_patched_model_is_stocks_on_the_gpu(generator, half):
    """On the GPU with torch's default flags, fp32 and fp16: the same outputs, every block through the operator."""
    model = yolo12n("cuda")
    x = torch.rand(2, 3, 224, 288, generator=generator).cuda()
    if half:
        model, x = model.half(), x.half()
    with torch.inference_mode():
        with counted_operator() as calls:
            ours = model(x)
        area_attention.revert()
        stock = model(x)
    assert calls.call_count == 8
    assert torch.equal(ours[0], stock[0])
