"""Faults on the wire (issue #5): a real run (`rlvr train`: learner + actor processes) that
receives one of every malformed message from a stranger on its ZeroMQ port keeps training to its
last step and counts every frame, by the codec's reason, in metrics.jsonl and in its log."""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import zmq
from transformers import AutoTokenizer

from protocol.codec import MAX_BYTES, ProtocolError, decode, encode
from protocol.messages import PROTOCOL_VERSION, Hello
from tests.conftest import ROOT, quick_run_args, read_rows
from tests.test_codec import group, hello_fields, raw, sample

pytestmark = pytest.mark.slow

# The tiny run trains ~4 steps a second here; the injection (the 64 MiB frame most of all) takes
# about one second, so 30 steps leave it a wide margin on a loaded machine.
STEPS = 30
INTRUDER = b"intruder"


def bad_frames(vocab_size: int, max_bytes: int) -> list[tuple[str, str, bytes]]:
    """(what, expected reason, frame) for each malformed message a peer could send."""
    # far past the learner's size limit, yet under its socket's hard cap (2 * max_bytes), so the
    # frame reaches the codec and is counted instead of the connection being dropped
    huge = Hello(protocol_version=PROTOCOL_VERSION, policy_version=0, actor_id=9, pid=1,
                 host="x" * max_bytes)
    return [
        ("random bytes", "malformed", random.Random(5).randbytes(256)),
        ("truncated frame", "malformed", encode(group(sample()))[:-5]),
        ("unknown kind", "unknown_kind", raw(**hello_fields(kind="launch_missiles"))),
        ("wrong protocol version", "protocol_version",
         raw(**hello_fields(protocol_version=PROTOCOL_VERSION + 1))),
        ("oversized message", "oversized", encode(huge)),
        ("NaN log-probs", "nan_logprob", encode(group(sample(logprobs=(-0.1, math.nan, -0.2))))),
        ("token id outside the vocabulary", "token_out_of_vocab",
         encode(group(sample(token_ids=(5, vocab_size, 7))))),
        ("token_ids vs logprobs lengths", "length_mismatch",
         encode(group(sample(token_ids=(5, 6, 7), logprobs=(-1.0, -2.0))))),
        ("NaN reward", "bad_schema", encode(group(sample(reward=math.nan)))),
    ]


def wait_until(what: str, ready, proc: subprocess.Popen, timeout_s: float, log: Path):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = ready()
        if got:
            return got
        if proc.poll() is not None:
            pytest.fail(f"run exited ({proc.returncode}) before {what}:\n"
                        f"{log.read_text()[-3000:]}")
        time.sleep(0.2)
    pytest.fail(f"no {what} within {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")


def learner_address(run: Path) -> str | None:
    try:  # written atomically (temp file + rename): present means complete
        return json.loads((run / "processes.json").read_text())["learner"]["zmq"]
    except FileNotFoundError:
        return None


def has_a_row(run: Path) -> bool:
    metrics = run / "metrics.jsonl"
    return metrics.exists() and metrics.stat().st_size > 0


def test_a_run_fed_every_malformed_frame_keeps_training_and_counts_each(tmp_path, tiny_model):
    # the learner checks token ids against its tokenizer and frames against the codec's default
    # limit (learner/trainer.py builds its LearnerEndpoint without max_bytes)
    vocab_size = len(AutoTokenizer.from_pretrained(tiny_model))
    frames = bad_frames(vocab_size, MAX_BYTES)
    for what, reason, data in frames:  # each one is refused for the reason we count it under
        with pytest.raises(ProtocolError) as err:
            decode(data, MAX_BYTES, vocab_size)
        assert err.value.reason == reason, what
    big = next(data for _, reason, data in frames if reason == "oversized")
    assert MAX_BYTES < len(big) < 2 * MAX_BYTES
    sent = Counter(reason for _, reason, _ in frames)

    run = tmp_path / "faults"
    stdout, stderr = tmp_path / "stdout.txt", tmp_path / "stderr.txt"  # files: no pipe to fill
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "WANDB_SILENT": "true"}
    with open(stdout, "w") as out, open(stderr, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlvr.cli",
             *quick_run_args(run, tiny_model, f"run.steps={STEPS}", "run.eval_every=100")],
            cwd=ROOT, env=env, stdout=out, stderr=err, start_new_session=True)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        address = wait_until("processes.json", lambda: learner_address(run), proc, 120, stderr)
        wait_until("a first metrics row", lambda: has_a_row(run), proc, 120, stderr)
        sock.setsockopt(zmq.IDENTITY, INTRUDER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        for _, _, data in frames:
            sock.send(data)  # queued until connected; the socket stays open until the run ends
        proc.wait(timeout=240)
    finally:
        sock.close(linger=0)
        ctx.term()
        if proc.poll() is None:  # the run, its learner and its actors: one session, ours
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log = stderr.read_text()
    assert proc.returncode == 0, log[-3000:]

    rows = read_rows(run)
    assert [r["step"] for r in rows] == list(range(STEPS + 1))  # the last step, no gaps
    last = rows[-1]
    counted = {k.removeprefix("protocol/rejected/"): v for k, v in last.items()
               if k.startswith("protocol/rejected/")}
    assert counted == dict(sent)  # exactly once each, by reason, and nothing else refused
    assert last["protocol/rejected"] == len(frames)

    totals = [r.get("protocol/rejected", 0) for r in rows]
    assert totals == sorted(totals)  # cumulative
    first_seen = next(i for i, n in enumerate(totals) if n > 0)
    all_seen = totals.index(len(frames))
    assert all_seen < len(rows) - 1, "no training step after the injection"
    assert first_seen >= 1 and rows[all_seen]["step"] < STEPS
    for r in rows[all_seen + 1:]:  # training went on: real updates on real groups
        assert r["gen/responses_per_step"] > 0

    for reason in sent:  # and the learner said so, naming the sender
        assert f"rejected frame from {INTRUDER!r}: {reason} " in log, reason
