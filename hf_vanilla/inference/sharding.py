"""Translating a corpus on many processes: the input is split into contiguous parts, each part is
written whole with a done marker into a folder beside the output, and the parts are joined in input
order.

Who translates which parts:

* ``torchrun`` or ``accelerate launch`` (``WORLD_SIZE`` > 1): process ``RANK`` translates the
  ``RANK``-th contiguous block of parts; when every process has finished (a barrier of a gloo process
  group), rank 0 joins the parts into the output.
* ``--num_shards K --shard_id I`` (a scheduler's job array, no launcher): shard ``I`` translates the
  ``I``-th block and stops; the same command with ``--merge`` joins the parts.

The folder ``OUTPUT.parts/`` holds ``plan.json`` (the input's line count and SHA-256, the lines per
part, and the options that shape the output) and, for each part ``k``, ``part-k.txt`` (and
``part-k.align`` with ``--alignment_file``), then ``part-k.done``: the lines the part holds and the
size and SHA-256 of its files, written after them. A relaunch keeps the plan: finished parts are
skipped, and a plan made for another input or other options is refused. Joining checks every part
against its marker and the input against the plan, writes the output whole (write, then rename) and
removes the folder.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import math
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from hf_vanilla.data.text import text_lines
from hf_vanilla.inference.options import ShardingArguments
from hf_vanilla.inference.streaming import Span
from hf_vanilla.io.atomic import atomic_file
from hf_vanilla.io.checksums import file_sha256
from hf_vanilla.io.json_files import read_json

__all__ = [
    "PARTS_SUFFIX",
    "Plan",
    "launched",
    "merge_parts",
    "parts_folder",
    "plan_parts",
    "rank_device",
    "resolve_shard",
    "translate_shard",
    "wait_for_all_ranks",
]

logger = logging.getLogger(__name__)

#: The parts of ``OUTPUT`` are written into the folder ``OUTPUT.parts``.
PARTS_SUFFIX = ".parts"

_PLAN = "plan.json"

#: Options that do not change what the output holds (where it goes, how the work is split, how many
#: sentences a batch holds); the others are recorded in the plan, and a relaunch must repeat them.
_RUN_ONLY = frozenset(
    {"input_file", "output_file", "overwrite", "buffer_size", "device", "batch_size", "max_tokens"}
    | {field.name for field in dataclasses.fields(ShardingArguments)}
)

#: How long the processes that finished wait for the others before rank 0 joins the parts.
_BARRIER_TIMEOUT = datetime.timedelta(days=7)


def parts_folder(output: str | Path) -> Path:
    """The folder beside ``output`` that holds its parts."""
    output = Path(output)
    return output.with_name(output.name + PARTS_SUFFIX)


def launched() -> tuple[int, int] | None:
    """``(RANK, WORLD_SIZE)`` as ``torchrun`` and ``accelerate launch`` set them, where they started more
    than one process; ``None`` otherwise."""
    world = os.environ.get("WORLD_SIZE", "").strip()
    if not world or world == "1":
        return None
    try:
        rank, size = int(os.environ.get("RANK", "")), int(world)
    except ValueError:
        raise ValueError(
            f"WORLD_SIZE={world!r} and RANK={os.environ.get('RANK')!r} are not the numbers a launcher sets: "
            "start the command with torchrun or accelerate launch, or unset them."
        ) from None
    if not 0 <= rank < size:
        raise ValueError(f"RANK={rank} is outside WORLD_SIZE={size}: start the command with a launcher.")
    return rank, size


def resolve_shard(args: ShardingArguments) -> tuple[int, int] | None:
    """The shard this process translates, ``(shard, shards)``: from ``--num_shards``/``--shard_id`` or from
    the launcher; ``None`` for one process translating everything (or ``--merge``). Contradictory flags are
    refused in one line."""
    launch = launched()
    if launch is not None and (args.num_shards is not None or args.shard_id is not None or args.merge):
        raise ValueError(
            f"This process is rank {launch[0]} of {launch[1]} started by a launcher, which split the input "
            "between them: leave out --num_shards, --shard_id and --merge (or run without the launcher)."
        )
    if args.num_shards is not None and args.num_shards < 1:
        raise ValueError(f"--num_shards {args.num_shards}: give a positive number of shards.")
    if args.merge:
        if args.shard_id is not None:
            raise ValueError("--merge joins every shard's parts: leave out --shard_id.")
        return None
    if args.shard_id is None:
        if args.num_shards is not None:
            raise ValueError(
                f"--num_shards {args.num_shards}: give --shard_id (0 to {args.num_shards - 1}) to translate "
                "one shard, or --merge to join the finished ones."
            )
        return launch
    if args.num_shards is None:
        raise ValueError(f"--shard_id {args.shard_id}: give --num_shards too (how many shards there are).")
    if not 0 <= args.shard_id < args.num_shards:
        raise ValueError(
            f"--shard_id {args.shard_id}: give a shard from 0 to {args.num_shards - 1} (--num_shards "
            f"{args.num_shards})."
        )
    return args.shard_id, args.num_shards


def rank_device(device: str) -> str:
    """``--device auto`` of a launched process on a machine with GPUs: the GPU of its ``LOCAL_RANK``
    (each process its own); any other ``device`` as it is."""
    if device != "auto" or launched() is None:
        return device
    import torch

    count = torch.cuda.device_count()
    return f"cuda:{int(os.environ.get('LOCAL_RANK', '0')) % count}" if count else device


@dataclasses.dataclass(frozen=True)
class Plan:
    """How a corpus is cut into parts, and what its output depends on."""

    lines: int
    sha256: str
    part_lines: int
    settings: dict[str, Any]

    @property
    def parts(self) -> int:
        return math.ceil(self.lines / self.part_lines)

    def lines_of(self, part: int) -> tuple[int, int]:
        """The input lines of ``part``: ``(first, stop)``, from 0, ``stop`` excluded."""
        return part * self.part_lines, min((part + 1) * self.part_lines, self.lines)

    def block(self, shard: int, shards: int) -> range:
        """The parts of ``shard`` of ``shards``: a contiguous block, the blocks as equal as can be."""
        return range(shard * self.parts // shards, (shard + 1) * self.parts // shards)


def _scan(path: str | Path, flag: str) -> tuple[int, str]:
    """The number of lines of the text file ``path`` and its SHA-256; a line that is not UTF-8 text is
    refused naming the file and line, before anything is translated."""
    with open(path, "rb") as handle:
        count = sum(1 for _ in text_lines(handle, f"{flag} {str(path)!r}"))
    return count, file_sha256(Path(path))


def output_settings(options: dict[str, Any]) -> dict[str, Any]:
    """The options (all of the command's, by name) that shape the output: a prefix file by its content."""
    settings = {name: value for name, value in options.items() if name not in _RUN_ONLY}
    if settings.get("alignment_file") is not None:
        settings["alignment_file"] = True
    if settings.get("target_prefix_file") is not None:
        settings["target_prefix_file"] = file_sha256(Path(settings["target_prefix_file"]))
    return json.loads(json.dumps(settings))  # as the plan file gives them back


def _differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return [
        f"{name} {old.get(name)!r} → {new.get(name)!r}"
        for name in sorted(set(old) | set(new))
        if old.get(name) != new.get(name)
    ]


def _refuse_other_plan(folder: Path, stored: dict[str, Any], plan: Plan, flag: str) -> None:
    if (stored.get("lines"), stored.get("sha256")) != (plan.lines, plan.sha256):
        raise ValueError(
            f"{flag}: the parts in {str(folder)!r} were made from another input ({stored.get('lines')} lines, now "
            f"{plan.lines}, or other text); nothing was changed. Give the same input, or remove {str(folder)!r} "
            "to start over."
        )
    changed = _differences(stored.get("settings", {}), plan.settings)
    if changed:
        raise ValueError(
            f"{flag}: the parts in {str(folder)!r} were made with other options ({'; '.join(changed[:3])}); "
            f"nothing was changed. Run with the same options, or remove {str(folder)!r} to start over."
        )


def plan_parts(
    input_file: str | Path,
    output_file: str | Path,
    settings: dict[str, Any],
    part_lines: int,
    shards: int,
    write: bool = True,
) -> Plan:
    """The plan of the parts of ``output_file``: the one in its parts folder (refused if it was made for
    another input or other ``settings``; see :func:`output_settings`), else a new one of parts of at
    most ``part_lines`` lines, at least one per shard where the input has the lines, written there unless
    ``write`` is false (``--merge``)."""
    lines, sha256 = _scan(input_file, "--input_file")
    folder = parts_folder(output_file)
    path = folder / _PLAN
    fresh = Plan(lines, sha256, max(1, min(part_lines, math.ceil(lines / shards))), settings)
    flag = "--merge" if not write else "--output_file " + repr(str(output_file))
    if not path.is_file():
        if not write:
            raise FileNotFoundError(
                f"--merge: {str(folder)!r} holds no parts of {str(output_file)!r} ({_PLAN} is missing): translate "
                "the shards first (--num_shards K --shard_id I), then merge; nothing was written."
            )
        with atomic_file(path) as handle:  # several processes may write it: the same content
            handle.write(json.dumps(dataclasses.asdict(fresh), indent=1, sort_keys=True) + "\n")
        return fresh
    stored = read_json(path, hint=f"Remove {str(folder)!r} to start over.")
    part_lines = stored.get("part_lines")
    if isinstance(part_lines, bool) or not isinstance(part_lines, int) or part_lines < 1:
        raise ValueError(
            f"{str(path)!r} is damaged: 'part_lines' is {part_lines!r}, not a positive number of lines. Remove "
            f"{str(folder)!r} to start over."
        )
    _refuse_other_plan(folder, stored, fresh, flag)
    return dataclasses.replace(fresh, part_lines=part_lines)


def _line_offsets(path: str | Path, wanted: Iterable[int]) -> dict[int, int]:
    """The byte offset at which each ``wanted`` line (from 0) of ``path`` starts."""
    wanted = sorted(set(wanted))
    offsets: dict[int, int] = {}
    position = 0
    with open(path, "rb") as handle:
        for number, line in enumerate(handle):
            if len(offsets) == len(wanted):
                break
            if number in wanted:
                offsets[number] = position
            position += len(line)
    return {line: offsets.get(line, position) for line in wanted}


def _files(folder: Path, part: int, alignments: bool) -> dict[str, Path]:
    names = {"txt": folder / f"part-{part:06d}.txt"}
    if alignments:
        names["align"] = folder / f"part-{part:06d}.align"
    return names


def _marker(folder: Path, part: int) -> Path:
    return folder / f"part-{part:06d}.done"


def _finished(folder: Path, plan: Plan, part: int) -> bool:
    """Whether ``part`` is finished: its marker names its lines, and its files have the recorded sizes
    and SHA-256."""
    marker = _marker(folder, part)
    if not marker.is_file():
        return False
    done = read_json(marker, hint=f"Remove it: the part is translated again. ({str(folder)!r})")
    alignments = bool(plan.settings.get("alignment_file"))
    files = _files(folder, part, alignments)
    if done.get("lines") != list(plan.lines_of(part)) or set(done.get("files", {})) != set(files):
        return False
    return all(
        path.is_file()
        and path.stat().st_size == done["files"][kind]["bytes"]
        and file_sha256(path) == done["files"][kind]["sha256"]
        for kind, path in files.items()
    )


def translate_shard(
    plan: Plan,
    output_file: str | Path,
    shard: int,
    shards: int,
    translate_part: Callable[[Span, Path, Path | None], object],
    input_file: str | Path,
    prefix_file: str | Path | None = None,
) -> None:
    """Translate the unfinished parts of ``shard`` of ``shards``: ``translate_part(span, text, alignment)``
    writes the lines of ``span`` into the file ``text`` (and their alignments into ``alignment``, ``None``
    without ``--alignment_file``); then each part's done marker is written."""
    folder = parts_folder(output_file)
    alignments = bool(plan.settings.get("alignment_file"))
    todo = [part for part in plan.block(shard, shards) if not _finished(folder, plan, part)]
    skipped = len(plan.block(shard, shards)) - len(todo)
    logger.info(
        "Shard %d of %d: parts %s of %d (%d finished before, skipped)",
        shard, shards, _range_text(plan.block(shard, shards)), plan.parts, skipped,
    )  # fmt: skip
    starts = [plan.lines_of(part)[0] for part in todo]
    offsets = _line_offsets(input_file, starts)
    prefix_offsets = _line_offsets(prefix_file, starts) if prefix_file is not None else {}
    for part in todo:
        first, stop = plan.lines_of(part)
        files = _files(folder, part, alignments)
        span = Span(first, stop, offsets[first], prefix_offsets.get(first, 0))
        translate_part(span, files["txt"], files.get("align"))
        record = {
            "lines": [first, stop],
            "files": {
                kind: {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
                for kind, path in files.items()
            },
        }
        with atomic_file(_marker(folder, part)) as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
        logger.info("Part %d of %d (lines %d to %d) is written", part + 1, plan.parts, first + 1, stop)


def _range_text(parts: range) -> str:
    if not parts:
        return "none"
    return f"{parts.start + 1} to {parts.stop}"


def wait_for_all_ranks() -> None:
    """Wait until every process of the launch has reached this point (a barrier of a gloo process group,
    which works with GPUs or without them)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=_BARRIER_TIMEOUT)
    try:
        dist.barrier()
    finally:
        dist.destroy_process_group()


def merge_parts(
    plan: Plan,
    output_file: str | Path,
    alignment_file: str | Path | None,
    shards: int | None = None,
) -> None:
    """Join the parts of ``output_file`` in input order into ``output_file`` (and their alignments into
    ``alignment_file``), each written whole; then remove the parts folder. A part that is missing or
    unfinished is refused in one line naming the parts (and, given ``shards``, the shards to run again);
    nothing is written then."""
    folder = parts_folder(output_file)
    missing = [part for part in range(plan.parts) if not _finished(folder, plan, part)]
    if missing:
        listed = ", ".join(str(part + 1) for part in missing[:5]) + (", ..." if len(missing) > 5 else "")
        rerun = ""
        if shards is not None:
            owners = sorted(
                {shard for shard in range(shards) for part in missing if part in plan.block(shard, shards)}
            )
            rerun = f" Run shard(s) {', '.join(map(str, owners[:10]))} again (--shard_id)."
        raise ValueError(
            f"--merge: {len(missing)} of the {plan.parts} parts in {str(folder)!r} are missing or unfinished "
            f"(part {listed}); nothing was written.{rerun}"
        )
    outputs = {"txt": Path(output_file)}
    if alignment_file is not None:
        outputs["align"] = Path(alignment_file)
    for kind, output in outputs.items():
        with atomic_file(output, binary=True) as handle:
            for part in range(plan.parts):
                with open(_files(folder, part, True)[kind], "rb") as source:
                    shutil.copyfileobj(source, handle)
    shutil.rmtree(folder)
    logger.info("%d lines in %d parts joined into %s", plan.lines, plan.parts, output_file)
