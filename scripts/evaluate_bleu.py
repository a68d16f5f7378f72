"""Translate a split with the paper's decoding (§6.1) and report corpus BLEU and chrF (sacreBLEU, offline).

A thin wrapper of `hf_vanilla.cli.evaluate_bleu` (installed as a command by `pip install`; see pyproject.toml)."""

from hf_vanilla.cli.evaluate_bleu import main

if __name__ == "__main__":
    main()
