"""YOLO12's area-attention block of a fused model in one call: ``yolo_fastdetect::area_attention_block``.

Ultralytics' ``ABlock`` (``AAttn``, then a two-convolution MLP) is about thirty-five tensor calls from Python: five
convolutions, the attention's views, products and softmax, the residual sums. Each releases the GIL and takes it
back; where other threads want it (``model.val``'s loader reads its samples on threads), the forward pass waits at
each. The operator makes the same ATen calls, in the same order and with the same arguments, from C++ (registered
for CompositeImplicitAutograd, so autograd and ``torch.compile`` see those calls), so its output is the modules'
bit for bit, on every device and dtype. :func:`area_attention_block_reference` is the same sequence in Python, the
form ``patches/area_attention.py`` checks Ultralytics' modules against.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from .._ext import require

__all__ = ["area_attention_block", "area_attention_block_reference"]


def area_attention_block(x: torch.Tensor, weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor],
                         paddings: Sequence[int], groups: Sequence[int], num_heads: int, area: int,
                         scale_queries: bool) -> torch.Tensor:
    """A fused ``ABlock``'s forward pass: ``y = x + attn(x)``, then ``y + mlp(y)``.

    Args:
        x (torch.Tensor): (B, C, H, W) input, H * W a multiple of ``area``.
        weights (Sequence[torch.Tensor]): The five convolutions' weights, in the order qkv, pe, proj, mlp.0, mlp.1
            (each of stride 1 and dilation 1; a SiLU follows mlp.0).
        biases (Sequence[torch.Tensor]): Their biases (a fused convolution has one).
        paddings (Sequence[int]): Their padding, the same on both axes.
        groups (Sequence[int]): Their groups.
        num_heads (int): Attention heads (``AAttn.num_heads``); the head size is ``C // num_heads``.
        area (int): Areas the tokens are split into (``AAttn.area``).
        scale_queries (bool): Scale the queries by ``head_dim ** -0.5`` before their product with the keys
            (Ultralytics 8.4.1xx on); False scales the product (earlier releases).

    Returns:
        (torch.Tensor): (B, C, H, W), the block's output.

    Examples:
        >>> from ultralytics.nn.modules.block import ABlock
        >>> block = ABlock(64, 2, area=4).eval()  # unfused: fuse it as BaseModel.fuse does before calling
    """
    require()
    return torch.ops.yolo_fastdetect.area_attention_block(x, list(weights), list(biases), list(paddings),
                                                          list(groups), num_heads, area, scale_queries)


def area_attention_block_reference(x: torch.Tensor, weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor],
                                   paddings: Sequence[int], groups: Sequence[int], num_heads: int, area: int,
                                   scale_queries: bool) -> torch.Tensor:
    """:func:`area_attention_block` written out in Python, call for call as the operator makes them."""

    def convolution(tensor: torch.Tensor, index: int) -> torch.Tensor:
        return F.conv2d(tensor, weights[index], biases[index], (1, 1), (paddings[index],) * 2, (1, 1), groups[index])

    batch, channels, height, width = x.shape
    head_dim = channels // num_heads
    all_head_dim, tokens = head_dim * num_heads, height * width
    qkv = convolution(x, 0).flatten(2).transpose(1, 2)
    if area > 1:
        qkv = qkv.reshape(batch * area, tokens // area, all_head_dim * 3)
        batch, tokens, _ = qkv.shape
    q, k, v = qkv.view(batch, tokens, num_heads, head_dim * 3).permute(0, 2, 3, 1).split([head_dim] * 3, dim=2)
    scale = head_dim**-0.5
    attention = (q * scale).transpose(-2, -1) @ k if scale_queries else (q.transpose(-2, -1) @ k) * scale
    attention = attention.softmax(dim=-1)
    out = (v @ attention.transpose(-2, -1)).permute(0, 3, 1, 2)
    values = v.permute(0, 3, 1, 2)
    if area > 1:
        out = out.reshape(batch // area, tokens * area, all_head_dim)
        values = values.reshape(batch // area, tokens * area, all_head_dim)
        batch = out.shape[0]
    out = out.reshape(batch, height, width, all_head_dim).permute(0, 3, 1, 2).contiguous()
    values = values.reshape(batch, height, width, all_head_dim).permute(0, 3, 1, 2).contiguous()
    attended = x + convolution(out + convolution(values, 1), 2)
    return attended + convolution(F.silu(convolution(attended, 3)), 4)
