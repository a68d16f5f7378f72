"""``python -m hf_vanilla.demo``: the embedded demo's command (:mod:`hf_vanilla.cli.demo`)."""

import sys

from hf_vanilla.cli.demo import main

if __name__ == "__main__":
    sys.argv[0] = "python -m hf_vanilla.demo"  # --help's usage line names the command, not __main__.py
    sys.exit(main())
