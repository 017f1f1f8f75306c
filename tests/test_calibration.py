"""The calibration table's arithmetic: a bound's distance from the mean in standard deviations."""

import json

from tests.calibration import MIN_SIGMAS, main, record, summarize


def line(value, low=None, high=None, name="t"):
    return {"test": "x.py::t", "name": name, "value": value, "low": low, "high": high}


def test_the_nearest_bound_counts_in_standard_deviations():
    [row] = summarize([line(v, low=0.0, high=20.0) for v in (4.0, 5.0, 6.0)])
    assert (row["runs"], row["mean"], row["sd"]) == (3, 5.0, 1.0)
    assert row["sigmas"] == 5.0  # the nearer end, 5 away; sd 1
    [row] = summarize([line(v, low=4.5) for v in (4.0, 5.0, 6.0)])
    assert row["sigmas"] == 0.5 and row["sigmas"] < MIN_SIGMAS


def test_a_value_that_never_varied_is_infinitely_far_only_inside_its_bound():
    assert summarize([line(1.0, low=0.0)] * 5)[0]["sigmas"] == float("inf")
    assert summarize([line(1.0, low=1.0)] * 5)[0]["sigmas"] == 0.0


def test_record_writes_only_when_asked(tmp_path, monkeypatch):
    log = tmp_path / "cal.jsonl"
    monkeypatch.delenv("RLVR_CALIBRATION_LOG", raising=False)
    record("elapsed s", 0.2, high=2.0)
    assert not log.exists()
    monkeypatch.setenv("RLVR_CALIBRATION_LOG", str(log))
    record("elapsed s", 0.2, high=2.0)
    record("elapsed s", 0.3, high=2.0)
    [row] = summarize([json.loads(x) for x in log.read_text().splitlines()])
    assert row["runs"] == 2 and row["high"] == 2.0


def test_the_command_fails_when_a_bound_sits_too_close(tmp_path):
    test = tmp_path / "test_noisy.py"
    runs = tmp_path / "runs"  # each run records the next of 0, 0.5, 1: mean 0.5, sd 0.5
    test.write_text("from pathlib import Path\nfrom tests.calibration import record\n\n"
                    "def test_noisy():\n"
                    f"    runs = Path({str(runs)!r})\n"
                    "    n = len(runs.read_text()) if runs.exists() else 0\n"
                    "    runs.write_text('x' * (n + 1))\n"
                    "    record('value', [0.0, 0.5, 1.0][n], high=0.95)\n")
    assert main(["--runs", "3", "--log", str(tmp_path / "cal.jsonl"), str(test)]) == 1
