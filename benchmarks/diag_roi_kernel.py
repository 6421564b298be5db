"""Diagnosis on the GPU machine: a few RoIAlign forward and backward calls of the benchmark's case, for ncu."""

import torch

from yolo_fastdetect.bench.roi_align import random_boxes
from yolo_fastdetect.ops import roi_align

g = torch.Generator().manual_seed(0)
for dtype in (torch.float32, torch.float16):
    feats = torch.randn(4, 256, 80, 80, generator=g).cuda().to(dtype).requires_grad_(True)
    rois = random_boxes(g, 1000, 4).cuda().to(dtype)
    out = roi_align(feats, rois, 7, 0.125, 2, "avg", True)
    out.backward(torch.randn_like(out))
torch.cuda.synchronize()
