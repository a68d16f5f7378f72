"""Write ONNX graphs for cached greedy decoding (needs `pip install 'hf_vanilla[onnx]'`).

A thin wrapper of `hf_vanilla.cli.export_onnx`, installed by `pip install` as the command
`hf-vanilla-export-onnx` (see pyproject.toml); `--help` lists the options.
"""

import sys

from hf_vanilla.cli.export_onnx import main

if __name__ == "__main__":
    sys.exit(main())
