"""One model worker that translates the requests waiting together as one batch.

Requests wait in a bounded list. The worker takes the oldest, and joins to it the waiting requests of
the same decoding settings (in arrival order) while their source tokens fit ``max_batch_tokens``,
waiting up to ``max_wait`` seconds from the oldest's arrival for more to come; a request with more
tokens than the cap goes alone. A full list refuses a new request (:class:`QueueFullError`) instead of
growing without bound. :meth:`RequestBatcher.close` lets the worker finish every waiting request first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["QueueFullError", "RequestBatcher"]


class QueueFullError(RuntimeError):
    """Too many requests wait already; ``retry_after`` is a number of seconds worth waiting."""

    def __init__(self, waiting: int, retry_after: int) -> None:
        self.retry_after = retry_after
        super().__init__(
            f"the server is busy ({waiting} requests wait): retry in {retry_after} s, or send fewer requests at once."
        )


@dataclass
class _Job:
    texts: list[Any]  # what ``run`` takes per text (the server: a text and its target prefix)
    tokens: int
    key: Hashable
    settings: Any
    alone: bool
    arrived: float = field(default_factory=time.monotonic)
    future: Future = field(default_factory=Future)


class RequestBatcher:
    """Translate submitted requests on one worker thread, several at a time.

    ``run(settings, texts)`` translates ``texts`` (strings, or whatever ``run`` takes per text) with one
    request's ``settings`` and returns one result per text; requests are batched only with others of an
    equal ``key``.
    """

    def __init__(
        self,
        run: Callable[[Any, list[Any]], list[Any]],
        max_batch_tokens: int,
        max_wait: float,
        max_queue: int,
    ) -> None:
        self._run = run
        self.max_batch_tokens, self.max_wait, self.max_queue = max_batch_tokens, max_wait, max_queue
        self._waiting: list[_Job] = []
        self._changed = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._work, name="hf-vanilla-model-worker", daemon=True)
        self.batches = self.requests = 0
        self._last_batch_seconds = 0.0

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Finish every waiting request, then stop the worker."""
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        self._thread.join()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def submit(
        self, texts: list[Any], tokens: int, key: Hashable, settings: Any, alone: bool = False
    ) -> Future:
        """Queue a request of ``texts`` (``tokens`` source tokens in all); the future gets ``run``'s
        results for them. ``alone``: never batched with another request (seeded sampling)."""
        job = _Job(texts, tokens, key, settings, alone)
        with self._changed:
            if self._closing:
                raise QueueFullError(len(self._waiting), 1)
            if len(self._waiting) >= self.max_queue:
                raise QueueFullError(
                    len(self._waiting), max(1, round(self._last_batch_seconds + self.max_wait))
                )
            self._waiting.append(job)
            self._changed.notify_all()
        return job.future

    def _gather(self) -> tuple[list[_Job], bool]:
        """The oldest waiting request and those that join it; whether the batch can take no more."""
        first = self._waiting[0]
        batch, tokens = [first], first.tokens
        if first.alone:
            return batch, True
        for job in self._waiting[1:]:
            if job.key != first.key or job.alone:
                continue
            if tokens + job.tokens > self.max_batch_tokens:
                return batch, True
            batch.append(job)
            tokens += job.tokens
        return batch, tokens >= self.max_batch_tokens

    def _next_batch(self) -> list[_Job] | None:
        with self._changed:
            while not self._waiting:
                if self._closing:
                    return None
                self._changed.wait()
            while True:
                batch, full = self._gather()
                left = batch[0].arrived + self.max_wait - time.monotonic()
                if full or left <= 0 or self._closing:
                    break
                self._changed.wait(left)
            taken = {id(job) for job in batch}
            self._waiting = [job for job in self._waiting if id(job) not in taken]
            return batch

    def _work(self) -> None:
        while (batch := self._next_batch()) is not None:
            jobs = [job for job in batch if job.future.set_running_or_notify_cancel()]
            if not jobs:
                continue
            started = time.monotonic()
            try:
                results = self._run(jobs[0].settings, [text for job in jobs for text in job.texts])
            except Exception as error:  # each request gets the error; the worker goes on
                for job in jobs:
                    job.future.set_exception(error)
                continue
            finally:
                self._last_batch_seconds = time.monotonic() - started
                self.batches += 1
                self.requests += len(jobs)
            start = 0
            for job in jobs:
                job.future.set_result(results[start : start + len(job.texts)])
                start += len(job.texts)
            logger.debug("translated %d request(s) in one batch", len(jobs))
