"""Diagnosis on the GPU machine: where a RoIAlign call spends its time (kernels vs host), ours vs torchvision."""

import time

import torch
import torchvision
from torch.profiler import ProfilerActivity, profile

from yolo_fastdetect.bench.roi_align import random_boxes
from yolo_fastdetect.ops import MultiScaleRoIAlign, roi_align

g = torch.Generator().manual_seed(0)
for dtype in (torch.float32, torch.float16):
    feats = torch.randn(4, 256, 80, 80, generator=g).cuda().to(dtype).requires_grad_(True)
    rois = random_boxes(g, 1000, 4).cuda().to(dtype)
    cases = {
        "tv": lambda: torchvision.ops.roi_align(feats, rois, 7, 0.125, 2, True),
        "ours": lambda: roi_align(feats, rois, 7, 0.125, 2, "avg", True),
    }
    pyr = [torch.randn(4, 256, 640 // s, 640 // s, generator=g).cuda().to(dtype).requires_grad_(True) for s in (8, 16, 32)]
    boxes = [rois[rois[:, 0] == i, 1:] for i in range(4)]
    ms = MultiScaleRoIAlign(7, (8, 16, 32), 2, aligned=False)
    cases["ours_ms"] = lambda: ms(pyr, boxes)
    for name, fn in cases.items():
        for grad in (False, True):
            with torch.set_grad_enabled(grad):
                for _ in range(5):
                    out = fn()
                torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(50):
                    out = fn()
                host = (time.perf_counter() - t) / 50 * 1e3
                torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(50):
                    out = fn()
                torch.cuda.synchronize()
                wall = (time.perf_counter() - t) / 50 * 1e3
            print(f"{dtype} {name} grad={grad}: host {host:.3f} ms/call, wall(50 queued) {wall:.3f} ms/call")
        out = fn()
        go = torch.randn_like(out)
        inputs = pyr if name == "ours_ms" else [feats]
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                out = fn()
                torch.autograd.grad(out, inputs, go)
            torch.cuda.synchronize()
        print(f"--- {dtype} {name}: kernels over 10 forward+backward")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=70))
