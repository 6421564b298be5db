"""A second-stage head trained on RoIAlign features of YOLO's own detections.

Runs offline on the CPU in seconds with a randomly initialised YAML model::

    python demo/second_stage.py --steps 20

1. ``capture_head_inputs`` hooks the Detect head, then ``predict`` runs on the two images shipped with Ultralytics.
2. ``roi_features`` gives the frozen P3+P4+P5 features of every detection (what a re-identification or attribute
   head would consume).
3. A small trainable head (a 1x1 conv per level, RoIAlign, then a linear classifier) learns to tell which image a
   box comes from. Gradients flow from the loss through ``roi_align``'s backward into the convs, which is what
   training a second stage on top of the detector's maps needs.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_VERBOSE", "false")

import torch  # noqa: E402
from torch import nn  # noqa: E402

import yolo_fastdetect  # noqa: E402
from yolo_fastdetect.ops import roi_align  # noqa: E402


class SecondStageHead(nn.Module):
    """Per-level 1x1 conv to a common width, RoIAlign of every box from every level, linear classifier."""

    def __init__(self, level_channels: list[int], strides: list[float], num_classes: int, width: int = 16,
                 output_size: int = 5) -> None:
        super().__init__()
        self.adapters = nn.ModuleList(nn.Conv2d(channels, width, 1) for channels in level_channels)
        self.scales = [1.0 / stride for stride in strides]
        self.output_size = output_size
        self.classifier = nn.Linear(len(level_channels) * width * output_size**2, num_classes)

    def forward(self, maps: list[torch.Tensor], rois: torch.Tensor) -> torch.Tensor:
        pooled = [
            roi_align(adapter(feature), rois, self.output_size, scale, sampling_ratio=2)
            for adapter, feature, scale in zip(self.adapters, maps, self.scales)
        ]
        return self.classifier(torch.cat(pooled, 1).flatten(1))


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the demo; returns the first and last loss and the adapters' gradient norm after the first step."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="yolo11n.yaml", help="an Ultralytics model (YAML: random weights, offline)")
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)

    from ultralytics import YOLO
    from ultralytics.utils import ASSETS

    torch.manual_seed(0)
    model = YOLO(args.model)
    capture = yolo_fastdetect.capture_head_inputs(model)
    images = [ASSETS / "bus.jpg", ASSETS / "zidane.jpg"]
    # A random YAML model scores everything near zero: conf=0 keeps its max_det best boxes.
    results = model.predict(images, imgsz=args.imgsz, conf=0.0, max_det=16, batch=len(images), device="cpu",
                            verbose=False)

    frozen = yolo_fastdetect.roi_features(model, results)
    print(f"roi_features: {[tuple(f.shape) for f in frozen]} (boxes, P3+P4+P5 channels, 7, 7) per image")

    # A random YAML model's activations shrink by orders of magnitude from level to level; standardise each
    # channel so the demo head sees unit-scale inputs (a trained detector does not need this). Computing it
    # outside inference mode also turns the captured inference tensors into ordinary ones.
    maps = [
        (feature - feature.mean((0, 2, 3), keepdim=True)) / (feature.std((0, 2, 3), keepdim=True) + 1e-12)
        for feature in capture.features
    ]
    rois = yolo_fastdetect.detection_rois(results, capture.input_shape)
    labels = rois[:, 0].long()  # which image each box came from
    head = SecondStageHead([m.shape[1] for m in maps], capture.strides.tolist(), num_classes=len(images))
    optimiser = torch.optim.Adam(head.parameters(), lr=1e-2)
    losses, adapter_grad_norm = [], None
    for step in range(args.steps):
        loss = nn.functional.cross_entropy(head(maps, rois), labels)
        optimiser.zero_grad()
        loss.backward()
        if adapter_grad_norm is None:
            adapter_grad_norm = sum(a.weight.grad.norm().item() for a in head.adapters)
        optimiser.step()
        losses.append(loss.item())
        if step % 5 == 0 or step == args.steps - 1:
            print(f"step {step:3d}  loss {loss.item():.4f}")
    print(f"gradient reaching the per-level convs through roi_align: {adapter_grad_norm:.3e}")
    return {"first_loss": losses[0], "last_loss": losses[-1], "adapter_grad_norm": adapter_grad_norm}


if __name__ == "__main__":
    main()
