"""Patch ``ABlock.forward`` (YOLO12): a fused block's area attention and MLP in one operator call.

Stock's block is about thirty-five tensor calls from Python, each releasing the GIL and taking it back; in
``model.val``, whose loader reads its samples on threads, yolo12n's forward pass is slower than stock's (ours' inference
stage 0.63 against 0.44 ms an image on the H100 host: docs/design.md, Validation), most likely waiting for the GIL at
those calls. The patched method hands the block to :func:`yolo_fastdetect.ops.area_attention.area_attention_block`,
which makes the same ATen calls from C++, so the block's output is stock's bit for bit.

It applies to a block of a fused model (``BaseModel.fuse``: each ``Conv`` without its batch norm, running
``forward_fuse``) whose parts are stock's (``AAttn``, a two-``Conv`` MLP, plain stride-1 convolutions, SiLU after the
first MLP convolution only), without hooks on its parts, while gradients are off and nothing traces, exports or compiles
the model, with the operators loaded; anything else runs the stock method. The plan runs stock's forward and the
operator's Python reference on seeded blocks (one area and four), and learns which of the two scalings of the attention
this release uses (the queries, 8.4.1xx on, or their product with the keys); a block that matches neither keeps stock's
method.
"""

from __future__ import annotations

import sys
import weakref

import torch
from torch import nn
from ultralytics.nn.modules.block import AAttn, ABlock
from ultralytics.nn.modules.conv import Conv
from ultralytics.utils.torch_utils import fuse_conv_and_bn

from yolo_fastdetect import _ext
from yolo_fastdetect.ops.area_attention import area_attention_block, area_attention_block_reference

from ._patching import Patch, Replacement, parameters, require

# The activation after each of the block's convolutions, in the operator's order: qkv, pe, proj, mlp.0, mlp.1.
_ACTIVATIONS = (nn.Identity, nn.Identity, nn.Identity, nn.SiLU, nn.Identity)

# Whether this release scales the queries (True) or their product with the keys (False); set by the plan.
_scale_queries: bool | None = None


def _hooked(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks)


def _global_hooks() -> bool:
    hooks = nn.modules.module
    return bool(hooks._global_forward_hooks or hooks._global_forward_pre_hooks or hooks._global_backward_hooks
                or hooks._global_backward_pre_hooks)


def _convolutions(block: ABlock) -> tuple[Conv, ...] | None:
    """The block's five ``Conv`` in the operator's order, where the block is built as stock builds it."""
    attn, mlp = block.attn, block.mlp
    if type(attn) is not AAttn or "forward" in vars(attn) or type(mlp) is not nn.Sequential or len(mlp) != 2:
        return None
    return attn.qkv, attn.pe, attn.proj, mlp[0], mlp[1]


def operator_arguments(block: ABlock, x: torch.Tensor) -> tuple | None:
    """``(weights, biases, paddings, groups, num_heads, area)`` of the operator for ``block`` on ``x``, or None where
    the operator does not compute what stock's modules do (see the module's docstring)."""
    arguments = _block_arguments(block)
    if arguments is None or x.dim() != 4 or x.shape[1] // block.attn.num_heads != block.attn.head_dim:
        return None
    if (x.shape[2] * x.shape[3]) % block.attn.area:
        return None
    return arguments


def _parts(block: ABlock) -> tuple:
    """The objects :func:`_block_arguments` reads, by identity (a part replaced is a different object), with the
    hooks of each: read through the modules' own dictionaries, at a fraction of the checks' cost."""
    attn, mlp = block._modules.get("attn"), block._modules.get("mlp")
    parts = [attn, mlp, vars(attn).get("num_heads"), vars(attn).get("area"), vars(attn).get("head_dim")]
    for module in (*attn._modules.values(), *mlp._modules.values()):
        conv = module._modules.get("conv")
        parts += [module, conv, module._modules.get("act"), module._modules.get("bn"), vars(module).get("forward"),
                  conv._parameters.get("weight"), conv._parameters.get("bias")]
    return tuple(parts)


_arguments_of: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # block -> (its parts, its arguments)


def _block_arguments(block: ABlock) -> tuple | None:
    """The operator's arguments for ``block`` whatever the input, checked once per set of parts; None where they
    are not stock's (see the module's docstring) or a part has hooks."""
    try:
        parts = _parts(block)
    except AttributeError:  # parts that are not modules
        return None
    if any(_hooked(part) for part in parts if isinstance(part, nn.Module)):
        return None
    known = _arguments_of.get(block)
    if known is not None and len(known[0]) == len(parts) and all(a is b for a, b in zip(known[0], parts)):
        return known[1]
    arguments = _checked_arguments(block)
    _arguments_of[block] = (parts, arguments)
    return arguments


def _checked_arguments(block: ABlock) -> tuple | None:
    convolutions = _convolutions(block)
    if convolutions is None:
        return None
    weights, biases, paddings, groups = [], [], [], []
    for module, activation in zip(convolutions, _ACTIVATIONS):
        conv = getattr(module, "conv", None)
        if (type(module) is not Conv or hasattr(module, "bn") or type(module.act) is not activation
                or getattr(module.act, "inplace", False)
                or getattr(module.forward, "__func__", None) is not Conv.forward_fuse
                or type(conv) is not nn.Conv2d or conv.bias is None or conv.stride != (1, 1)
                or conv.dilation != (1, 1) or conv.padding_mode != "zeros" or not isinstance(conv.padding, tuple)
                or conv.padding[0] != conv.padding[1]):
            return None
        weights.append(conv.weight)
        biases.append(conv.bias)
        paddings.append(conv.padding[0])
        groups.append(conv.groups)
    return weights, biases, paddings, groups, block.attn.num_heads, block.attn.area


def _in_plain_inference() -> bool:
    """Gradients off, and no tracer, exporter or compiler watching the Python calls."""
    exporting = (getattr(torch.compiler, "is_exporting", bool)()
                 or "torch.onnx" in sys.modules and torch.onnx.is_in_onnx_export())  # (not imported: no export)
    return not (torch.is_grad_enabled() or torch.jit.is_tracing() or exporting or torch.compiler.is_compiling()
                or _global_hooks())


def forward(self: ABlock, x: torch.Tensor) -> torch.Tensor:
    """Stock's ``ABlock.forward``, in one operator call where it applies (see the module's docstring)."""
    if _scale_queries is not None and _in_plain_inference() and _ext.available():
        arguments = operator_arguments(self, x)
        if arguments is not None:
            return area_attention_block(x, *arguments, _scale_queries)
    return PATCH.original("forward")(self, x)


def fused_block(dim: int, num_heads: int, area: int, seed: int) -> ABlock:
    """A seeded ``ABlock`` fused as ``BaseModel.fuse`` fuses its ``Conv`` (batch norm folded in, ``forward_fuse``),
    with batch-norm statistics of a trained model's scale."""
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):  # the block's initialisation draws from the global generator
        torch.manual_seed(seed)
        block = ABlock(dim, num_heads, area=area)
    for module in block.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean = torch.randn(module.num_features, generator=generator) * 0.1
            module.running_var = torch.rand(module.num_features, generator=generator) + 0.5
    for module in block.modules():
        if type(module) is Conv:
            module.conv = fuse_conv_and_bn(module.conv, module.bn)
            delattr(module, "bn")
            module.forward = module.forward_fuse
    return block.eval()


def matching_scaling(stock_forward) -> bool | None:
    """Which scaling makes the operator's reference equal ``stock_forward`` on seeded fused blocks (True: the
    queries'), or None where neither does."""
    cases = [(fused_block(64, 2, area, seed=area), torch.randn(2, 64, 8, 12, generator=torch.Generator().manual_seed(
        area))) for area in (1, 4)]
    with torch.no_grad():
        expected = [stock_forward(block, x) for block, x in cases]
        for scale_queries in (True, False):
            if all(torch.equal(area_attention_block_reference(x, *operator_arguments(block, x), scale_queries), out)
                   for (block, x), out in zip(cases, expected)):
                return scale_queries
    return None


def _plan() -> list[Replacement]:
    """``forward(x)`` on ``ABlock``, computed as the operator computes it."""
    global _scale_queries
    stock = getattr(ABlock, "forward", None)
    require(callable(stock) and parameters(stock) == ["self", "x"], "ABlock.forward is not (self, x)")
    _scale_queries = matching_scaling(stock)
    require(_scale_queries is not None, "ABlock computes otherwise than the area_attention_block operator")
    return [Replacement(ABlock, "forward", forward)]


PATCH = Patch("area_attention", "ABlock (AAttn and its MLP) computing YOLO12's area attention as 8.3.x-8.4.x do",
              _plan)
apply, revert, is_applied = PATCH.apply, PATCH.revert, PATCH.is_applied
