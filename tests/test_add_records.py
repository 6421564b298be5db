"""``benchmarks/add_records.py``: a GPU machine's records added to benchmarks/records/, each to its benchmark's
file, the commit named where the copied tree had none, nothing added twice."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def add_records():
    spec = importlib.util.spec_from_file_location("add_records", REPO / "benchmarks" / "add_records.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_records_go_to_their_benchmarks_file_once(add_records, tmp_path):
    kept = {"benchmark": "video", "commit": "1a012d7", "figures": {"stock_fps": 219.0}}
    (tmp_path / "video.json").write_text(json.dumps([kept]))
    made = [{"benchmark": "video", "commit": "unknown", "figures": {"ours_pyav_fps": 692.0}},
            {"benchmark": "val", "commit": "1a012d7", "figures": {"ours_ms_per_image": 1.601}},
            kept]
    assert add_records.add(made, tmp_path, "abc1234") == {"video.json": 1, "val.json": 1}
    video = json.loads((tmp_path / "video.json").read_text())
    assert video == [kept, {**made[0], "commit": "abc1234"}]  # appended after what was there, the commit named
    assert json.loads((tmp_path / "val.json").read_text()) == [made[1]]  # a commit it had is kept
    assert add_records.add(made, tmp_path, "abc1234") == {}  # the same run added again: nothing new
    with pytest.raises(ValueError, match="not a benchmark record"):
        add_records.add([{"figures": {}}], tmp_path, "abc1234")


def test_a_named_commit_replaces_every_records(add_records, tmp_path):
    """``--commit REV`` names the commit of every record: a device's copy may report an older commit than its files'."""
    made = [{"benchmark": "video", "commit": "5901872", "figures": {"ours_pyav_fps": 617.3}},
            {"benchmark": "video", "commit": "unknown", "figures": {"ours_pyav_fps": 935.9}}]
    assert add_records.add(made, tmp_path, "7cbc0bc", every=True) == {"video.json": 2}
    assert [record["commit"] for record in json.loads((tmp_path / "video.json").read_text())] == ["7cbc0bc"] * 2


def test_help_exits_0(add_records, capsys):
    with pytest.raises(SystemExit) as exit_info:
        add_records.main(["--help"])
    assert exit_info.value.code == 0 and "--commit" in capsys.readouterr().out
