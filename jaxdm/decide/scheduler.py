"""The one worker thread that calls the backend: micro-batching, fairness, cancellation.

``MicroBatcher`` collects the questions of concurrent requests for up to ``max_wait_ms`` after
the first one arrives (or until ``max_batch`` are waiting) and answers them with one
``backend.choose`` call, so concurrent clients share scoring passes and the backend is never
called from two threads at once. Other backend work (the OpenAI-compatible routes' next-token
log-probs) runs on the same thread as a job (``run``).

Fairness: waiting questions are kept per client (an HTTP connection, the stdio stream) and a
batch takes them round-robin, one per client in turn, so a client's 10,000-question batch is
split into ``max_batch`` pieces interleaved with everyone else's questions instead of making
them wait for all of it. Cancellation: a future cancelled while queued (a client whose answer
timed out) is dropped when its turn comes and never reaches the backend.

Failures: a question the backend would refuse (its optional ``refusal(question)`` says why,
e.g. ``LocalReadout`` with more options than labels) is answered with that refusal before the
batch runs, so its neighbours stay in one call. A batch that still raises is split in halves
and each half retried (a bad question costs about 2 log2(batch) calls, not one call per
neighbour); a question that raises alone fails with ``BackendError`` (422 for ValueError /
TypeError: the backend rejected it; 500 otherwise).
"""
from __future__ import annotations

import collections
import concurrent.futures as cf
import math
import threading
import time
from typing import Any, Callable, Hashable, Sequence

from jaxdm.decision.types import ChoiceResult, DecisionModel, MultipleChoice


class BackendError(RuntimeError):
    """The backend raised for a question; ``status`` is 422 for ValueError/TypeError (it
    rejected the question), 500 otherwise."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def backend_error(e: BaseException) -> BackendError:
    """The BackendError of an exception the backend raised (422 for a rejected input)."""
    status = 422 if isinstance(e, (ValueError, TypeError)) else 500
    return BackendError(f"{type(e).__name__}: {e}", status)


class _Job:
    """A callable to run alone on the worker thread; its result goes to ``future``."""

    def __init__(self, fn: Callable[[], Any]):
        self.fn = fn
        self.future: cf.Future = cf.Future()


class MicroBatcher:
    """Answers submitted questions in micro-batches on one worker thread (module docstring).

    Every future resolves to a ``ChoiceResult`` or raises ``BackendError``.
    """

    def __init__(self, backend: DecisionModel, *, max_batch: int = 32,
                 max_wait_ms: float = 5.0):
        if isinstance(max_batch, bool) or not (isinstance(max_batch, int) and max_batch >= 1):
            raise ValueError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        if not (isinstance(max_wait_ms, (int, float)) and math.isfinite(max_wait_ms)
                and max_wait_ms >= 0):
            raise ValueError(f"max_wait_ms must be a finite number >= 0, got {max_wait_ms!r}")
        self.backend = backend
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000.0
        self._cond = threading.Condition()
        self._queues: dict[Hashable, collections.deque] = {}
        self._turn: collections.deque = collections.deque()    # clients in round-robin order
        self._waiting = 0                                       # queued items, all clients
        self._first_at: float | None = None                     # when the oldest item came
        self._counts = {"calls": 0, "questions": 0, "largest": 0, "jobs": 0, "cancelled": 0,
                        "refused": 0}
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="jaxdm-decide-batcher",
                                        daemon=True)
        self._thread.start()

    # ---- submitting ---------------------------------------------------------------------
    def _put(self, client: Hashable, items: Sequence[Any]) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("MicroBatcher is closed")
            queue = self._queues.get(client)
            if queue is None:
                queue = self._queues[client] = collections.deque()
                self._turn.append(client)
            queue.extend(items)
            if self._waiting == 0:
                self._first_at = time.monotonic()
            self._waiting += len(items)
            self._cond.notify_all()

    def submit(self, questions: Sequence[MultipleChoice], client: Hashable = None
               ) -> list[cf.Future]:
        """One future per question, answered in order of ``client``'s submissions and in
        turn with other clients' questions. Cancel a future to drop its question."""
        items = [(q, cf.Future()) for q in questions]
        self._put(client, items)
        return [fut for _, fut in items]

    def run(self, fn: Callable[[], Any], client: Hashable = None) -> cf.Future:
        """Runs ``fn()`` alone on the worker thread, in ``client``'s turn; its result (or
        exception) comes back in the future."""
        job = _Job(fn)
        self._put(client, [job])
        return job.future

    def stats(self) -> dict:
        """Batching counters: backend calls, questions answered, mean and largest batch,
        jobs run, questions dropped because their client gave up, refused questions."""
        with self._cond:
            c = dict(self._counts)
            waiting = self._waiting
        return {"calls": c["calls"], "questions": c["questions"],
                "mean_batch": c["questions"] / c["calls"] if c["calls"] else 0.0,
                "largest_batch": c["largest"], "max_batch": self.max_batch,
                "max_wait_ms": self.max_wait * 1000.0, "jobs": c["jobs"],
                "cancelled": c["cancelled"], "refused": c["refused"], "waiting": waiting}

    def close(self) -> None:
        """Stops the worker after the work already queued."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    # ---- the worker ---------------------------------------------------------------------
    def _take(self) -> tuple[list, _Job | None]:
        """Round-robin over clients: up to max_batch questions, or one job (called locked)."""
        batch: list = []
        while self._turn and len(batch) < self.max_batch:
            client = self._turn[0]
            queue = self._queues[client]
            item = queue[0]
            if isinstance(item, _Job):
                if batch:       # a job runs alone: leave it for the next round
                    break
                queue.popleft()
                self._waiting -= 1
                self._rotate(client, queue)
                if item.future.set_running_or_notify_cancel():
                    return [], item
                continue
            queue.popleft()
            self._waiting -= 1
            self._rotate(client, queue)
            if item[1].set_running_or_notify_cancel():
                batch.append(item)
            else:
                self._counts["cancelled"] += 1
        return batch, None

    def _rotate(self, client: Hashable, queue: collections.deque) -> None:
        self._turn.popleft()
        if queue:
            self._turn.append(client)
        else:
            del self._queues[client]

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._waiting == 0 and not self._closed:
                    self._cond.wait()
                if self._waiting == 0 and self._closed:
                    return
                # The collection window: wait for more questions, up to max_wait after the
                # oldest one came in (max_batch waiting ends it early).
                deadline = (self._first_at or time.monotonic()) + self.max_wait
                while self._waiting < self.max_batch and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                batch, job = self._take()
                # Questions left over have waited their window already: no second one.
                self._first_at = time.monotonic() - self.max_wait if self._waiting else None
            if job is not None:
                with self._cond:
                    self._counts["jobs"] += 1
                try:
                    job.future.set_result(job.fn())
                except Exception as e:  # noqa: BLE001 - the job's caller gets it
                    job.future.set_exception(e)
                continue
            try:
                self._answer(self._screen(batch))
            except Exception as e:  # noqa: BLE001 - never leave a client waiting forever
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(BackendError(f"batcher: {type(e).__name__}: {e}", 500))

    def _screen(self, batch: list) -> list:
        """The batch without the questions the backend says it would refuse (answered now)."""
        refusal = getattr(self.backend, "refusal", None)
        if refusal is None:
            return batch
        kept = []
        for q, fut in batch:
            reason = refusal(q)
            if reason is None:
                kept.append((q, fut))
                continue
            with self._cond:
                self._counts["refused"] += 1
                self._counts["questions"] += 1
            fut.set_exception(BackendError(f"ValueError: {reason}", 422))
        return kept

    def _call(self, questions: list[MultipleChoice]) -> list[ChoiceResult]:
        with self._cond:
            self._counts["calls"] += 1
            self._counts["largest"] = max(self._counts["largest"], len(questions))
        results = list(self.backend.choose(questions))
        if len(results) != len(questions):
            raise RuntimeError(f"backend {self.backend.name!r} returned {len(results)} answers "
                               f"for {len(questions)} questions")
        return results

    def _answer(self, batch: list) -> None:
        if not batch:
            return
        try:
            results = self._call([q for q, _ in batch])
        except Exception as e:  # noqa: BLE001 - isolate the failing question(s) by halving
            if len(batch) > 1:
                half = len(batch) // 2
                self._answer(batch[:half])
                self._answer(batch[half:])
                return
            with self._cond:
                self._counts["questions"] += 1
            batch[0][1].set_exception(backend_error(e))
            return
        with self._cond:
            self._counts["questions"] += len(batch)
        for (_, fut), res in zip(batch, results):
            fut.set_result(res)
