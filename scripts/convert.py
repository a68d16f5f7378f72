"""Convert a trained OPUS-MT (Marian) or fairseq WMT (FSMT) model into an hf_vanilla model folder.

A thin wrapper of `hf_vanilla.cli.convert` (installed as a command by `pip install`; see pyproject.toml)."""

from hf_vanilla.cli.convert import main

if __name__ == "__main__":
    main()
