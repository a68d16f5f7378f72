"""Draw the model's pictures as PNG files (matplotlib, Agg canvas).

A thin wrapper of `hf_vanilla.cli.plot` (installed as a command by `pip install`; see pyproject.toml)."""

from hf_vanilla.cli.plot import main

if __name__ == "__main__":
    main()
