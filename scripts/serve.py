"""Serve translations over HTTP (FastAPI + uvicorn): POST /translate, GET /health, docs at /docs.

A thin wrapper of `hf_vanilla.cli.serve`, installed by `pip install` as the command
`hf-vanilla-serve` (see pyproject.toml); `--help` lists the options.
"""

import sys

from hf_vanilla.cli.serve import main

if __name__ == "__main__":
    sys.exit(main())
