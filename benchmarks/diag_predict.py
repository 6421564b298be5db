"""Diagnosis on the GPU machine: where a batch-1 model.predict call spends its host time (cProfile), patched."""

import cProfile
import pstats
import sys

import cv2
import torch
from ultralytics.utils import ASSETS

import yolo_fastdetect  # noqa: F401 - patches Ultralytics
from yolo_fastdetect.bench._timing import detecting_model

model = detecting_model(sys.argv[1] if len(sys.argv) > 1 else "yolov8s.yaml").to("cuda")
images = [cv2.imread(str(ASSETS / name)) for name in ("bus.jpg", "zidane.jpg")]
for i in range(8):
    model.predict([images[i % 2]], half=True, verbose=False)
torch.cuda.synchronize()
profile = cProfile.Profile()
profile.enable()
for i in range(40):
    results = model.predict([images[i % 2]], half=True, verbose=False)
profile.disable()
print("speed of the last call:", results[0].speed)
pstats.Stats(profile).sort_stats("cumulative").print_stats(40)
