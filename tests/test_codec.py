"""The wire codec (protocol/codec.py): every message survives a round trip, every bad frame is
refused with its own reason, and nothing but ProtocolError ever comes out of decode."""

import math
import pickle

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.codec import REASONS, ProtocolError, decode, encode
from protocol.messages import (
    EngineLoad,
    PROTOCOL_VERSION,
    Group,
    Heartbeat,
    Hello,
    Prompt,
    RolloutSpec,
    Sample,
    Shutdown,
    SyncWeights,
    Work,
)

V = PROTOCOL_VERSION


def sample(token_ids=(5, 6, 7), logprobs=(-0.1, -2.0, 0.0), **kw) -> Sample:
    fields = dict(policy_version=3, reward=1.0, acc=True, truncated=False) | kw
    return Sample(token_ids=list(token_ids), logprobs=list(logprobs), **fields)


def group(*samples: Sample, prompt_token_ids=(1, 2, 3)) -> Group:
    return Group(
        protocol_version=V,
        policy_version=3,
        group_id="g-1",
        prompt_id="p-1",
        actor_id=0,
        work_id="w-1",
        prompt_token_ids=list(prompt_token_ids),
        samples=list(samples) or [sample()],
        gen_time_s=0.25,
    )


EVERY_KIND = [
    Work(
        protocol_version=V,
        policy_version=2,
        work_id="w-1",
        prompts=[Prompt(group_id="g-1", prompt_id="p-1", prompt_token_ids=[1, 2], answer="4", n=8)],
        rollout=RolloutSpec(strategy="stop_on_correct", max_new_tokens=64, stage_sizes=[2, 2, 4]),
    ),
    group(sample(), sample(token_ids=(), logprobs=(), reward=0.0, acc=False, stage=1)),
    group(sample(version_runs=[(3, 1), (4, 2)])),  # decoded across a weight update
    Hello(protocol_version=V, policy_version=0, actor_id=1, host="node-3", pid=4242),
    Heartbeat(protocol_version=V, policy_version=5, actor_id=1, busy=True),
    SyncWeights(protocol_version=V, policy_version=6, group_epoch=2, rank=1, world_size=3),
    Shutdown(protocol_version=V, policy_version=7, reason="done"),
]


def raw(**fields) -> bytes:
    """A msgpack map, as a hostile or buggy peer could send it."""
    return msgspec.msgpack.encode(fields)


def hello_fields(without: str = "", **kw) -> dict:
    fields = dict(kind="hello", protocol_version=V, policy_version=0, actor_id=1, host="h", pid=2)
    return {k: v for k, v in (fields | kw).items() if k != without}


@pytest.mark.parametrize("msg", EVERY_KIND, ids=lambda m: type(m).__name__)
def test_every_message_kind_survives_a_round_trip(msg):
    assert decode(encode(msg), vocab_size=100) == msg


def test_an_empty_response_that_was_not_truncated_is_accepted():
    msg = group(sample(token_ids=(), logprobs=(), truncated=False))
    assert decode(encode(msg), vocab_size=10) == msg


def test_encode_refuses_anything_that_is_not_a_protocol_message():
    with pytest.raises(TypeError):
        encode({"kind": "hello"})


BAD_FRAMES = {
    "oversized": (encode(EVERY_KIND[0]), dict(max_bytes=16)),
    "malformed": (b"\xc1 not msgpack", {}),
    "malformed/truncated": (encode(EVERY_KIND[1])[:-3], {}),
    "malformed/trailing bytes": (encode(EVERY_KIND[2]) + b"\x00", {}),
    "unknown_kind": (raw(**hello_fields(kind="launch_missiles")), {}),
    "unknown_kind/missing": (raw(**hello_fields(without="kind")), {}),
    "bad_schema/wrong type": (raw(**hello_fields(actor_id="one")), {}),
    "bad_schema/missing field": (raw(**hello_fields(without="pid")), {}),
    "bad_schema/unknown field": (raw(**hello_fields(extra=1)), {}),
    "bad_schema/not a map": (msgspec.msgpack.encode([1, 2, 3]), {}),
    "bad_schema/nan reward": (encode(group(sample(reward=math.nan))), {}),
    "protocol_version": (raw(**hello_fields(protocol_version=V + 1)), {}),
    "protocol_version/with an older schema": (raw(kind="hello", protocol_version=V - 1), {}),
    "nan_logprob": (encode(group(sample(logprobs=(-0.1, math.nan, -0.2)))), {}),
    "nan_logprob/-inf": (encode(group(sample(logprobs=(-0.1, -math.inf, -0.2)))), {}),
    "nan_logprob/positive": (encode(group(sample(logprobs=(-0.1, 0.5, -0.2)))), {}),
    "token_out_of_vocab": (encode(group(sample(token_ids=(5, 100, 7)))), dict(vocab_size=100)),
    "token_out_of_vocab/prompt": (encode(group(prompt_token_ids=(1, 100))), dict(vocab_size=100)),
    "token_out_of_vocab/negative": (encode(group(sample(token_ids=(5, -1, 7)))), {}),
    "length_mismatch": (encode(group(sample(token_ids=(5, 6), logprobs=(-1.0,)))), {}),
    "length_mismatch/version runs": (encode(group(sample(version_runs=[(3, 1), (4, 1)]))), {}),
    "bad_schema/runs not from policy_version": (encode(group(sample(version_runs=[(2, 3)]))), {}),
    "bad_schema/runs going back": (encode(group(sample(version_runs=[(3, 2), (3, 1)]))), {}),
    "bad_schema/empty run": (encode(group(sample(version_runs=[(3, 3), (4, 0)]))), {}),
    "bad_schema/negative count": (encode(msgspec.structs.replace(group(), aborted_tokens=-1)), {}),
    "bad_schema/engine rows over capacity": (encode(msgspec.structs.replace(
        group(), engine_load=EngineLoad(decode_steps=2, busy_rows=9, max_rows=4))), {}),
    "bad_schema/negative engine counter": (encode(msgspec.structs.replace(
        group(), engine_load=EngineLoad(decode_steps=-1, busy_rows=0, max_rows=4))), {}),
}


@pytest.mark.parametrize("case", list(BAD_FRAMES))
def test_each_bad_frame_is_refused_with_its_reason(case):
    data, kwargs = BAD_FRAMES[case]
    with pytest.raises(ProtocolError) as err:
        decode(data, **kwargs)
    assert err.value.reason == case.split("/")[0]
    assert err.value.detail


def test_every_reason_has_a_bad_frame():
    assert {case.split("/")[0] for case in BAD_FRAMES} == REASONS


def test_a_tiny_positive_logprob_from_round_off_is_accepted():
    msg = group(sample(logprobs=(-0.1, 5e-5, -0.2)))
    assert decode(encode(msg)) == msg


def test_size_is_checked_before_parsing():
    with pytest.raises(ProtocolError, match="oversized"):
        decode(b"\xc1" * 100, max_bytes=99)  # garbage, but too big is the first verdict


def test_protocol_errors_survive_pickling_across_processes():
    err = pickle.loads(pickle.dumps(ProtocolError("malformed", "bad byte")))
    assert (err.reason, err.detail) == ("malformed", "bad byte")


def decodes_or_refuses(data: bytes) -> None:
    try:
        decode(data, max_bytes=1 << 16, vocab_size=50)
    except ProtocolError as e:
        assert e.reason in REASONS


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes_only_ever_raise_protocol_error(data):
    decodes_or_refuses(data)


@st.composite
def mutated_frames(draw):
    frame = bytearray(encode(draw(st.sampled_from(EVERY_KIND))))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        i = draw(st.integers(0, max(0, len(frame) - 1)))
        if op == "flip" and frame:
            frame[i] = draw(st.integers(0, 255))
        elif op == "insert":
            frame[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del frame[i : i + draw(st.integers(1, 8))]
        else:
            del frame[i:]
    return bytes(frame)


@FUZZ
@given(mutated_frames())
def test_mutated_valid_frames_only_ever_raise_protocol_error(data):
    decodes_or_refuses(data)


scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text()
msgpack_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@FUZZ
@given(
    st.sampled_from(["work", "group", "hello", "heartbeat", "sync_weights", "shutdown", "x"]),
    st.dictionaries(
        st.sampled_from(["protocol_version", "policy_version", "samples", "prompts", "actor_id"]),
        msgpack_values,
    ),
)
def test_well_formed_msgpack_with_hostile_fields_only_ever_raises_protocol_error(kind, fields):
    decodes_or_refuses(raw(kind=kind, **fields))


def test_bytes_that_start_like_a_wrong_type_but_are_not_msgpack_are_malformed():
    with pytest.raises(ProtocolError, match="malformed"):
        decode(b"junk")  # 'j' reads as an int, then trailing bytes: not one msgpack value
