"""Translate text, one sentence per line, with the paper's decoding (§6.1: beam 4, α = 0.6, input length + 50).

A thin wrapper of `hf_vanilla.cli.translate`, installed by `pip install` as the command
`hf-vanilla-translate` (see pyproject.toml); `--help` lists the options.
"""

import sys

from hf_vanilla.cli.translate import main

if __name__ == "__main__":
    sys.exit(main())
