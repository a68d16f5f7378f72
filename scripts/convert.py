"""Convert a trained OPUS-MT (Marian) or fairseq WMT (FSMT) model into an hf_vanilla model folder.

A thin wrapper of `hf_vanilla.cli.convert`, installed by `pip install` as the command
`hf-vanilla-convert` (see pyproject.toml); `--help` lists the options.
"""

import sys

from hf_vanilla.cli.convert import main

if __name__ == "__main__":
    sys.exit(main())
