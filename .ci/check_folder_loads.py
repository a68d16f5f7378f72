"""CI check: a model folder saved with the installed transformers loads and generates where hf_vanilla is
not installed, with the same tokens as hf_vanilla's own classes.

Run by .ci/run once per transformers release it tests (the newest pip resolves, and the lowest
pyproject.toml allows). A tiny folder is saved with the working tree's code, then loaded with
``trust_remote_code=True`` in a fresh interpreter that cannot import hf_vanilla (the way
tests/helpers.py's ``run_clean`` does); greedy and beam search run on it. On failure the one line on
stderr names the release, and the exit status is 1.
"""

from __future__ import annotations

import json
import sys
import tempfile
import traceback
from pathlib import Path

import transformers

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # tests/helpers.py: the tiny model and the hf_vanilla import block

SENTENCES = ["w1 w2 w3", "w4", "w5 w6"]

LOAD = r"""
import json, sys
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
model = AutoModelForSeq2SeqLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=True)
batch = tokenizer(json.loads(sys.argv[2]), padding=True, return_tensors="pt")
ids = [model.generate(**batch, max_new_tokens=8, num_beams=beams).tolist() for beams in (1, 4)]
assert not any(name == "hf_vanilla" or name.startswith("hf_vanilla.") for name in sys.modules)
print(json.dumps({"module": type(model).__module__, "ids": ids}))
"""


def save_folder(folder: Path) -> list:
    """Save a tiny model with its tokenizer into ``folder``; return the tokens its ``generate()`` gives."""
    import torch
    from helpers import tiny_model, word_tokenizer

    model, tokenizer = tiny_model(), word_tokenizer()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    with torch.no_grad():
        batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
        return [model.generate(**batch, max_new_tokens=8, num_beams=beams).tolist() for beams in (1, 4)]


def main() -> int:
    from helpers import run_clean  # imports hf_vanilla

    release = transformers.__version__
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "folder"
        try:
            expected = save_folder(folder)
        except Exception as error:
            traceback.print_exc()
            print(
                f"error: hf_vanilla cannot save a model folder on transformers {release}: {error}",
                file=sys.stderr,
            )
            return 1
        try:  # tests/helpers.py's fresh interpreter without hf_vanilla; it fails with the process's stderr
            result = run_clean(LOAD, Path(tmp), str(folder), json.dumps(SENTENCES))
        except AssertionError as error:
            sys.stderr.write(f"{error}\n")
            last = str(error).strip().splitlines()[-1] if str(error).strip() else "no output"
            print(f"error: a model folder does not load on transformers {release}: {last}", file=sys.stderr)
            return 1
    remote = json.loads(result.stdout.strip().splitlines()[-1])
    if not remote["module"].startswith("transformers_modules.") or remote["ids"] != expected:
        print(
            f"error: a model folder loaded on transformers {release} without hf_vanilla generates other "
            f"tokens than hf_vanilla's classes ({remote['ids']} instead of {expected}).",
            file=sys.stderr,
        )
        return 1
    print(f"A model folder loads and generates without hf_vanilla on transformers {release}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
