"""Train the shared source+target byte-level BPE tokenizer (§5.1: ~37000 tokens for EN-DE).

A thin wrapper of `hf_vanilla.cli.train_tokenizer` (installed as a command by `pip install`; see pyproject.toml)."""

from hf_vanilla.cli.train_tokenizer import main

if __name__ == "__main__":
    main()
