"""``hf-vanilla-demo`` / ``python -m hf_vanilla.demo``: the embedded demo (:mod:`hf_vanilla.demo.run`)."""

from __future__ import annotations

import logging
import sys

from transformers import HfArgumentParser

from hf_vanilla.cli import DEBUG_EPILOG, add_debug_flag, refuse_non_finite, run_cli
from hf_vanilla.demo.run import DemoArguments, report, run_demo

logger = logging.getLogger(__name__)


def _main(argv: list[str]) -> None:
    parser = HfArgumentParser(DemoArguments, epilog=DEBUG_EPILOG)
    add_debug_flag(parser)
    refuse_non_finite(parser, argv)
    (args,) = parser.parse_args_into_dataclasses(args=argv)
    logging.basicConfig(
        format="%(asctime)s %(message)s", datefmt="%H:%M:%S", level=logging.INFO, stream=sys.stdout
    )
    for noisy in ("transformers", "datasets", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    results = run_demo(args)
    logger.info(report(results, args.output_dir))


def main(argv: list[str] | None = None) -> int:
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
