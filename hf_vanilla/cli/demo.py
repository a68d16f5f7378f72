"""``hf-vanilla-demo`` / ``python -m hf_vanilla.demo``: the embedded demo (:mod:`hf_vanilla.demo.run`)."""

from __future__ import annotations

import logging
import sys

from hf_vanilla.cli import (
    DEBUG_EPILOG,
    add_debug_flag,
    dataclass_parser,
    parse_into_dataclasses,
    quiet_unused_torchao,
    refuse_non_finite,
    run_cli,
)
from hf_vanilla.demo.options import DemoArguments

logger = logging.getLogger(__name__)


def _main(argv: list[str]) -> None:
    parser = dataclass_parser(DemoArguments, epilog=DEBUG_EPILOG)
    add_debug_flag(parser)
    refuse_non_finite(parser, argv)
    (args,) = parse_into_dataclasses(parser, argv)
    quiet_unused_torchao()
    from hf_vanilla.demo.run import report, run_demo  # torch, after --help

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
