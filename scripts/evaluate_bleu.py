"""Translate a split with the paper's decoding (§6.1) and report corpus BLEU and chrF (sacreBLEU, offline).

A thin wrapper of `hf_vanilla.cli.evaluate_bleu`, installed by `pip install` as the command
`hf-vanilla-evaluate` (see pyproject.toml); `--help` lists the options.
"""

import sys

from hf_vanilla.cli.evaluate_bleu import main

if __name__ == "__main__":
    sys.exit(main())
