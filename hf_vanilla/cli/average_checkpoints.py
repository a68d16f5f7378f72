"""Average the parameters of the last N Trainer checkpoints into one model folder (§6.1).

    hf-vanilla-average --run_dir runs/base --last_n 5 --output_dir runs/base/averaged
    hf-vanilla-average --checkpoints runs/base/checkpoint-9000 runs/base/checkpoint-10000 \
        --output_dir runs/base/averaged
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from transformers import HfArgumentParser

from hf_vanilla.averaging import average_checkpoints, average_last_checkpoints


@dataclass
class AveragingArguments:
    output_dir: str = field(metadata={"help": "Folder for the averaged model (created)."})
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


def main() -> None:
    (args,) = HfArgumentParser(AveragingArguments).parse_args_into_dataclasses()
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    if (args.run_dir is None) == (args.checkpoints is None):
        raise SystemExit("Give either --run_dir (with --last_n) or --checkpoints, not both and not neither.")
    if args.checkpoints is not None:
        average_checkpoints(args.checkpoints, args.output_dir)
    else:
        average_last_checkpoints(args.run_dir, args.last_n, args.output_dir)


if __name__ == "__main__":
    main()
