"""Write a CTranslate2 model from an hf_vanilla model folder (needs `pip install 'hf_vanilla[ct2]'`).

A thin wrapper of `hf_vanilla.cli.export_ctranslate2`, installed by `pip install` as the command
`hf-vanilla-export-ct2` (see pyproject.toml); `--help` lists the options.
"""

import sys

from hf_vanilla.cli.export_ctranslate2 import main

if __name__ == "__main__":
    sys.exit(main())
