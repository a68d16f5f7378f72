"""Average the parameters of the last N Trainer checkpoints into one model folder (§6.1).

A thin wrapper of `hf_vanilla.cli.average_checkpoints` (installed as a command by `pip install`; see pyproject.toml)."""

from hf_vanilla.cli.average_checkpoints import main

if __name__ == "__main__":
    main()
