"""Add the records a benchmark wrote elsewhere (a GPU machine's run: `.ci/gpu` writes `OUT/NAME.json`) to
benchmarks/records/, each to its benchmark's file, in order.

A tree copied to a GPU machine without its `.git` records the commit as "unknown", which this checkout's `HEAD`
replaces; one copied with a `.git` older than its files (the device tool's copy keeps the session's first commit)
records that one, so `--commit REV` names the commit the run was made from for every record added. Records already in
the file (the same benchmark, date, machine, configuration and figures) are not added twice.

    python benchmarks/add_records.py path/to/video.json path/to/val.json      # then render_results.py
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

RECORDS = Path(__file__).resolve().parent / "records"


def head_commit() -> str:
    """This checkout's short HEAD commit."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                          cwd=RECORDS.parent).stdout.strip()


def add(records: list[dict], folder: Path, commit: str, every: bool = False) -> dict[str, int]:
    """Append ``records`` to ``folder``'s ``BENCHMARK.json`` files (made where absent), "unknown" commits (with
    ``every``, all of them) named ``commit``, those already there left out; the count added per file.

    Examples:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> add([{"benchmark": "val", "commit": "unknown", "figures": {"x": 1}}], folder, "abc1234")
        {'val.json': 1}
        >>> json.loads((folder / "val.json").read_text())[0]["commit"]
        'abc1234'
    """
    files: dict[Path, list[dict]] = {}  # each file read once, written once
    added: dict[str, int] = {}
    for record in records:
        if not isinstance(record, dict) or not isinstance(record.get("benchmark"), str):
            raise ValueError(f"not a benchmark record: {str(record)[:80]}")
        if every or record.get("commit") in (None, "", "unknown"):
            record = {**record, "commit": commit}
        path = folder / f"{record['benchmark']}.json"
        if path not in files:
            files[path] = json.loads(path.read_text()) if path.exists() else []
        if record in files[path]:
            continue
        files[path].append(record)
        added[path.name] = added.get(path.name, 0) + 1
    for path, content in files.items():
        if path.name in added:
            path.write_text(json.dumps(content, indent=1) + "\n")
    return added


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="JSON lists of records, as `bench NAME --json` writes")
    parser.add_argument("--commit", help="the commit the run was made from, for every record (default: this "
                        "checkout's HEAD, for records whose commit is unknown)")
    args = parser.parse_args(argv)
    commit = args.commit or head_commit()
    for file in args.files:
        added = add(json.loads(file.read_text()), RECORDS, commit, every=args.commit is not None)
        print(f"{file}: " + (", ".join(f"{count} to {name}" for name, count in added.items()) or "nothing new"))


if __name__ == "__main__":
    main()
