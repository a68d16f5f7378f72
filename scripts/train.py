"""Train the Transformer with the paper's recipe (§5): Adam(0.9, 0.98, 1e-9), Eq. (3) learning rate with

A thin wrapper of `hf_vanilla.cli.train`, installed by `pip install` as the command
`hf-vanilla-train` (see pyproject.toml); `--help` lists the options.
"""

import sys

from hf_vanilla.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
