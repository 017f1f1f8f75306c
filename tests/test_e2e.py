"""End to end: real learner and actor processes, real ZeroMQ sockets, a real gloo weight group
and a real DeepSpeed engine, started the way a user starts them (`rlvr train`)."""

from __future__ import annotations

import math
import re

import pytest
from transformers import AutoModelForCausalLM

from tests.calibration import record
from tests.conftest import (SPAWNER_ENV, assert_admitted_within_bound, assert_on_policy,
                            groups_trained_behind, quick_run_args, read_rows, run_rlvr)

pytestmark = pytest.mark.slow


def train_rows(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["step"] > 0]


@pytest.mark.parametrize("inflight", ["finish", "continue", "abort", "recompute"])
def test_sync_mode_is_exactly_on_policy(tmp_path, tiny_model, inflight):
    # whatever a sync does to the samples in flight: in sync mode none are in flight then
    run = tmp_path / "sync"
    done = run_rlvr(*quick_run_args(run, tiny_model, "algorithm=grpo", "mode=sync",
                                    "run.steps=4", "run.eval_every=2",
                                    f"actors.inflight_update={inflight}"))
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_rows(run)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    # the actor sampled with exactly the weights the learner trains: behaviour log-probs
    # equal the learner's own up to float error, so the decoupled weight is 1
    assert_on_policy(train_rows(rows))
    for r in train_rows(rows):
        assert r["stale/max"] == 0
        assert r["gen/policy_version_min"] == r["gen/policy_version_max"] == r["step"] - 1
        assert r["gen/version_spread_max"] == 0 and r["gen/aborted_tokens"] == 0
        assert r["gen/responses_per_prompt"] == 8
        # 8 prompts x 8 samples in an engine of 512 rows (actors.max_batch): at most 1/8 full
        assert 0 < r["gen/engine_fill"] <= 64 / 512
    assert "eval/avg@8" in rows[0] and "eval/avg@8" in rows[2] and "eval/avg@8" in rows[4]


def test_async_mode_advances_actor_versions_within_the_staleness_bound(tmp_path, tiny_model):
    run = tmp_path / "async"
    done = run_rlvr(*quick_run_args(run, tiny_model, "mode=async", "max_staleness=1",
                                    "run.steps=8", "run.eval_every=100", "actors.threads=2",
                                    "learner.threads=2"))
    assert done.returncode == 0, done.stderr[-3000:]
    for log in ("actor-0.log", "learner.log"):  # each process took the threads it was given
        assert "torch threads 2" in (run / "logs" / log).read_text(), log
    rows = train_rows(read_rows(run))
    assert [r["step"] for r in rows] == list(range(1, 9))
    # no group dropped, and every group was handed out within admission's bound (1)
    assert all(r["gen/responses_dropped_stale"] == 0 for r in rows)
    assert assert_admitted_within_bound(rows, 8, bound=1) == 8 * 8
    # actors took new weights during the run: later groups come from later policy versions
    record("gen/policy_version_max at step 8", rows[-1]["gen/policy_version_max"], low=4)
    assert rows[-1]["gen/policy_version_max"] >= 5
    # and really ran ahead of the learner
    behind = groups_trained_behind(rows)
    record("groups trained at least one version behind, of 64", behind, low=0)  # tests/README.md
    assert behind >= 1 and max(r["stale/max"] for r in rows) >= 1


def test_weights_published_every_other_step_keep_admission_within_the_bound(tmp_path,
                                                                          tiny_model):
    run = tmp_path / "every2"
    done = run_rlvr(*quick_run_args(run, tiny_model, "mode=async", "max_staleness=1",
                                    "weight_sync.sync_every=2", "run.steps=8",
                                    "run.eval_every=100"))
    assert done.returncode == 0, done.stderr[-3000:]
    rows = train_rows(read_rows(run))
    assert [r["step"] for r in rows] == list(range(1, 9))
    # the actors only ever held the versions published: 0, 2, 4, 6
    versions = {v for r in rows for v in r["groups/trained_first_versions"]}
    assert versions and all(v % 2 == 0 for v in versions), versions
    assert max(versions) >= 4
    assert [bool(r.get("sync/count")) for r in rows] == [s % 2 == 0 for s in range(1, 9)]
    # admission counted the actors' (lagging) weights, so no group ran ahead of its slot
    assert assert_admitted_within_bound(rows, 8, bound=1) == 8 * 8


def test_a_group_that_outlives_the_bound_is_trained_and_counted_not_dropped(tmp_path, tiny_model):
    # under `continue` a prompt whose AR3PO stage finds no correct answer runs the next stage
    # while the learner moves on, and comes back staler than the bound it was admitted under; by
    # default it is trained under the behaviour weight. Four stages of two, not two of four: more
    # prompts outlive the bound in the same 48 steps (idle machine: 20-36 groups, against 6-14)
    run = tmp_path / "over"
    done = run_rlvr(*quick_run_args(run, tiny_model, "mode=async", "max_staleness=1",
                                    "actors.inflight_update=continue", "rollout.prompts_per_work=2",
                                    "ar3po.stage_sizes=[2,2,2,2]", "run.steps=48",
                                    "run.eval_every=100"))
    assert done.returncode == 0, done.stderr[-3000:]
    rows = train_rows(read_rows(run))
    assert "stale_policy 'drop'" not in done.stderr  # the default warns about nothing
    assert sum(r["gen/responses_dropped_stale"] for r in rows) == 0
    over = [r for r in rows if r["stale/over_bound_groups"] > 0]
    record("groups trained over the bound in 48 steps",
           sum(r["stale/over_bound_groups"] for r in over), low=0)
    assert over, "no group outlived the bound: the test did not exercise it"
    for r in over:  # the trained batch itself holds a group older than the bound: by the
        # audit of the versions its groups' first tokens were sampled with (step s trains the
        # weights of version s - 1), and by the loss's own count of its oldest token
        assert r["step"] - 1 - min(r["groups/trained_first_versions"]) > 1, r
        assert r["stale/oldest_token_max"] > 1
    # and nothing was taken by stage: what was trained is what was generated
    for r in rows:
        assert r["groups/later_stage_frac_trained"] == r["groups/later_stage_frac"]
        assert r["resp/len_trained_p90"] == r["resp/len_generated_p90"]


# a line a library prints: a progress bar (tqdm's "45%|", "it/s]"), DeepSpeed's "[WARNING]", a
# Python warning ("FutureWarning: ...", the source line "warnings.warn(...)")
LIBRARY_LINE = re.compile(
    r"\d%\||it/s\]|s/it\]|\[(WARNING|INFO)\]|[A-Za-z]*Warning\b|warnings\.warn")


def test_a_run_keeps_its_folder_checkpoints_wandb_progress_syncs_and_verdicts_as_set(
        tmp_path, tiny_model):
    """The run folder (config, summary, checkpoints, plots) and the keys that shape a run's
    outputs and plumbing, each set through the config and seen acting (quick_run_args' wandb and
    progress are overridden); the terminal shows rlvr's lines, the libraries' go to the log."""
    run = tmp_path / "outputs"
    done = run_rlvr(*quick_run_args(run, tiny_model, "mode=sync", "run.steps=2",
                                    "run.checkpoint_every=1", "run.keep_checkpoints=1",
                                    "run.wandb=offline", "run.progress=true",
                                    "weight_sync.bucket_mb=1", "actors.verifier_timeout_s=1",
                                    "task.reward=tests.reward_plugins:slow_first"),
                    env={SPAWNER_ENV: ""})  # `python -m` processes, whose imports warn
    assert done.returncode == 0, done.stderr[-3000:]
    assert (run / "config.yaml").exists() and (run / "summary.json").exists()
    checkpoints = sorted((run / "checkpoints").glob("step_*"))
    assert [c.name for c in checkpoints] == ["step_000002"]  # one kept
    model = AutoModelForCausalLM.from_pretrained(checkpoints[0] / "hf")  # loadable as a HF model
    assert {p.name for p in (run / "plots").glob("*.png")} >= {"reward.png", "eval.png"}
    run_id = (run / "wandb_id.txt").read_text().strip()
    assert list((run / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert "step 2/2" in done.stderr  # the progress line, at the last step
    assert "learner INFO actor 0 joined" in done.stderr  # the learner's own log lines
    shown = [line for line in (done.stdout + done.stderr).splitlines()
             if LIBRARY_LINE.search(line)]
    assert shown == []
    # moved, not lost: the learner's log holds transformers' progress bar and DeepSpeed's warning
    learner_log = (run / "logs" / "learner.log").read_text()
    assert "Loading weights" in learner_log and "[WARNING]" in learner_log
    # every sync broadcast the whole model in buckets of at most 1 MiB (the default 64 MiB
    # takes the tiny model in one)
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    syncs = [r for r in read_rows(run) if "sync/buckets" in r]
    assert len(syncs) == 2 and model_bytes > 2 << 20
    for r in syncs:
        assert r["sync/bytes"] == model_bytes
        assert r["sync/buckets"] >= math.ceil(model_bytes / (1 << 20))
    # the actor reports each sync's seconds before it samples under it: in the next step's row
    assert all(r["sync/s"] > 0 for r in read_rows(run) if r["step"] >= 1)
    # the actor's first verdict took a minute: cut after 1 s (the default is 5), counted, and
    # the run went on
    assert "timed out after 1.0 s" in (run / "logs" / "actor-0.log").read_text()
    assert read_rows(run)[1]["reward/errors"] >= 1
    # `rlvr export`: the newest checkpoint's model, as a folder of its own
    exported = tmp_path / "exported"
    assert run_rlvr("export", str(run), str(exported)).returncode == 0
    assert (exported / "model.safetensors").read_bytes() == \
        (checkpoints[0] / "hf" / "model.safetensors").read_bytes()
    assert (exported / "tokenizer.json").exists()
    again = run_rlvr("export", str(run), str(exported))
    assert again.returncode == 2 and "exists" in again.stderr
    merge = run_rlvr("export", str(run), str(tmp_path / "merged"), "--merge")
    assert merge.returncode == 2 and "no adapter to merge" in merge.stderr


def test_resume_continues_step_numbers_without_gaps_or_repeats(tmp_path, tiny_model):
    run = tmp_path / "resume"
    first = run_rlvr(*quick_run_args(run, tiny_model, "mode=sync", "run.steps=3",
                                     "run.checkpoint_every=2", "run.eval_every=100"))
    assert first.returncode == 0, first.stderr[-3000:]
    # forget the final checkpoint so the resume starts from step 2 and must drop logged step 3
    import shutil
    shutil.rmtree(run / "checkpoints" / "step_000003")
    again = run_rlvr("train", "--resume", str(run), "run.steps=5")
    assert again.returncode == 0, again.stderr[-3000:]
    assert [r["step"] for r in read_rows(run)] == [0, 1, 2, 3, 4, 5]


def test_bad_config_key_fails_before_anything_starts(tmp_path, tiny_model):
    run = tmp_path / "bad"
    done = run_rlvr(*quick_run_args(run, tiny_model, "rollout.group_sise=4"))
    assert done.returncode == 2
    assert "rollout.group_sise" in done.stderr and "rollout.group_size" in done.stderr
    assert not run.exists()


def test_dry_run_prints_the_resolved_config_and_starts_nothing(tmp_path, tiny_model):
    run = tmp_path / "dry"
    done = run_rlvr(*quick_run_args(run, tiny_model, "max_staleness=3"), "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "max_staleness: 3" in done.stdout
    assert not run.exists()
