"""The real-shape model and `rlvr bench realshape`'s bookkeeping: a model built from a real
architecture's numbers has a tokenizer exactly as large as its vocabulary (the codec's token-id
bound), loads as a Hugging Face model, and the bench reads peak memory and the actor's weight-
sync timings from real processes and real log lines. (The run itself is `rlvr bench realshape`,
minutes long: BENCHMARKS.md.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.bench.realshape import PeakMemory, actor_syncs, summarize, vm_hwm_kib
from rlvr.real_shape import QWEN25_05B, build_real_shape
from tasks.tiny_model import build_tokenizer

SMALL = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)


def test_the_shape_is_qwen2_5_0_5b():
    assert (QWEN25_05B["num_hidden_layers"], QWEN25_05B["hidden_size"],
            QWEN25_05B["vocab_size"], QWEN25_05B["tie_word_embeddings"]) == (24, 896, 151936, True)


def test_the_padded_tokenizer_has_exactly_the_model_vocabulary():
    tok = build_tokenizer(vocab_size=151936)
    assert len(tok) == 151936
    assert tok.decode(tok("47+38=\\boxed{85}").input_ids).replace(" ", "") == "47+38=\\boxed{85}"
    assert tok.convert_ids_to_tokens(151000).startswith("<|f")  # a filler decodes as itself
    with pytest.raises(ValueError, match="below"):
        build_tokenizer(vocab_size=50)


def test_a_built_model_loads_with_its_tied_head_and_vocabulary(tmp_path):
    path = build_real_shape(tmp_path / "m", **SMALL)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.vocab_size == len(AutoTokenizer.from_pretrained(path)) == 1000
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.config.num_hidden_layers == 2
    assert model.config.rope_parameters["rope_theta"] == 1e6


def test_peak_memory_is_read_for_the_learner_and_actors_listed_by_the_run(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "b = bytearray(200 << 20); print('ready', "
                              "flush=True); import time; time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        (tmp_path / "processes.json").write_text(
            f'{{"learner": {{"pid": {child.pid}}}, "actors": {{"0": {{"pid": {os.getpid()}}}}}}}')
        peaks = PeakMemory(tmp_path, period_s=0.05)
        peaks.start()
        time.sleep(1.5)
        peaks.stop()
    finally:
        child.kill()
        child.wait()
    gb = peaks.peak_gb()
    assert set(gb) == {"launcher", "learner", "actor-0"}
    assert gb["learner"] > 0.19  # the child's 200 MiB
    assert vm_hwm_kib(child.pid) is None  # gone: its last reading stands


def test_the_actor_sync_timings_come_from_its_log_and_later_steps_make_the_medians(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "actor-0.log").write_text(
        "x actor0 INFO weights v1 live: receive 2.000 s, commit 3.000 s\n"
        "x actor0 INFO weights v2 live: receive 0.500 s, commit 0.250 s\n"
        "x actor0 INFO weights v3 live: receive 0.700 s, commit 0.350 s\n")
    syncs = actor_syncs(tmp_path)
    assert [s["version"] for s in syncs] == [1, 2, 3]
    rows = [{"step": 0}] + [{"step": s, "perf/step_time": t, "timing/sync": 0.1 * s,
                             "timing/update": 1.0} for s, t in [(1, 60.0), (2, 10.0), (3, 12.0)]]
    s = summarize(rows, syncs)
    assert s["steps"] == 3 and s["first_step_s"] == 60.0
    assert s["step_s"] == 11.0 and s["sync_s"] == pytest.approx(0.25)  # steps 2 and 3
    assert s["actor_commit_s"] == pytest.approx(0.3) and s["actor_receive_s"] == pytest.approx(0.6)
