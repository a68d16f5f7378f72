"""Average the parameters of the last N Trainer checkpoints into one model folder (§6.1).

    hf-vanilla-average --run_dir runs/base --last_n 5 --output_dir runs/base/averaged
    hf-vanilla-average --checkpoints runs/base/checkpoint-9000 runs/base/checkpoint-10000 \
        --output_dir runs/base/averaged
    hf-vanilla-average --run_dir runs/base --list_checkpoints

--run_dir picks the checkpoints by step number (checkpoint-900 before checkpoint-1000, whatever the
folder's path); <output_dir>/averaged_checkpoints.json records which were averaged. --list_checkpoints
prints the complete checkpoints of --run_dir, oldest first by step, one per line (the last line is
the newest complete one, e.g. to evaluate it alone), and writes nothing.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from hf_vanilla.cli import parse_arguments, run_cli
from hf_vanilla.io.atomic import OVERWRITE_HELP


@dataclass
class AveragingArguments:
    output_dir: str | None = field(
        default=None,
        metadata={"help": "Folder for the averaged model (created; an existing one needs --overwrite)."},
    )
    run_dir: str | None = field(
        default=None, metadata={"help": "Training output folder holding checkpoint-<step> folders."}
    )
    last_n: int = field(
        default=5,
        metadata={
            "help": "Average the last N checkpoints of --run_dir, by step (paper: 5 for base, 20 for big)."
        },
    )
    checkpoints: list[str] | None = field(
        default=None, metadata={"help": "Explicit checkpoint folders, oldest first (instead of --run_dir)."}
    )
    overwrite: bool = field(default=False, metadata={"help": OVERWRITE_HELP})
    list_checkpoints: bool = field(
        default=False,
        metadata={
            "help": "Print the complete checkpoints of --run_dir, oldest first by step, one per line; write nothing."
        },
    )


def _print_complete_checkpoints(run_dir: str) -> None:
    from hf_vanilla.io.checkpoints import find_complete_checkpoints  # torch, after --help

    found = find_complete_checkpoints(run_dir)
    if not found:
        raise FileNotFoundError(
            f"No complete checkpoint-<step> folders in {run_dir!r}. Train with checkpoints (--save_steps), or "
            "check the path."
        )
    print("\n".join(str(path) for path in found))


def _run(argv: list[str]) -> None:
    parser, (args,) = parse_arguments(argv, AveragingArguments, __doc__)
    if (args.run_dir is None) == (args.checkpoints is None):
        parser.error("Give either --run_dir (with --last_n) or --checkpoints, not both and not neither.")
    if args.list_checkpoints:
        if args.run_dir is None or args.output_dir is not None:
            parser.error(
                "--list_checkpoints prints the checkpoints of --run_dir and writes nothing: give only --run_dir."
            )
        _print_complete_checkpoints(args.run_dir)
        return
    if args.output_dir is None:
        parser.error("--output_dir is required: the folder for the averaged model.")
    if args.run_dir is not None and args.last_n < 1:
        raise ValueError(
            f"--last_n {args.last_n}: give a positive number of checkpoints to average (paper: 5)."
        )
    from hf_vanilla.training.averaging import average_checkpoints, average_last_checkpoints  # torch

    if args.checkpoints is not None:
        average_checkpoints(args.checkpoints, args.output_dir, args.overwrite)
    else:
        average_last_checkpoints(args.run_dir, args.last_n, args.output_dir, args.overwrite)


def main(argv: list[str] | None = None) -> int:
    return run_cli(_run, argv)


if __name__ == "__main__":
    sys.exit(main())
