"""Verification off the decode loop: finished responses are scored on a background thread.

Why: AR3PO's stop-on-first-correct needs each sample's verdict as soon as it finishes, and the
decode loop must not wait for math-verify (a child-process round trip, up to
`actors.verifier_timeout_s` per item) between two decode steps. `tasks.verifier.Verifier.score`
may be called from any thread, so one worker thread takes whatever is queued, scores it in one
call and hands the verdicts back; the actor loop collects them without blocking.

    queue = VerifyQueue(verifier)
    queue.put(request_id, "so \\boxed{85}", "85", fields)
    for request_id, score in queue.results(wait_s=0.0): ...  # tasks.rewards.Score
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Hashable

from tasks.rewards import BUILTIN, Score
from tasks.math_answer import quick_verdict
from tasks.verifier import Verifier

log = logging.getLogger(__name__)

_STOP = object()


class VerifyQueue:
    def __init__(self, verifier: Verifier):
        self.verifier = verifier
        self._todo: queue.SimpleQueue = queue.SimpleQueue()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._pending = 0  # put and not yet returned by `results` (touched by the caller only)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="verifier", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Responses put and whose verdict has not been collected yet."""
        return self._pending

    def put(self, key: Hashable, response: str, answer: str, fields: dict | None = None) -> None:
        self._pending += 1
        self._todo.put((key, response, answer, fields or {}))

    def results(self, wait_s: float = 0.0) -> list[tuple[Hashable, Score]]:
        """Scores ready now, waiting up to `wait_s` for the first one when none is."""
        out = []
        try:
            out.append(self._done.get(timeout=wait_s) if wait_s > 0 else self._done.get_nowait())
            while True:
                out.append(self._done.get_nowait())
        except queue.Empty:
            pass
        if self._error is not None:
            raise RuntimeError("the verifier thread failed") from self._error
        self._pending -= len(out)
        return out

    def every_result(self) -> list[tuple[Hashable, Score]]:
        """Every verdict outstanding, waiting for the last (each within the verifier's own
        timeout: a math-verify call that overruns is scored 0, never waited on longer)."""
        out = []
        while self._pending:
            out += self.results(wait_s=1.0)
        return out

    def _serve(self) -> None:
        try:
            while (item := self._todo.get()) is not _STOP:
                batch = [item]
                while True:  # everything queued meanwhile goes into the same call
                    try:
                        nxt = self._todo.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is _STOP:
                        self._score(batch)
                        return
                    batch.append(nxt)
                self._score(batch)
        except BaseException as e:  # noqa: BLE001 - handed to the caller by `results`
            log.exception("verifier thread failed")
            self._error = e
            self._done.put(None)  # wake a waiting caller

    def _score(self, batch: list[tuple]) -> None:
        # the verdicts the text settles go back at once, not after the batch's math-verify calls
        slow = []
        for item in batch:
            verdict = quick_verdict(item[1], item[2]) if self.verifier.reward == BUILTIN else None
            if verdict is None:
                slow.append(item)
            else:
                self._done.put((item[0], Score.of_acc(verdict)))
        if slow:
            scores = self.verifier.judge([i[1] for i in slow], [i[2] for i in slow],
                                         [i[3] for i in slow])
            for item, score in zip(slow, scores):
                self._done.put((item[0], score))

    def close(self) -> None:
        """Stop the thread after what is queued (the verifier itself is the caller's)."""
        self._todo.put(_STOP)
        self._thread.join(timeout=self.verifier.timeout_s * 2 + 5)
