"""Crashes on real processes: actors SIGKILLed mid-run, a learner SIGKILLed and resumed.

Each test starts `rlvr train` as a user does, watches the run through `processes.json` and
`metrics.jsonl`, and kills processes by the pids the run itself publishes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from learner.checkpoint import latest_checkpoint
from tests.conftest import (ROOT, SPAWNER_ENV, TINY, assert_admitted_within_bound,
                            quick_run_args, read_rows, rlvr_env, run_rlvr)

pytestmark = pytest.mark.slow

# actors beat every 0.5 s and are taken for dead after 6 s of silence; a broadcast waits 20 s
FAST_FAULTS = ("actors.heartbeat_s=0.5", "actors.heartbeat_timeout_s=6",
               "weight_sync.timeout_s=20")


def start_rlvr(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rlvr.cli", *args], cwd=ROOT, env=rlvr_env(env),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for(what: str, check, proc: subprocess.Popen, timeout_s: float = 180.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (value := check()) is not None and value is not False:
            return value
        if proc.poll() is not None:
            pytest.fail(f"run ended (code {proc.returncode}) before {what}:\n{proc.stdout.read()}")
        time.sleep(0.2)
    # SIGTERM stops the run's learner, actors and verifiers (SIGKILL would leave them running
    # and holding the pipe, so that reading the output would never end)
    proc.terminate()
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out = "(rlvr train did not stop within 60 s of SIGTERM: killed, its output unread)"
    pytest.fail(f"timed out waiting for {what}:\n{out}")


def processes(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "processes.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}


def last_row(run_dir: Path) -> dict:
    rows = read_rows(run_dir) if (run_dir / "metrics.jsonl").exists() else []
    return rows[-1] if rows else {}


def last_step(run_dir: Path) -> int:
    return last_row(run_dir).get("step", -1)


def actor_pid(run_dir: Path, actor_id: int, other_than: int | None = None) -> int | None:
    """The pid of the live, weight-holding actor `actor_id` (not `other_than`), if there is one."""
    actor = processes(run_dir).get("actors", {}).get(str(actor_id))
    if actor and actor["weight_rank"] > 0 and actor["pid"] not in (0, other_than):
        return actor["pid"]
    return None


def synced_in_a_logged_step(run_dir: Path, actor_id: int, pid: int) -> bool:
    """A step's row was logged after a weight sync in the weight group that holds `pid` as
    `actor_id` (the row's epoch is read after the step's sync)."""
    actor = processes(run_dir).get("actors", {}).get(str(actor_id))
    return bool(actor) and actor["pid"] == pid and actor["weight_epoch"] is not None and \
        last_row(run_dir).get("faults/weight_group_epoch") == actor["weight_epoch"]


def learner_warnings(run_dir: Path) -> str:
    """The learner's warnings (actors lost, syncs failed): what a fault test's failure needs."""
    log = run_dir / "logs" / "learner.log"
    lines = log.read_text().splitlines() if log.exists() else [f"(no {log})"]
    return "\n".join(line for line in lines if " WARNING " in line or "(no " in line)


def assert_steps_continuous(rows: list[dict], steps: int) -> None:
    assert [r["step"] for r in rows] == list(range(steps + 1))


def assert_no_group_trained_twice(rows: list[dict]) -> None:
    trained = [gid for r in rows for gid in r.get("groups/trained_ids", [])]
    assert trained and len(trained) == len(set(trained))


def test_an_actor_killed_twice_is_restarted_and_the_run_finishes_with_no_group_twice(
        tiny_model, tmp_path):
    from protocol.exit_codes import REQUEUE_EXIT_CODE

    run_dir = tmp_path / "actor-crash"
    # the run is far longer than the test: it waits for each event (a kill, a restart, the
    # restarted actor training again) and then stops the run itself with the learner's own
    # "checkpoint and stop" signal, so no restart can lose a race against the run's end
    proc = start_rlvr(*quick_run_args(run_dir, tiny_model, "run.steps=100000", "actors.count=2",
                                      "mode=async", "max_staleness=1", "run.eval_every=100000",
                                      "run.checkpoint_every=100000", "actors.max_restarts=3",
                                      *FAST_FAULTS))
    killed = []
    for actor_id in [0, 0]:  # the same actor twice: the second kill once it is back (~10 s)
        wait_for("step 2", lambda: last_step(run_dir) >= 2, proc)
        pid = wait_for(f"actor {actor_id} holding weights",
                       lambda: actor_pid(run_dir, actor_id), proc)
        # killed between two syncs, as a crash mostly meets it. Killed while its weight group
        # forms, it leaves the others in gloo's connect for 100 s (gloo's own connect timeout,
        # not weight_sync.timeout_s): that is no loss either, but a 100 s test.
        wait_for(f"a step trained after actor {actor_id} (pid {pid}) took its weights",
                 lambda: synced_in_a_logged_step(run_dir, actor_id, pid), proc)
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)
        # the launcher restarts it and the learner gives the new process the weights
        wait_for(f"actor {actor_id} restarted", lambda: actor_pid(run_dir, actor_id, pid), proc)
    # both restarts are in the learner's books and both actors are live in a logged step
    wait_for("a step with both actors back", lambda: last_row(run_dir).get("actors/live") == 2
             and last_row(run_dir).get("faults/actor_restarts") == 2, proc)
    os.kill(processes(run_dir)["learner"]["pid"], signal.SIGUSR1)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == REQUEUE_EXIT_CODE, out  # checkpointed and stopped, as asked
    assert out.count("restarting it") == 2, out
    rows = read_rows(run_dir)
    assert_steps_continuous(rows, rows[-1]["step"])
    assert_no_group_trained_twice(rows)
    last = rows[-1]
    assert last["faults/actors_lost"] == 2, learner_warnings(run_dir)
    assert last["faults/actor_restarts"] == 2
    assert last["faults/weight_group_epoch"] >= 3  # start, and once per restart at least
    assert last["actors/live"] == 2
    # no group dropped, and the prompts reissued from the dead actor kept their slots
    assert all(r["gen/responses_dropped_stale"] == 0 for r in rows[1:])
    assert assert_admitted_within_bound(rows, 8, bound=1) == 8 * rows[-1]["step"]
    final = processes(run_dir)["actors"]
    assert {int(final[a]["pid"]) for a in ("0", "1")}.isdisjoint(killed)
    # every start sampled from its own seed, recorded in the run folder: actor 0 three times
    starts = {p.stem: json.loads(p.read_text()) for p in (run_dir / "actors").glob("*.json")}
    assert sorted(starts) == ["actor0-start0", "actor0-start1", "actor0-start2", "actor1-start0"]
    assert len({s["seed"] for s in starts.values()}) == 4
    assert {s["pid"] for s in starts.values()} >= set(killed)


def evaluation_started(run_dir: Path, actor_id: int, version: str = r"\d+") -> int | None:
    """The version of the first evaluation (of `version`, a pattern) actor `actor_id` started
    decoding (its log says so)."""
    log = run_dir / "logs" / f"actor-{actor_id}.log"
    text = log.read_text() if log.exists() else ""
    found = re.search(r"evaluation v(%s)-a%d of version \d+ started" % (version, actor_id), text)
    return int(found.group(1)) if found else None


def test_an_actor_killed_mid_evaluation_abandons_it_and_training_and_evaluation_go_on(
        tiny_model, tmp_path):
    """`run.eval_on: actors`: an actor SIGKILLed while it decodes its share of an evaluation
    takes that evaluation with it (counted in eval/abandoned, never logged from the surviving
    share alone), the learner keeps stepping, and the evaluations after the restart complete on
    both actors."""
    from protocol.exit_codes import REQUEUE_EXIT_CODE

    run_dir = tmp_path / "eval-crash"
    # 250 held-out prompts x 9 answers: a share takes an actor 4-8 s beside its training rows
    proc = start_rlvr(*quick_run_args(run_dir, tiny_model, "run.steps=100000", "actors.count=2",
                                      "mode=async", "max_staleness=1", "run.eval_on=actors",
                                      "run.eval_every=3", "task.eval_per_level=100",
                                      "run.checkpoint_every=100000", *FAST_FAULTS))
    version = wait_for("actor 0 evaluating", lambda: evaluation_started(run_dir, 0), proc)
    pid = processes(run_dir)["actors"]["0"]["pid"]
    os.kill(pid, signal.SIGKILL)
    killed_at = last_step(run_dir)
    wait_for("actor 0 restarted", lambda: actor_pid(run_dir, 0, pid), proc)
    wait_for("an evaluation of a later version complete on both actors", lambda: any(
        r.get("eval/version", -1) > version and r.get("eval/actors") == 2
        for r in read_rows(run_dir)), proc, timeout_s=300)
    os.kill(processes(run_dir)["learner"]["pid"], signal.SIGUSR1)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == REQUEUE_EXIT_CODE, out
    rows = read_rows(run_dir)
    assert [r["step"] for r in rows] == list(range(1, rows[-1]["step"] + 1))  # no step-0 row:
    assert_no_group_trained_twice(rows)  # the evaluation before training is on the actors too
    assert rows[-1]["faults/actors_lost"] == 1, learner_warnings(run_dir)
    assert rows[-1]["eval/abandoned"] >= 1, learner_warnings(run_dir)
    assert "the actor of share v%d-a0 was lost" % version in learner_warnings(run_dir)
    # the killed evaluation's version is in no row and not in evals.jsonl: no half is logged
    assert all(r.get("eval/version") != version for r in rows)
    logged = [json.loads(line) for line in (run_dir / "evals.jsonl").read_text().splitlines()]
    assert version not in [e["eval/version"] for e in logged]
    # the learner went on stepping after the kill, while the evaluation was out and lost
    assert rows[-1]["step"] > killed_at + 3


def test_a_final_evaluation_lost_with_its_actor_is_done_by_the_learner(tiny_model, tmp_path):
    """The run's last number is its final evaluation: when its actor dies while decoding it,
    the learner, done training, evaluates the final weights itself; the row says so."""
    run_dir = tmp_path / "final-eval-crash"
    steps = 12
    proc = start_rlvr(*quick_run_args(run_dir, tiny_model, f"run.steps={steps}", "mode=async",
                                      "max_staleness=1", "run.eval_on=actors",
                                      "run.eval_every=1000", "task.eval_per_level=100",
                                      *FAST_FAULTS))
    wait_for("the final evaluation decoding", lambda: evaluation_started(run_dir, 0, str(steps)),
             proc)
    os.kill(processes(run_dir)["actors"]["0"]["pid"], signal.SIGKILL)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    last = read_rows(run_dir)[-1]
    assert last["step"] == steps and last["eval/version"] == steps
    assert last["eval/final_on_learner"] == 1 and last["eval/actors"] == 0
    warnings = learner_warnings(run_dir)  # version 0's may still have been out: lost as well
    assert last["eval/abandoned"] >= 1 and "the actor of share v%d-a0 was lost" % steps in warnings
    assert "the learner evaluates version %d itself" % steps in warnings


def test_a_learner_killed_mid_run_resumes_losing_no_prompt_and_repeating_none(
        tiny_model, tmp_path):
    """Async (max_staleness 2): an actor is killed and restarted, then the learner is killed
    just after a checkpoint and the run resumed. Every prompt the stream handed out is trained
    exactly once or still pending at the end, and the fault counters carry on."""
    run_dir = tmp_path / "learner-crash"
    steps = 30
    proc = start_rlvr(*quick_run_args(run_dir, tiny_model, f"run.steps={steps}", "mode=async",
                                      "max_staleness=2", "run.checkpoint_every=2",
                                      "run.eval_every=100", *FAST_FAULTS))
    pid = wait_for("the actor holding weights", lambda: actor_pid(run_dir, 0), proc)
    wait_for("a step trained", lambda: synced_in_a_logged_step(run_dir, 0, pid), proc)
    os.kill(pid, signal.SIGKILL)
    restarted_at = wait_for("a step after the actor's restart", lambda: last_row(run_dir).get(
        "faults/actor_restarts") == 1 and last_step(run_dir), proc)
    # killed the moment the next checkpoint is complete: its row must already be written (it
    # once came after the checkpoint, and a kill in between lost that row for good)
    at = restarted_at + 2 - restarted_at % 2
    assert at < steps, f"the run reached step {restarted_at} before the actor was back"
    checkpoint = run_dir / "checkpoints" / f"step_{at:06d}"
    wait_for(f"the checkpoint of step {at}", lambda: (checkpoint / "COMPLETE").exists(), proc)
    os.kill(processes(run_dir)["learner"]["pid"], signal.SIGKILL)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0
    killed_at = last_step(run_dir)
    saved = json.loads((checkpoint / "state.json").read_text())
    assert saved["coordinator"]["pending"], "an async checkpoint has prompts in flight"
    # the kill can land while the next checkpoint is being written, its step's row already out
    newest = latest_checkpoint(run_dir)
    checkpoint_step = int(newest.name.removeprefix("step_"))
    assert at <= checkpoint_step <= killed_at and killed_at - checkpoint_step < 4

    resumed = run_rlvr("train", "--resume", str(run_dir), timeout_s=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    rows = read_rows(run_dir)
    assert_steps_continuous(rows, steps)
    # the resumed learner started from the newest complete checkpoint at the kill
    log = (run_dir / "logs" / "learner.log").read_text()
    assert f"step_{checkpoint_step:06d} at step {checkpoint_step}" in log
    # the prompt stream against what was trained: nothing skipped, nothing twice
    final = json.loads((run_dir / "checkpoints" / f"step_{steps:06d}" / "state.json").read_text())
    trained = [gid for r in rows for gid in r.get("groups/trained_ids", [])]
    pending = [p["group_id"] for p in final["coordinator"]["pending"]]
    assert all(r["gen/responses_dropped_stale"] == 0 for r in rows[1:])  # tis: none dropped
    assert len(trained) == len(set(trained))
    assert sorted(trained + pending) == sorted(f"g{i}" for i in range(final["data_index"]))
    # and the resumed admission counted the pending prompts' slots: none ran ahead
    assert assert_admitted_within_bound(rows, 8, bound=2) == 8 * steps
    # the fault counters continue across the resume
    assert rows[-1]["faults/actors_lost"] >= 1 and rows[-1]["faults/actor_restarts"] >= 1


def test_a_learner_killed_before_its_first_checkpoint_starts_again_cleanly_on_resume(
        tiny_model, tmp_path):
    """As a user meets it: killed after step 5 of 10 with no checkpoint yet (a SLURM job
    requeued after a node failure gets the same `--resume`)."""
    run_dir = tmp_path / "early-crash"
    steps = 10
    proc = start_rlvr(*quick_run_args(run_dir, tiny_model, f"run.steps={steps}",
                                      "run.checkpoint_every=100", "run.eval_every=100",
                                      *FAST_FAULTS))
    wait_for("step 5", lambda: last_step(run_dir) >= 5, proc)
    os.kill(processes(run_dir)["learner"]["pid"], signal.SIGKILL)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert latest_checkpoint(run_dir) is None  # nothing to resume from
    first_attempt = (run_dir / "metrics.jsonl").read_text()
    killed_at = last_step(run_dir)
    assert 5 <= killed_at < steps

    resumed = run_rlvr("train", "--resume", str(run_dir), timeout_s=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "no complete checkpoint" in resumed.stdout + resumed.stderr
    rows = read_rows(run_dir)
    assert_steps_continuous(rows, steps)  # a whole new run, from step 0 (evaluation) on
    assert_no_group_trained_twice(rows)
    assert [r["policy_version"] for r in rows] == list(range(steps + 1))
    # the first attempt's rows are kept, untouched, beside the new run and not mixed into it
    aside = list((run_dir / "set-aside").iterdir())
    assert len(aside) == 1 and aside[0].name.endswith("-no-checkpoint")
    assert (aside[0] / "metrics.jsonl").read_text() == first_attempt
    assert "no complete checkpoint" in (aside[0] / "NOTE.txt").read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarted_without_checkpoint"]["last_step"] == killed_at
    assert summary["restarted_without_checkpoint"]["set_aside_in"] == str(aside[0])


def descendants(pid: int) -> set[int]:
    """Every live process under `pid` (its children, theirs, ...)."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid=,stat="], capture_output=True, text=True)
    children: dict[int, list[int]] = {}
    for line in out.stdout.splitlines():
        child, parent, stat = line.split()
        if not stat.startswith("Z"):
            children.setdefault(int(parent), []).append(int(child))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def running(pid: int) -> bool:
    try:
        return not Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_a_terminated_train_stops_its_learner_actors_and_verifiers(tmp_path, tiny_model):
    """`kill`, `timeout` and a container's stop send SIGTERM to `rlvr train`: every process of
    the run stops with it, none runs on orphaned."""
    run = tmp_path / "runs" / "term"
    # started as `python -m`, not by the fork server: the launcher's descendants are the run
    proc = start_rlvr(*quick_run_args(run, tiny_model, "run.steps=100000", "actors.count=2"),
                      env={SPAWNER_ENV: ""})
    wait_for("a trained step", lambda: last_step(run) >= 2, proc)
    started = descendants(proc.pid)
    # the learner, two actors, and a verifier child under each
    assert len(started) >= 5, started
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=90)
    deadline = time.monotonic() + 10
    while any(running(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p for p in started if running(p)]
    for pid in left:  # and keep them from holding the output pipe open, or the cores
        os.kill(pid, signal.SIGKILL)
    assert not left, f"{len(left)} of the run's {len(started)} processes outlived it"


@pytest.mark.parametrize("key, address", [("net.zmq_port", "tcp://127.0.0.1:{port}"),
                                          ("net.weights_port", "port {port}"),
                                          ("net.master_port", "port {port}")])
def test_a_learner_whose_port_is_taken_stops_the_run_with_one_line_naming_the_key(
        tmp_path, tiny_model, key, address):
    """Another process listens on one of the learner's ports (ZeroMQ, the weight store, the
    ranks' rendezvous): the run stops, every process with it, and says which key to change in
    one line instead of a ZeroMQ or torch.distributed traceback."""
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        run = tmp_path / "runs" / "taken"
        done = run_rlvr(*quick_run_args(run, tiny_model, f"{key}={port}"), timeout_s=180)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    where = address.format(port=port)
    assert (f"ERROR {key}: cannot listen on {where}: Address already in use (another process "
            "holds it") in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]


def test_a_learner_whose_actors_never_say_hello_gives_up_after_the_start_timeout(tmp_path,
                                                                                 tiny_model):
    """The learner alone, as on a cluster whose actor job never started: it waits
    `actors.start_timeout_s` for their hellos, then stops naming the key (by default it would
    wait 600 s, past this test's limit)."""
    from protocol.config import load_config, write_resolved
    from rlvr.launch import resolve

    cfg = load_config(TINY, [f"model.path={tiny_model}", "run.wandb=disabled",
                             "run.progress=false", "actors.start_timeout_s=3"])
    write_resolved(resolve(cfg), tmp_path)
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "learner.main", "--run-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-3000:]
    assert "only 0 of 1 actors said hello within 3 s (actors.start_timeout_s)" in out, out[-3000:]
    assert time.monotonic() - t0 >= 3


def test_a_key_folder_without_the_learners_keys_stops_the_run_with_one_line_naming_it(
        tmp_path, tiny_model):
    """`net.curve_dir` names the CurveZMQ key folder the learner's socket loads (`rlvr keys`
    makes one): one without the learner's keys stops the run in one line naming the key and the
    file, not a traceback."""
    keys = tmp_path / "keys"
    keys.mkdir()
    run = tmp_path / "runs" / "no-keys"
    done = run_rlvr(*quick_run_args(run, tiny_model, f"net.curve_dir={keys}"), timeout_s=180)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert f"ERROR net.curve_dir: missing key file {keys}/learner.key_secret" in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
