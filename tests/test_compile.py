"""The patched head under torch.compile, and ``model.predict(compile=...)`` against stock Ultralytics.

On the CPU (fast, no inductor): the fused network traces into one graph with no graph break, where stock's head
breaks it at ``make_anchors``' ``.item()`` calls on a shape's first call, and compiles once per input shape, where
stock recompiles on the shape's second call too. On a GPU: predictions in each setting (eager, CUDA graphs, each
compile mode) give stock eager's detections.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
import torch._dynamo
import torch._inductor.config
from torch._dynamo.testing import CompileCounter
from ultralytics.nn.autobackend import AutoBackend

import yolo_fastdetect
from conftest import detecting_model
from test_predictor import assert_same_detections, predict, sources_for
from yolo_fastdetect import _ext
from yolo_fastdetect.graphs import default_cache
from yolo_fastdetect.patches.predictor import replayed_backend

HEADS = ["yolo11n.yaml", "yolo11n-seg.yaml", "yolo11n-pose.yaml"]  # Detect, Segment, Pose
INPUT = (1, 3, 128, 160)


@pytest.fixture(autouse=True)
def restore_patch():
    yield
    yolo_fastdetect.enable()
    torch._dynamo.reset()


def fused_network(config: str) -> AutoBackend:
    """The network as the predictor runs it (and as Ultralytics' ``compile=`` compiles it): fused, in eval mode."""
    return AutoBackend(detecting_model("cpu", config).model, device=torch.device("cpu"), fuse=True,
                       verbose=False).eval()


def explain_first_call(network: AutoBackend):
    """``torch._dynamo.explain`` of the network's first call at one input shape."""
    torch._dynamo.reset()
    with torch.inference_mode():
        return torch._dynamo.explain(network)(torch.rand(INPUT))


def first_load() -> None:
    """What ``_ext.build`` does when a completed build is cached, less the loading itself (done once per process):
    the file checks (pathlib, hashing), then the state."""
    _ext.is_complete(_ext.library_path())
    _ext._state.update(loaded=True)


@pytest.mark.parametrize("config", HEADS)
def test_patched_head_traces_without_graph_break(config, monkeypatch):
    """Measured before the fix on yolo11n at 256x320: 21 graph breaks on a shape's first call (the first
    ``_ext.available()`` loading the operators inside the trace, ``float()`` of the stride tensor, make_anchors
    filling with stride tensor elements); 22 for Segment and Pose."""
    network = fused_network(config)
    _ext.require()  # loaded for real here; then the first use's file checks run again inside the trace
    monkeypatch.setitem(_ext._state, "loaded", None)
    monkeypatch.setattr(_ext, "build", first_load)
    explanation = explain_first_call(network)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1
    assert "yolo_fastdetect.detect_decode" in str(explanation.graphs[0].code), "the fused decode is not in the graph"


@pytest.mark.slow  # compiles stock's head, graph breaks and all: about 20 s on 2 cores
def test_stock_head_breaks_the_graph():
    """The baseline the test above improves on: stock breaks the graph on a shape's first call."""
    yolo_fastdetect.disable()
    explanation = explain_first_call(fused_network("yolo11n.yaml"))
    assert explanation.graph_break_count > 0
    assert any("tal.py" in frame.filename for reason in explanation.break_reasons for frame in reason.user_stack)


def count_compiles(network: AutoBackend, shapes: list[tuple[int, int]]) -> int:
    """Frames dynamo compiles for calls at these input sizes; each output checked against the uncompiled network."""
    reference, counter = copy.deepcopy(network), CompileCounter()
    compiled = torch.compile(network, backend=counter)
    torch._dynamo.reset()
    with torch.inference_mode():
        for shape in shapes:
            x = torch.rand(1, 3, *shape)
            assert torch.equal(compiled(x)[0], reference(x)[0]), shape
    return counter.frame_count


SHAPES = [(128, 160), (128, 160), (160, 128), (160, 128)]  # two calls at each of two input sizes


@pytest.mark.slow  # four compiled calls at two sizes: about 12 s on 2 cores
def test_compiles_once_per_input_shape():
    """One compile per input size (the second with dynamic sizes, which Ultralytics' torch.compile call leaves to
    torch): under compile the anchors are rebuilt inside the graph, so nothing the graph reads changes on a size's
    second call. Before the fix: 32 compiled frames for these four calls."""
    assert count_compiles(fused_network("yolo11n.yaml"), SHAPES) == 2


@pytest.mark.slow  # stock's graph breaks make this take about 100 s on 2 cores
def test_compiles_fewer_times_than_stock():
    """Stock recompiles on a size's second call (its head.shape guard) and compiles each graph break's pieces."""
    ours = count_compiles(fused_network("yolo11n.yaml"), SHAPES)
    yolo_fastdetect.disable()
    stock = count_compiles(fused_network("yolo11n.yaml"), SHAPES)
    assert ours < stock, (ours, stock)


@pytest.mark.parametrize(("mode", "replayed"), [(True, True), ("default", True), ("max-autotune-no-cudagraphs", True),
                                              ("reduce-overhead", False), ("max-autotune", False),
                                              ("no-such-mode", False)])
def test_compiled_forward_is_replayed_where_compile_has_no_graphs(mode, replayed):
    """Our CUDA graphs take the compiled forward of the modes without CUDA graphs of their own; the others (and a
    mode torch does not know) keep theirs. torch.compile is lazy: wrapping compiles nothing here."""
    backend = fused_network("yolo11n.yaml")
    compile_mode = {True: "default", "no-such-mode": None}.get(mode, mode)  # what attempt_compile passes on
    predictor = SimpleNamespace(model=torch.compile(backend, mode=compile_mode), args=SimpleNamespace(compile=mode))
    assert replayed_backend(predictor) is (backend if replayed else None)
    assert replayed_backend(SimpleNamespace(model=backend, args=SimpleNamespace(compile=False))) is backend


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_modes_with_graphs_of_their_own_compile_without_them_for_ours(mode, monkeypatch):
    """Ultralytics' predictor compiles (``attempt_compile``) a mode that captures CUDA graphs of its own with the same
    inductor options less those graphs, where ours replay the compiled forward (a CUDA device, a .pt network, our
    graphs on); elsewhere as asked. Stock's ``attempt_compile`` is replaced by a recorder that compiles lazily: this
    machine may have no CUDA device to compile for, and a CUDA device is all the choice reads."""
    import ultralytics.engine.predictor as engine_predictor

    from yolo_fastdetect.patches import predictor as predictor_patch

    backend, modes = fused_network("yolo11n.yaml"), []

    def recording(model, device, imgsz, use_autocast, warmup, mode):
        modes.append(mode)
        return torch.compile(model, mode=mode)

    monkeypatch.setattr(predictor_patch.PATCH._originals["attempt_compile"], "resolved", recording)

    def predictor_of(device: torch.device) -> SimpleNamespace:
        return SimpleNamespace(model=engine_predictor.attempt_compile(backend, device=device, mode=mode),
                               args=SimpleNamespace(compile=mode))

    assert replayed_backend(predictor_of(torch.device("cuda"))) is backend
    expected = torch._inductor.list_mode_options(mode)
    assert expected.pop("triton.cudagraphs") is True
    assert torch._inductor.list_mode_options(modes[-1]) == expected
    assert replayed_backend(predictor_of(torch.device("cpu"))) is None and modes[-1] == mode
    monkeypatch.setenv("YOLO_FASTDETECT_GRAPHS", "0")
    assert replayed_backend(predictor_of(torch.device("cuda"))) is None and modes[-1] == mode


# CUDA ------------------------------------------------------------------------------------------------------------

# Every setting on the Detect model ("channels_last": graphs of NHWC weights, Ultralytics' channels_last=True);
# Segment and Pose (the same patched decode) with compile's default mode only, to bound the GPU run.
SETTINGS = ["eager", "graphs", "channels_last", True, "reduce-overhead", "max-autotune-no-cudagraphs"]
CASES = [("yolo11n.yaml", setting) for setting in SETTINGS] + [("yolo11n-seg.yaml", True), ("yolo11n-pose.yaml", True)]


@pytest.mark.cuda
@pytest.mark.parametrize(("config", "setting"), CASES, ids=str)
def test_predict_fp16_same_as_stock_eager(config, setting, monkeypatch):
    """Ours in each setting against stock eager, fp16: the same boxes per image and classes; boxes within 2 px and
    scores within 2e-3 (fp16 rounds box coordinates in 0.5 px steps at 512-1024 px of the input, up to 2x that in
    the original image, as in test_predictor's fp16 comparison)."""
    model = detecting_model("cuda", config)
    yolo_fastdetect.disable()
    # max-autotune-no-cudagraphs tunes every convolution over Triton templates, minutes per input shape (two shapes
    # ran past 440 s on the H200 at 2de059b, one into a 400 s limit at 590964d): it predicts one shape, with ATen's
    # kernels as the only convolution and GEMM choices; the mode is otherwise as users get it (max_autotune,
    # coordinate descent tuning), and the package's path through it (compile, then our graphs) the same. The other
    # settings predict two shapes.
    autotune = setting == "max-autotune-no-cudagraphs"
    kinds = ("single",) if autotune else ("single", "mixed")
    stock = {kind: predict(model, sources_for(kind), half=True, batch=8) for kind in kinds}
    yolo_fastdetect.enable()
    torch._dynamo.reset()
    default_cache().clear()
    monkeypatch.setenv("YOLO_FASTDETECT_GRAPHS", "0" if setting == "eager" else "1")
    compile_mode = setting if setting not in ("eager", "graphs", "channels_last") else False
    aten_only = {"max_autotune_gemm_backends": "ATEN", "max_autotune_conv_backends": "ATEN"}
    with torch._inductor.config.patch(aten_only if autotune else {}):
        for kind, expected in stock.items():
            ours = predict(model, sources_for(kind), half=True, batch=8, compile=compile_mode,
                           channels_last=setting == "channels_last" or None)
            assert_same_detections(ours, expected, box_atol=2.0, conf_atol=2e-3)
    if compile_mode:  # attempt_compile falls back to the plain model silently (no Triton, say)
        assert isinstance(model.predictor.model, torch._dynamo.eval_frame.OptimizedModule)
    # Our graphs replay the forward (the compiled one too: reduce-overhead compiles without its own graphs).
    if setting == "eager":
        assert len(default_cache()) == 0, "a graph was captured"
    else:
        assert len(default_cache()) >= 1, "no graph was captured"
