"""Diagnosis on the GPU machine: kernel times of one RoIAlign forward on (4, 64, 160, 160), NCHW and channels-last."""

import torch
from torch.profiler import ProfilerActivity, profile

from yolo_fastdetect.bench._timing import single_call_median_ms
from yolo_fastdetect.bench.roi_align import random_boxes
from yolo_fastdetect.ops import roi_align

g = torch.Generator().manual_seed(0)
for dtype in (torch.float32, torch.float16):
    for layout in (torch.contiguous_format, torch.channels_last):
        feats = torch.randn(4, 64, 160, 160, generator=g).cuda().to(dtype).contiguous(memory_format=layout)
        rois = random_boxes(g, 1000, 4).cuda().to(dtype)
        fn = lambda: roi_align(feats, rois, 7, 0.25, 2, "avg", True)  # noqa: E731
        single = single_call_median_ms(fn, "cuda", 50, 10)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
        kernels = {e.key[:60]: e.device_time_total / 10 for e in prof.key_averages() if e.device_time_total > 0}
        print(dtype, layout, f"single-call {single:.3f} ms", {k: round(v, 1) for k, v in kernels.items()})
