"""Serve the web demo (hf_vanilla.demo.app): a page that translates with a model folder.

hf-vanilla-app --model demo_output            # then open the address it prints (http://127.0.0.1:7860)
"""

from __future__ import annotations

import argparse
import logging
import sys

from hf_vanilla.cli import DEBUG_EPILOG, HelpFormatter, add_debug_flag, quiet_unused_torchao, run_cli

__all__ = ["main"]


def _main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="hf-vanilla-app",
        description=__doc__,
        epilog=DEBUG_EPILOG,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--model", required=True, help="Model folder (e.g. demo_output) or Hub id.")
    parser.add_argument("--device", default="cpu", help="'cpu', 'cuda', 'auto', ...")
    parser.add_argument("--host", default="127.0.0.1", help="Address to serve on (0.0.0.0: all interfaces).")
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help="Port to serve on (default: Gradio's choice, the first free one from 7860; the address is printed).",
    )
    parser.add_argument("--share", action="store_true", help="Ask Gradio for a public link (needs internet).")
    parser.add_argument("--title", default=None, help="Page title.")
    add_debug_flag(parser)
    args = parser.parse_args(argv)
    quiet_unused_torchao()
    from hf_vanilla.demo.app import build_demo  # gradio and torch, after --help

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    demo = build_demo(args.model, device=args.device, title=args.title)
    demo.launch(server_name=args.host, server_port=args.port, share=args.share)


def main(argv: list[str] | None = None) -> int:
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
