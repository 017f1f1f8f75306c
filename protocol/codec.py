"""Wire codec: protocol messages <-> msgpack bytes, with every check a receiver needs.

`encode` writes one `protocol.messages.Message` as msgpack (msgspec; the `kind` field is the tag).
`decode` is the only way bytes from a socket become a message, and it trusts nothing:

1. size      - frames over `max_bytes` are refused before any parsing ("oversized");
2. syntax    - bytes that are not one complete msgpack value ("malformed");
3. schema    - typed decode into the tagged union: unknown tag ("unknown_kind"), another protocol
               version ("protocol_version"), wrong or missing fields ("bad_schema");
4. semantics - for `Group` (the only message whose payload feeds the loss): token/logprob lengths
               agree and per-token version runs cover the tokens ("length_mismatch"), behaviour
               log-probs are finite and <= 1e-4 ("nan_logprob"), token ids lie in
               [0, vocab_size) ("token_out_of_vocab"), rewards are finite, version runs start
               at the sample's policy version and increase, counts are not negative
               ("bad_schema"); for `EvalResult`, one verdict per prompt in each list
               ("length_mismatch") and no negative count ("bad_schema").

Every refusal is a `ProtocolError` with a short machine-usable `reason` (one of `REASONS`) and a
human `detail`; nothing else ever escapes `decode`. Never pickle: pickle on a socket is remote
code execution.

    python -c "from protocol.codec import *; from protocol.messages import *
    print(decode(encode(Shutdown(protocol_version=PROTOCOL_VERSION, policy_version=0))))"
"""

from __future__ import annotations

import math
from typing import get_args

import msgspec

from protocol.messages import PROTOCOL_VERSION, EvalResult, Group, Message

MAX_BYTES = 64 * 1024 * 1024
MAX_LOGPROB = 1e-4  # a log-probability is <= 0; allow float round-off above it, nothing more

REASONS = frozenset(
    {
        "oversized",
        "malformed",
        "unknown_kind",
        "bad_schema",
        "protocol_version",
        "nan_logprob",
        "token_out_of_vocab",
        "length_mismatch",
    }
)

MESSAGE_TYPES = get_args(Message)
KINDS = frozenset(t.__struct_config__.tag for t in MESSAGE_TYPES)

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Message)


class ProtocolError(ValueError):
    """A frame that must not be accepted. `reason` is one of `REASONS` (for counters and tests),
    `detail` says what exactly was wrong (for logs)."""

    def __init__(self, reason: str, detail: str):
        assert reason in REASONS, reason
        super().__init__(reason, detail)  # args stay (reason, detail): picklable as is
        self.reason = reason
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"


def encode(msg: Message) -> bytes:
    """One message -> msgpack bytes. Refuses anything that is not a protocol message."""
    if not isinstance(msg, MESSAGE_TYPES):
        raise TypeError(f"not a protocol message: {type(msg).__name__}")
    return _ENCODER.encode(msg)


def decode(data: bytes, max_bytes: int = MAX_BYTES, vocab_size: int | None = None) -> Message:
    """msgpack bytes -> one checked message, or `ProtocolError` (and nothing else)."""
    if len(data) > max_bytes:
        raise ProtocolError("oversized", f"{len(data)} bytes > limit {max_bytes}")
    try:
        msg = _DECODER.decode(data)
    except msgspec.ValidationError as e:
        raise ProtocolError(_classify_invalid(data), str(e)) from None
    except msgspec.DecodeError as e:
        raise ProtocolError("malformed", str(e)) from None
    except (RecursionError, MemoryError, OverflowError) as e:  # pathological nesting or sizes
        raise ProtocolError("malformed", f"{type(e).__name__}: {e}") from None
    if msg.protocol_version != PROTOCOL_VERSION:
        raise ProtocolError(
            "protocol_version", f"got {msg.protocol_version}, speak {PROTOCOL_VERSION}"
        )
    if isinstance(msg, Group):
        check_group(msg, vocab_size)
    elif isinstance(msg, EvalResult):
        check_eval_result(msg)
    return msg


def _classify_invalid(data: bytes) -> str:
    """The typed decode refused it: name why. Only runs on the error path."""
    try:
        raw = msgspec.msgpack.decode(data)
    except Exception:  # noqa: BLE001 - the typed decoder can stop at a wrong type before it
        return "malformed"  # would have noticed that the bytes are not one msgpack value
    if not isinstance(raw, dict):
        return "bad_schema"
    version = raw.get("protocol_version")
    if type(version) is int and version != PROTOCOL_VERSION:
        return "protocol_version"  # a peer from another release: say so, not "bad schema"
    if raw.get("kind") not in KINDS:
        return "unknown_kind"
    return "bad_schema"


def check_eval_result(result: EvalResult) -> None:
    """One verdict per prompt in both lists, counts not negative (the learner checks them
    against its own k and prompts when it adds them up)."""
    if not len(result.correct) == len(result.greedy) == len(result.greedy_texts):
        raise ProtocolError("length_mismatch", f"eval {result.eval_id}: {len(result.correct)} "
                            f"sample counts, {len(result.greedy)} greedy verdicts")
    if any(c < 0 for c in result.correct) or result.tokens < 0 or not result.seconds >= 0:
        raise ProtocolError("bad_schema", f"eval {result.eval_id}: a negative count or time")


def check_group(group: Group, vocab_size: int | None = None) -> None:
    """Semantic checks on a schema-valid Group; raises `ProtocolError`.

    Fast path uses C builtins (min/max/all over lists); the loops that name the exact offending
    index only run once something is already known to be wrong."""
    _check_token_ids(group.prompt_token_ids, vocab_size, "prompt_token_ids")
    for i, s in enumerate(group.samples):
        where = f"samples[{i}]"
        if len(s.token_ids) != len(s.logprobs):
            raise ProtocolError(
                "length_mismatch",
                f"{where}: {len(s.token_ids)} token_ids vs {len(s.logprobs)} logprobs",
            )
        _check_token_ids(s.token_ids, vocab_size, f"{where}.token_ids")
        _check_logprobs(s.logprobs, f"{where}.logprobs")
        if not math.isfinite(s.reward):
            raise ProtocolError("bad_schema", f"{where}.reward = {s.reward!r} is not finite")
        if s.version_runs:
            _check_version_runs(s.version_runs, s.policy_version, len(s.token_ids), where)
    for name in ("aborted_samples", "aborted_tokens", "saved_tokens_est"):
        if getattr(group, name) < 0:
            raise ProtocolError("bad_schema", f"{name} = {getattr(group, name)} < 0")
    if (load := group.engine_load) is not None:
        for name in ("decode_steps", "busy_rows", "max_rows", "prefix_cache_resets_refused"):
            if getattr(load, name) < 0:
                raise ProtocolError("bad_schema", f"engine_load.{name} = {getattr(load, name)} < 0")
        if load.max_rows < 1 or load.busy_rows > load.decode_steps * load.max_rows:
            raise ProtocolError("bad_schema", f"engine_load: {load.busy_rows} busy rows in "
                                              f"{load.decode_steps} steps of {load.max_rows} rows")


def _check_version_runs(runs: list[tuple[int, int]], oldest: int, tokens: int,
                        where: str) -> None:
    """Runs of (version, tokens): counts >= 1 summing to the tokens, versions increasing from
    the sample's policy version (the staleness rules read the oldest there)."""
    if runs[0][0] != oldest:
        raise ProtocolError("bad_schema", f"{where}.version_runs starts at version {runs[0][0]}, "
                                          f"policy_version is {oldest}")
    for (v0, _), (v1, _) in zip(runs, runs[1:]):
        if v1 <= v0:
            raise ProtocolError("bad_schema", f"{where}.version_runs: version {v1} after {v0}")
    if min(n for _, n in runs) < 1:
        raise ProtocolError("bad_schema", f"{where}.version_runs has an empty run")
    covered = sum(n for _, n in runs)
    if covered != tokens:
        raise ProtocolError("length_mismatch",
                            f"{where}: version_runs cover {covered} tokens of {tokens}")


def _check_logprobs(logprobs: list[float], where: str) -> None:
    # sum() is NaN/inf if any entry is, so one C-speed pass settles the common all-good case.
    if not logprobs or (math.isfinite(sum(logprobs)) and max(logprobs) <= MAX_LOGPROB):
        return
    for t, lp in enumerate(logprobs):
        if not -math.inf < lp <= MAX_LOGPROB:  # NaN fails every comparison
            raise ProtocolError("nan_logprob", f"{where}[{t}] = {lp!r}")
    # all finite but the sum overflowed (absurdly negative values): still valid log-probs


def _check_token_ids(ids: list[int], vocab_size: int | None, where: str) -> None:
    if not ids:
        return
    low, high = min(ids), max(ids)
    if low < 0 or (vocab_size is not None and high >= vocab_size):
        bad = low if low < 0 else high
        t = ids.index(bad)
        raise ProtocolError(
            "token_out_of_vocab", f"{where}[{t}] = {bad} outside [0, {vocab_size or 'inf'})"
        )
