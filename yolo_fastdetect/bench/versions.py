"""The pre-release guard: does yolo_fastdetect apply to an Ultralytics release, patch by patch, with stock's results?

Run it against a newly released Ultralytics before declaring it supported::

    python -m yolo_fastdetect.bench.versions --install 8.4.200        # pip-installs it (no deps) under .site/
    python -m yolo_fastdetect.bench.versions .site/8.3.0 .site/8.4.190  # folders that hold an ultralytics install
    python -m yolo_fastdetect.bench.versions                           # the Ultralytics this interpreter imports

Each release runs in an interpreter of its own with its folder first on ``PYTHONPATH``
(:mod:`yolo_fastdetect.bench._version_check`, the child the version matrix in ``tests/test_versions.py`` runs too). It
prints per release each patch's state (``on``, or ``off`` with the reason its structure check gave) and each stock
against patched check, and exits 1 if any check fails. A patch that declines is not a failure: it runs stock there.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

SITE = Path(".site")  # where --install puts releases (git-ignored in this repository)


def install(version: str, into: Path = SITE) -> Path:
    """``ultralytics==version`` (and tqdm, which the 8.3 line imports) installed without dependencies into
    ``into/version``; the folder, as it is when it already holds that release.

    Raises:
        subprocess.CalledProcessError: pip failed (no such release, no network).
    """
    folder = into / version
    if not (folder / "ultralytics").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(folder),
                        f"ultralytics=={version}", "tqdm"], check=True)
    return folder


def check_release(folder: Path | None, device: str = "cpu", quick: bool = False, timeout: float = 600) -> dict:
    """The child's JSON report for the Ultralytics in ``folder`` (None: the one this interpreter imports); a report
    with ``ok`` False and the child's output where it printed none."""
    package_root = str(Path(__file__).resolve().parents[2])  # the folder holding the yolo_fastdetect package
    python_path = [str(folder)] if folder is not None else []
    python_path += [package_root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    command = [sys.executable, "-m", "yolo_fastdetect.bench._version_check", "--device", device]
    result = subprocess.run(command + (["--quick"] if quick else []), capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(python_path)})
    lines = result.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        return {"ultralytics": str(folder), "ok": False, "patches": {}, "checks": [],
                "error": f"exit {result.returncode}: {(result.stdout + result.stderr)[-2000:]}"}


def render(report: dict) -> str:
    """A report as lines: the release, the patches, then each check (failures first)."""
    checks = report.get("checks", [])
    passed = sum(row["ok"] for row in checks)
    lines = [f"Ultralytics {report.get('ultralytics')}: {'OK' if report.get('ok') else 'FAILED'} "
             f"({passed}/{len(checks)} checks, {report.get('seconds', '?')} s)"]
    lines += [f"  patch {name}: {state}" for name, state in report.get("patches", {}).items()]
    lines += [f"  warning: {warning}" for warning in report.get("warnings", [])]
    if "error" in report:
        lines.append(f"  error: {report['error']}")
    for row in sorted(checks, key=lambda row: row["ok"]):
        lines.append(f"  {'ok  ' if row['ok'] else 'FAIL'} {row['name']}: {row['detail']} ({row['seconds']} s)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Check every release named on the command line (see the module docstring); exit 1 if any check fails."""
    parser = argparse.ArgumentParser(prog="python -m yolo_fastdetect.bench.versions", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="*", type=Path, help="folders holding an ultralytics install")
    parser.add_argument("--install", nargs="+", default=[], metavar="VERSION",
                        help=f"pip-install these releases (no deps) under {SITE}/ and check them")
    parser.add_argument("--device", default="cpu", help="cpu, or a CUDA index such as 0")
    parser.add_argument("--quick", action="store_true", help="one model per check (the patch states are all shown)")
    parser.add_argument("--json", action="store_true", help="print the reports as JSON lines")
    args = parser.parse_args(argv)
    folders = [*args.folders, *(install(version) for version in args.install)] or [None]
    reports = [check_release(folder, args.device, args.quick) for folder in folders]
    for report in reports:
        print(json.dumps(report) if args.json else render(report))
    if not all(report.get("ok") for report in reports):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
