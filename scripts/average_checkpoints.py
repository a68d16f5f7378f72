"""Average the parameters of the last N Trainer checkpoints into one model folder (§6.1).

A thin wrapper of `hf_vanilla.cli.average_checkpoints`, installed by `pip install` as the command
`hf-vanilla-average` (see pyproject.toml); `--help` lists the options.
"""

import sys

from hf_vanilla.cli.average_checkpoints import main

if __name__ == "__main__":
    sys.exit(main())
