"""A model folder holds the paper and the transformers contract only; the installed package adds its speed
work from outside, and neither changes a token: greedy and beam-4 outputs of a folder written before the
speed work left the folder (tests/fixtures/folder_before_speed_split) and of one written now are the same
with hf_vanilla, with transformers' own search, and where hf_vanilla is not installed. The fixture's weights
are not committed: its made_by.py makes them again, and their checksum must be the one the old code wrote."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers import ROOT, run_clean
from transformers import GenerationMixin

from hf_vanilla import VanillaTransformerForConditionalGeneration
from hf_vanilla.models.vanilla_transformer import modeling_vanilla_transformer as modeling

FOLDER_CODE = ROOT / "hf_vanilla" / "models" / "vanilla_transformer"
FIXTURE = ROOT / "tests" / "fixtures" / "folder_before_speed_split"
#: The most lines the files a folder carries may hold together (HF's Marian: 1,198 in two files).
MAX_FOLDER_LINES = 1600


def _expected() -> dict:
    return json.loads((FIXTURE / "expected.json").read_text())


@pytest.fixture(scope="module")
def folder_before(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the fixture folder with its weights made again by its made_by.py."""
    folder = tmp_path_factory.mktemp("before") / "folder"
    shutil.copytree(FIXTURE, folder)
    spec = importlib.util.spec_from_file_location("made_by", FIXTURE / "made_by.py")
    made_by = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(made_by)
    sha256 = made_by.weights_sha256(made_by.write_weights(folder))
    assert sha256 == _expected()["weights_sha256"], (
        "made_by.py no longer makes the weights the old code wrote (did the model's initialisation change?); "
        "the tokens in expected.json belong to those weights only"
    )
    return folder


def _outputs(model: VanillaTransformerForConditionalGeneration, case: dict) -> dict[str, list]:
    batch = {key: torch.tensor(case[key]) for key in ("input_ids", "attention_mask")}
    with torch.inference_mode():
        greedy = model.generate(**batch, num_beams=1)
        beam = model.generate(**batch, num_return_sequences=4)  # the folder's §6.1 defaults: beam 4
    return {"greedy": greedy.tolist(), "beam": beam.tolist()}


def test_the_folder_files_hold_at_most_1600_lines() -> None:
    lines = sum(len(path.read_text().splitlines()) for path in FOLDER_CODE.glob("*.py"))
    assert lines <= MAX_FOLDER_LINES, f"the model-folder files hold {lines} lines"


def test_the_folder_classes_override_no_private_generation_method() -> None:
    """Decoding in a folder is transformers' own: none of its classes replaces a GenerationMixin method
    whose name starts with an underscore (hf_vanilla's installed class does, docs/internals.md)."""
    overridden = {
        f"{cls.__name__}.{name}"
        for cls in modeling.VanillaTransformerForConditionalGeneration.__mro__
        if cls.__module__.startswith(modeling.__package__)
        for name in vars(cls)
        if name.startswith("_") and not name.startswith("__") and hasattr(GenerationMixin, name)
    }
    assert overridden == set()


@pytest.mark.parametrize("drop", [True, False], ids=["hf_vanilla-search", "transformers-search"])
def test_a_folder_written_before_gives_the_same_tokens_with_hf_vanilla(
    drop: bool, folder_before: Path
) -> None:
    model = VanillaTransformerForConditionalGeneration.from_pretrained(folder_before).eval()
    model.drop_finished_sentences = drop  # False: transformers' own beam and greedy loops
    expected = _expected()
    assert _outputs(model, expected) == {"greedy": expected["greedy"], "beam": expected["beam"]}


LOAD = r"""
import json, sys
import torch
from transformers import AutoModelForSeq2SeqLM, GenerationMixin
folder, case = sys.argv[1], json.loads(sys.argv[2])
model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
batch = {key: torch.tensor(case[key]) for key in ("input_ids", "attention_mask")}
with torch.inference_mode():
    greedy = model.generate(**batch, num_beams=1).tolist()
    beam = model.generate(**batch, num_return_sequences=4).tolist()
assert not any(name == "hf_vanilla" or name.startswith("hf_vanilla.") for name in sys.modules)
stock = all(getattr(type(model), name) is getattr(GenerationMixin, name)
            for name in ("_beam_search", "_sample", "_expand_inputs_for_generation"))
print(json.dumps({"module": type(model).__module__, "stock": stock, "greedy": greedy, "beam": beam}))
"""


@pytest.mark.parametrize("written", ["before", "now"])
def test_a_folder_gives_the_same_tokens_where_hf_vanilla_is_not_installed(
    written: str, folder_before: Path, tmp_path: Path
) -> None:
    """The fixture's weights with today's folder code, and a folder saved now, load without hf_vanilla,
    run transformers' own search and give the recorded tokens."""
    folder = tmp_path / "folder"
    if written == "before":
        shutil.copytree(folder_before, folder)
        for code in FOLDER_CODE.glob("*_vanilla_transformer.py"):
            shutil.copy(code, folder)
    else:
        VanillaTransformerForConditionalGeneration.from_pretrained(folder_before).save_pretrained(folder)
    expected = _expected()
    result = run_clean(LOAD, tmp_path, str(folder), json.dumps(expected))
    remote = json.loads(result.stdout.strip().splitlines()[-1])
    assert remote["module"].startswith("transformers_modules.") and remote["stock"]
    assert (remote["greedy"], remote["beam"]) == (expected["greedy"], expected["beam"])
