"""Train the shared source+target byte-level BPE tokenizer (§5.1: ~37000 tokens for EN-DE).

A thin wrapper of `hf_vanilla.cli.train_tokenizer`, installed by `pip install` as the command
`hf-vanilla-train-tokenizer` (see pyproject.toml); `--help` lists the options.
"""

import sys

from hf_vanilla.cli.train_tokenizer import main

if __name__ == "__main__":
    sys.exit(main())
