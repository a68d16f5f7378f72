"""Translating a stream (stdin or a file) line by line, in batches, as lines arrive."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import queue
import sys
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple

from hf_vanilla.data.text import text_lines
from hf_vanilla.inference.options import DecodingOptions
from hf_vanilla.inference.translation import (
    InputTooLongError,
    TargetPrefixError,
    format_alignment,
    format_nbest,
    translate_nbest,
)
from hf_vanilla.io.atomic import atomic_file, full_disk_named, refuse_to_replace

if TYPE_CHECKING:
    import torch

__all__ = [
    "PAUSE_SECONDS",
    "Span",
    "check_alignment_file",
    "check_input_file",
    "check_prefix_file",
    "translate_stream",
]

logger = logging.getLogger(__name__)

#: Seconds without a new line after which the lines read so far from stdin are translated.
PAUSE_SECONDS = 0.1


class Span(NamedTuple):
    """Input lines ``first`` to ``stop`` (from 0, ``stop`` excluded) of a regular file, which start at byte
    ``offset`` of the input and ``prefix_offset`` of the target prefix file."""

    first: int
    stop: int
    offset: int
    prefix_offset: int = 0


def check_input_file(source: str | Path, flag: str = "--input_file") -> bool:
    """Raise (one line, naming ``flag``) if the input file ``source`` is missing or a folder; return whether
    it is a regular file (``False``: a pipe, such as bash's ``<(...)``, which can be read only once)."""
    path = Path(source)
    if not path.exists():
        stdin = ", or pass - for stdin" if flag == "--input_file" else ""
        raise FileNotFoundError(f"{flag} {str(source)!r} does not exist. Check the path{stdin}.")
    if path.is_dir():
        raise IsADirectoryError(f"{flag} {str(source)!r} is a folder; give a text file, one sentence a line.")
    return path.is_file()


def translate_stream(
    model: Any,
    tokenizer: Any,
    source: str | Path | None,
    output: str | Path | None,
    options: DecodingOptions | None = None,
    batch_size: int = 64,
    device: str | torch.device | None = None,
    chunk_lines: int = 10_000,
    generate_kwargs: dict[str, Any] | None = None,
    overwrite: bool = False,
    nbest: int | None = None,
    max_tokens: int = 0,
    pause: float = PAUSE_SECONDS,
    prefix_file: str | Path | None = None,
    alignment_file: str | Path | None = None,
    split_sentences: str | None = None,
    span: Span | None = None,
) -> int:
    """Translate a file (or stdin when ``source`` is None or ``"-"``) line by line to a file (or stdout).

    Lines are buffered and translated when ``chunk_lines`` of them are waiting (fairseq-interactive's
    ``--buffer-size``), at the end of the input, and, on stdin, when no new line has come for ``pause``
    seconds: typed or piped lines are translated as they arrive, and long files do not need to fit in
    memory. Output goes to stdout as each buffer is translated. Without ``nbest`` each input line gives
    one output line, blank lines blank lines; with ``nbest`` see :func:`format_nbest`.
    Input must be UTF-8 text: a file is checked whole before anything is translated (a pipe, such as
    bash's ``<(...)``, is read once, as it comes, like stdin), and a bad line (or one longer than the
    model's longest input) raises ``ValueError`` naming the file and line.
    An output file that exists is refused (``FileExistsError``) unless ``overwrite``; the output is
    written under a temporary name beside it and renamed into place when every line is translated,
    so it is complete or absent (an old one stays as it was) — never partial. Without ``overwrite``, a
    file that appeared there meanwhile is not replaced either
    (:class:`~hf_vanilla.io.atomic.OutputAppearedError`). Returns the number of lines translated.

    ``prefix_file`` (``--target_prefix_file``): a UTF-8 file of target prefixes, one per input line (a blank
    line: none), read alongside the input; see :func:`translate_nbest`. A regular input file with another
    number of lines is refused before anything is translated. With a sampling ``seed``, the buffer that
    starts at input line L (from 0) is sampled with seed + L: a file gives the same samples each time.

    ``alignment_file`` (``--alignment_file``): the hard alignment of each translation, one line per input
    line (``SRC-TGT`` token index pairs, see :func:`~hf_vanilla.inference.decoding.hard_alignments`; a
    blank line for a blank input or an empty translation), written like the output file: whole or not at
    all, and an existing one only with ``overwrite``. Not with ``nbest``. ``split_sentences``: see
    :func:`translate_nbest`.

    ``span``: translate only these lines of a regular input file (and of the prefix file), numbered (n-best
    indices, errors, sampling seeds) as in the whole file; the caller has checked both files whole.
    """
    if chunk_lines < 1:
        raise ValueError(f"--buffer_size must be at least 1 line, got {chunk_lines}.")
    from_stdin, to_stdout = source in (None, "-"), output in (None, "-")
    if not to_stdout:
        refuse_to_replace(output, overwrite, "--output_file", kind="file", inputs=[source])
    if alignment_file is not None:
        check_alignment_file(alignment_file, overwrite, nbest, [source, output, prefix_file])
    name = "<stdin>" if from_stdin else str(source)
    streamed = from_stdin or not check_input_file(source)  # read once, as it comes
    prefix_name = str(prefix_file)
    if prefix_file is not None and span is None:
        check_prefix_file(prefix_file, source)
    if not streamed and span is None:
        with open(source, "rb") as handle:
            for _ in text_lines(handle, name):  # fail before hours of translation, not after
                pass
    count = 0 if span is None else span.first
    seed = None if options is None else options.seed
    with contextlib.ExitStack() as stack:
        in_stream = _stdin_reader() if from_stdin else stack.enter_context(open(source, "rb"))
        if to_stdout:  # a file has its own (atomic_file)
            stack.enter_context(
                full_disk_named("<stdout>", "what was written before the disk filled up stays")
            )
        out_stream = sys.stdout if to_stdout else stack.enter_context(atomic_file(output))
        alignment_stream = (
            None if alignment_file is None else stack.enter_context(atomic_file(alignment_file))
        )
        lines = _lines(in_stream, name, span, span and span.offset)
        buffers = _buffers(lines, chunk_lines, pause) if streamed else _chunks(lines, chunk_lines)
        prefix_lines = (
            None
            if prefix_file is None
            else _lines(
                stack.enter_context(open(prefix_file, "rb")), prefix_name, span, span and span.prefix_offset
            )
        )
        for chunk in buffers:
            prefixes = None if prefix_lines is None else list(itertools.islice(prefix_lines, len(chunk)))
            if prefixes is not None and len(prefixes) < len(chunk):
                raise ValueError(
                    f"--target_prefix_file {prefix_name!r} ends at line {count + len(prefixes)}, before the "
                    f"input: give one prefix per input line (a blank line for none); no output was written."
                )
            if seed is not None:  # each buffer draws numbers of its own
                options = dataclasses.replace(options, seed=seed + count)
            try:
                translated = translate_nbest(
                    model, tokenizer, chunk, options, batch_size, device, generate_kwargs, nbest, max_tokens,
                    prefixes, alignment_stream is not None, split_sentences,
                )  # fmt: skip
            except InputTooLongError as err:
                raise InputTooLongError(
                    count + err.index, err.length, err.limit, f"{name}, line {count + err.index + 1}"
                ) from None
            except TargetPrefixError as err:
                raise TargetPrefixError(
                    count + err.index, err.reason, f"--target_prefix_file {prefix_name}"
                ) from None
            for index, hypotheses in enumerate(translated, start=count):
                if alignment_stream is not None:
                    alignment_stream.write(
                        format_alignment(hypotheses[0].alignment if hypotheses else None) + "\n"
                    )
                if nbest is None:
                    out_stream.write((hypotheses[0].text if hypotheses else "") + "\n")
                else:
                    out_stream.write(format_nbest(index, hypotheses))
            out_stream.flush()
            count += len(chunk)
            if not to_stdout:  # progress: the file itself appears only when every line is translated
                logger.info("Lines translated so far: %d (%s is written when all are)", count, output)
        if prefix_lines is not None and span is None and next(prefix_lines, None) is not None:
            raise ValueError(
                f"--target_prefix_file {prefix_name!r} has more lines than the input ({count}): give one "
                "prefix per input line; no output file was written."
            )
    return count


def _lines(stream: BinaryIO, name: str, span: Span | None, offset: int | None) -> Iterator[str]:
    """The checked lines of ``stream``: all of them, or those of ``span``, read from byte ``offset`` on."""
    if span is None:
        return text_lines(stream, name)
    stream.seek(offset)
    return itertools.islice(text_lines(stream, name, first=span.first + 1), span.stop - span.first)


def check_alignment_file(
    alignment_file: str | Path, overwrite: bool, nbest: int | None, inputs: list[str | Path | None]
) -> None:
    """Refuse (one line) an ``--alignment_file`` with ``--nbest``, or one that may not be written."""
    if nbest is not None:
        raise ValueError("--alignment_file aligns the one translation of each line: leave out --nbest.")
    refuse_to_replace(alignment_file, overwrite, "--alignment_file", kind="file", inputs=inputs)


def check_prefix_file(prefix_file: str | Path, source: str | Path | None) -> None:
    """Refuse (one line) a missing ``--target_prefix_file``, and one whose line count is not that of a
    regular input file ``source`` (stdin and pipes are checked while they are read)."""
    if not check_input_file(prefix_file, "--target_prefix_file") or source in (None, "-"):
        return
    if not check_input_file(source):
        return
    counts = []
    for path in (prefix_file, source):
        with open(path, "rb") as handle:
            counts.append(sum(1 for _ in text_lines(handle, str(path))))
    if counts[0] != counts[1]:
        raise ValueError(
            f"--target_prefix_file {str(prefix_file)!r} has {counts[0]} line(s), --input_file {str(source)!r} "
            f"has {counts[1]}: give one prefix per input line (a blank line for none)."
        )


def _stdin_reader() -> BinaryIO:
    """stdin as a binary stream of its own, for the reader thread of :func:`_buffers`.

    That daemon thread may still wait in a read when the command ends (an error, Ctrl-C): on
    ``sys.stdin.buffer`` it would hold the lock that the interpreter takes to close stdin at exit, which
    aborts it ("Fatal Python error: _enter_buffered_busy"). A reader of its own over the same descriptor
    (not closing it) is never closed at exit. A replaced ``sys.stdin`` without a descriptor is read as it is.
    """
    stdin = getattr(sys.stdin, "buffer", sys.stdin)
    try:
        descriptor = stdin.fileno()
    except (AttributeError, OSError, ValueError):
        return stdin
    return open(descriptor, "rb", closefd=False)  # left open: the reader thread may still use it


def _chunks(items: Iterable[str], size: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


_END = object()


def _buffers(items: Iterator[str], size: int, pause: float) -> Iterator[list[str]]:
    """Like :func:`_chunks`, and also yield what has arrived when no item comes for ``pause`` seconds.

    A daemon thread reads ``items`` (it blocks on a terminal or pipe) into a bounded queue; an error
    while reading (bad UTF-8) is raised here, after the lines before it.
    """
    arrived: queue.Queue[tuple[object, BaseException | None]] = queue.Queue(maxsize=2 * size)

    def read() -> None:
        try:
            for item in items:
                arrived.put((item, None))
        except Exception as err:  # handed to the consumer, which raises it
            arrived.put((_END, err))
            return
        arrived.put((_END, None))

    threading.Thread(target=read, name="hf_vanilla-stdin", daemon=True).start()
    buffer: list[str] = []
    while True:
        try:
            item, error = arrived.get(timeout=pause if buffer else None)
        except queue.Empty:  # the input paused: translate what is there
            yield buffer
            buffer = []
            continue
        if item is _END:
            if buffer:
                yield buffer
            if error is not None:
                raise error
            return
        buffer.append(item)
        if len(buffer) == size:
            yield buffer
            buffer = []
