"""The command-line tools, installed by ``pip install`` as ``hf-vanilla-*`` commands (``[project.scripts]`` in
pyproject.toml); ``scripts/*.py`` in a source checkout are thin wrappers of the same ``main`` functions.

| command | module |
|---|---|
| ``hf-vanilla-train-tokenizer`` | :mod:`hf_vanilla.cli.train_tokenizer` |
| ``hf-vanilla-train`` | :mod:`hf_vanilla.cli.train` |
| ``hf-vanilla-average`` | :mod:`hf_vanilla.cli.average_checkpoints` |
| ``hf-vanilla-evaluate`` | :mod:`hf_vanilla.cli.evaluate_bleu` |
| ``hf-vanilla-plot`` | :mod:`hf_vanilla.cli.plot` |
| ``hf-vanilla-publish`` | :mod:`hf_vanilla.cli.publish` |
| ``hf-vanilla-convert`` | :mod:`hf_vanilla.cli.convert` |
| ``hf-vanilla-export-ct2`` | :mod:`hf_vanilla.cli.export_ctranslate2` |
| ``hf-vanilla-demo`` | :mod:`hf_vanilla.demo` |
"""
