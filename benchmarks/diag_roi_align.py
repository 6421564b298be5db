"""Diagnosis on the GPU machine: where a RoIAlign call spends its time (kernels vs host), ours vs torchvision.

Per case: host ms per call (calls queued without syncing), host ms of one call on an idle GPU, the benchmark's
single-call median (CUDA events around one call after a sync), the GPU time alone (CUDA graph replay), and the
kernels of the forward pass.
"""

import time

import torch
import torchvision
from torch.profiler import ProfilerActivity, profile

from yolo_fastdetect.bench._timing import graph_median_ms, single_call_median_ms
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
    pyr = [
        torch.randn(4, 256, 640 // s, 640 // s, generator=g).cuda().to(dtype).requires_grad_(True) for s in (8, 16, 32)
    ]
    boxes = [rois[rois[:, 0] == i, 1:] for i in range(4)]
    ms = MultiScaleRoIAlign(7, (8, 16, 32), 2, aligned=False)
    named = dict(zip(["p3", "p4", "p5"], pyr))
    tv_ms = torchvision.ops.MultiScaleRoIAlign(["p3", "p4", "p5"], 7, 2)
    cases["ours_ms"] = lambda: ms(pyr, boxes)
    cases["tv_ms"] = lambda: tv_ms(named, boxes, [(640, 640)] * 4)
    for name, fn in cases.items():
        for grad in (False, True):
            with torch.set_grad_enabled(grad):
                for _ in range(5):
                    fn()
                torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(50):
                    fn()
                host = (time.perf_counter() - t) / 50 * 1e3
                torch.cuda.synchronize()
                latencies = []
                for _ in range(30):  # host time of one call on an idle GPU, until it returns
                    t = time.perf_counter()
                    fn()
                    latencies.append((time.perf_counter() - t) * 1e3)
                    torch.cuda.synchronize()
                latency = sorted(latencies)[len(latencies) // 2]
                single = single_call_median_ms(fn, "cuda", 50, 10)
                gpu = graph_median_ms(lambda: fn(), [()]) if grad is False else None
            gpu_text = f"{gpu:.3f}" if gpu is not None else "-"
            print(
                f"{dtype} {name} grad={grad}: host {host:.3f}  latency {latency:.3f}  single-call {single:.3f}  "
                f"gpu(graph) {gpu_text} ms"
            )
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=60))
