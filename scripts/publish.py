"""Write the folder that would be pushed to the Hugging Face Hub, and push it when asked.

A thin wrapper of `hf_vanilla.cli.publish`, installed by `pip install` as the command
`hf-vanilla-publish` (see pyproject.toml); `--help` lists the options.
"""

import sys

from hf_vanilla.cli.publish import main

if __name__ == "__main__":
    sys.exit(main())
