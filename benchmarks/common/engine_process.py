"""A benchmark engine in a process of its own, spoken to in JSON lines.

Engines with thread pools of their own slow each other down in one process: once CTranslate2 or ONNX
Runtime had run, torch's dynamic-int8 decoding took 13.0 s instead of 8.5–9.9 s, and CTranslate2 int8
with torch imported beside it was 1.4× slower (benchmarks/log/2026-11-29_to_2026-12-03.md, 2026-12-02). So the benchmarks
that compare engines load each one in a worker process that imports only that engine, and time each
call inside the worker. :class:`EngineProcess` is the benchmark's side; :func:`serve` the worker's.
This module imports neither torch nor an engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

Message = dict[str, Any]

#: ``--ct2_threads``'s help, in every benchmark that has the option.
CT2_THREADS_HELP = (
    "CTranslate2's threads, when not --threads (on a 2-core VM its int8 runs 2-8x faster on 1)."
)


def engine_threads(name: str, threads: int, ct2_threads: int | None) -> int:
    """The threads an engine decodes with: ``ct2_threads`` for a CTranslate2 one (``name`` starting
    with ``ct2``; it reads its ``intra_threads`` from ``OMP_NUM_THREADS``) when given, else ``threads``."""
    return ct2_threads if name.startswith("ct2") and ct2_threads else threads


class EngineProcess:
    """A worker started with ``command`` (``OMP_NUM_THREADS=threads``, offline); its first line is
    :attr:`ready`, then it answers each :meth:`request` with one line."""

    def __init__(self, command: list[str], threads: int, name: str) -> None:
        self.name = name
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        self.ready = self._read()

    def _read(self) -> Message:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(
                f"the {self.name} worker exited with status {self.process.wait()} (its error is printed above)"
            )
        return json.loads(line)

    def request(self, message: Message) -> Message:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait()


def serve(load: Callable[[], tuple[Callable[[Message], Message], Message]]) -> None:
    """The worker's loop: ``load()`` loads the engine and returns the request handler and the ready
    message; answers go to the process's stdout, anything the libraries print to its stderr."""
    answers, sys.stdout = sys.stdout, sys.stderr
    handle, ready = load()
    answers.write(json.dumps(ready) + "\n")
    answers.flush()
    for line in sys.stdin:
        answers.write(json.dumps(handle(json.loads(line))) + "\n")
        answers.flush()
