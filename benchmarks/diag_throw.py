"""Diagnosis on the GPU machine: does an argument error raised inside the operator reach Python?"""

import sys

import torch

from yolo_fastdetect import _ext

_ext.require()
for device in ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",):
    try:
        boxes, scores = torch.randn(64, 91, device=device), torch.randn(2, 5, 91, device=device)
        torch.ops.yolo_fastdetect.detect_decode(boxes, scores, [7, 13], [16.0], 16, True)
    except ValueError as error:
        print(f"{device}: ValueError raised as expected: {str(error).splitlines()[0]}")
    sys.stdout.flush()
