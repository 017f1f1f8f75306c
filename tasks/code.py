"""The code reward: a response's Python function, run against the row's hidden tests in the
sandbox (tasks/sandbox.py).

    task.reward: tasks.code:unit_tests

The row's answer is the tests, as JSON: {"function": "add", "tests": [{"args": [1, 2],
"expected": 3}, ...]}; a test passes when the function returns `expected` (compared after a
JSON round trip). The response's code is its last ```python fenced block, or the whole response
when it has none. The reward is the fraction of tests passed, `acc` all of them passed;
`reward/tests_passed` logs the count and `reward/sandbox_error` how often a run ended early (a
timeout, a crash, a function that is not defined).

Each verifier child keeps one sandbox (tasks/sandbox.py's `Sandbox`) for every response it
scores, each response's code in a process of its own inside it; `reward/sandbox_started` is the
share of responses that found no sandbox running (the first, and each after one that had to be
killed: a timeout, a /tmp it could not empty).

The sandbox's wall limit (`WALL_S`) sits under the verifier's per-item timeout
(`actors.verifier_timeout_s`, 5 s by default): give that key more than WALL_S + 1.
"""

from __future__ import annotations

import atexit
import json
import re

from tasks.sandbox import Limits, Sandbox

WALL_S = 3.0
LIMITS = Limits(wall_s=WALL_S, cpu_s=2, memory_mb=512, file_mb=1, processes=16)
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(response: str) -> str:
    """The last fenced code block of `response`, or all of it."""
    blocks = _FENCE.findall(response)
    return blocks[-1] if blocks else response


def parse_tests(answer: str) -> tuple[str, list[dict]]:
    """(function name, tests) of a row's answer; ValueError naming what is wrong."""
    spec = json.loads(answer)
    if not isinstance(spec, dict) or not isinstance(spec.get("function"), str):
        raise ValueError('the answer must be {"function": name, "tests": [...]}')
    tests = spec.get("tests")
    if not tests or not all(isinstance(t, dict) and isinstance(t.get("args"), list)
                            and "expected" in t for t in tests):
        raise ValueError('each test must be {"args": [...], "expected": value}, and one at least')
    return spec["function"], tests


_SANDBOX = Sandbox(LIMITS)  # this process's: started at its first response, killed with it
atexit.register(_SANDBOX.close)


def unit_tests(response: str, answer: str, fields: dict) -> dict:
    function, tests = parse_tests(answer)  # a bad row raises: counted in reward/errors
    starts = _SANDBOX.starts
    result = _SANDBOX.run(extract_code(response), function, tests)
    return {"reward": result.passed / result.total, "acc": result.passed == result.total,
            "tests_passed": result.passed, "sandbox_error": float(result.error is not None),
            "sandbox_started": float(_SANDBOX.starts > starts)}


unit_tests.check_answer = parse_tests  # rlvr data check: every row's tests well-formed
