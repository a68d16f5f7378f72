"""Draw the model's pictures as PNG files (matplotlib, Agg canvas).

A thin wrapper of `hf_vanilla.cli.plot`, installed by `pip install` as the command
`hf-vanilla-plot` (see pyproject.toml); `--help` lists the options.
"""

import sys

from hf_vanilla.cli.plot import main

if __name__ == "__main__":
    sys.exit(main())
