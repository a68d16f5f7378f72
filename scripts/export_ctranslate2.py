"""Write a CTranslate2 model from an hf_vanilla model folder (needs `pip install 'hf_vanilla[ct2]'`).

A thin wrapper of `hf_vanilla.cli.export_ctranslate2` (installed as a command by `pip install`; see pyproject.toml)."""

from hf_vanilla.cli.export_ctranslate2 import main

if __name__ == "__main__":
    main()
