"""``import yolo_fastdetect`` never raises, whatever Ultralytics is importable: it warns and leaves Ultralytics stock
where no patch's structure check passes, and patches a newer release whose structure matches, saying it is untested."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import subprocess_env

# Imports the package under -W always and prints what it did as JSON: enabled, the patch states, the CLI's state line,
# its warnings, and whether Ultralytics' Detect head and predictor are still stock.
PROBE = """
import json, sys, warnings
{prelude}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import yolo_fastdetect
    from yolo_fastdetect import patches
stock = None
try:
    from ultralytics.nn.modules.head import Detect
    from ultralytics.models.yolo.detect import DetectionPredictor
    stock = not any(getattr(f, "__module__", "").startswith("yolo_fastdetect")
                    for f in (Detect._inference, DetectionPredictor.preprocess))
except ImportError:
    pass
from yolo_fastdetect.cli import patch_state
print(json.dumps({{"enabled": yolo_fastdetect.is_enabled(), "patches": patches.states(), "stock": stock,
                  "state_line": patch_state(),
                  "warnings": [str(w.message) for w in caught if "yolo_fastdetect" in str(w.message)]}}))
"""


def import_package(python_path: list[Path], prelude: str = "") -> dict:
    """The probe's report in a child whose ``PYTHONPATH`` starts with ``python_path``."""
    env = subprocess_env()
    env["PYTHONPATH"] = ":".join([*map(str, python_path), env["PYTHONPATH"]])
    result = subprocess.run([sys.executable, "-c", PROBE.format(prelude=prelude)], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def fake_ultralytics(root: Path, version: str, modules: dict[str, str]) -> Path:
    """An ``ultralytics`` package under ``root`` of ``version`` holding only ``modules`` (dotted name -> source)."""
    package = root / "ultralytics"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f'__version__ = "{version}"\n')
    for name, source in modules.items():
        path = package.joinpath(*name.split("."))
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(root).parents:
            init = root / parent / "__init__.py"
            if parent != Path(".") and not init.exists():
                init.write_text("")
        path.with_suffix(".py").write_text(source)
    return root


@pytest.mark.parametrize("version, modules", [
    ("7.0.0", {}),  # a 7.x-like layout: none of the modules the patches import
    ("9.0.0", {"nn.modules.head": "class Detect:\n    pass\n", "utils.tal": "def make_anchors(*args):\n    pass\n",
               "utils.nms": "def non_max_suppression(x):\n    pass\n"}),  # what the patches import, other shapes
], ids=["7.0-empty", "9.0-other-shapes"])
def test_unsupported_release_warns_and_stays_stock(tmp_path, version, modules):
    report = import_package([fake_ultralytics(tmp_path, version, modules)])
    assert not report["enabled"]
    assert all(state.startswith("off (") for state in report["patches"].values()), report
    assert any(f"Ultralytics {version} is untested" in w for w in report["warnings"]), report
    assert any("these patches are off" in w for w in report["warnings"]), report
    assert report["state_line"].startswith(f"off (no patch applies to Ultralytics {version}: detect_head off ("), report
    if version == "9.0.0":  # the head exists but is not what detect_head replaces: it says so
        assert "Detect has no _inference" in report["patches"]["detect_head"]
        assert "lacks the arguments" in report["patches"]["nms"]


def test_no_ultralytics_imports_and_warns():
    report = import_package([], prelude="sys.modules['ultralytics'] = None  # as if not installed")
    assert not report["enabled"] and report["stock"] is None
    assert any("Ultralytics is not installed" in w for w in report["warnings"]), report


def test_newer_release_with_the_structure_is_patched_and_called_untested(tmp_path):
    """A copy of the installed Ultralytics that calls itself 8.5.0: every check passes, so every patch applies, and
    one warning says the release is untested."""
    import ultralytics

    shutil.copytree(Path(ultralytics.__file__).parent, tmp_path / "ultralytics",
                    ignore=shutil.ignore_patterns("__pycache__"))
    init = tmp_path / "ultralytics" / "__init__.py"
    init.write_text(init.read_text().replace(f'__version__ = "{ultralytics.__version__}"', '__version__ = "8.5.0"'))
    report = import_package([tmp_path])
    assert report["enabled"] and report["stock"] is False
    assert set(report["patches"].values()) == {"on"}, report
    assert report["warnings"] == ["yolo_fastdetect: Ultralytics 8.5.0 is untested (tested: 8.3.0 to 8.4.190)"]
