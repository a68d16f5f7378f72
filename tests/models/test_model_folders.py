"""Every model folder hf_vanilla writes is self-contained, and every card's Python runs.

The folders (the Trainer's output, an averaged model, a converted model, the publish folder; the demo's
in test_demo.py) must load with ``AutoModelForSeq2SeqLM`` / ``AutoTokenizer`` /
``pipeline("vanilla-translation")`` and ``trust_remote_code=True`` in a fresh process where hf_vanilla
cannot be imported: no prompt, no warning, no pickle, and the same translations as the local model.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import SENTENCES, assert_self_contained, marian, run_card, save_with_side_files, tiny_model
from huggingface_hub import ModelCard
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard import _fsdp_init
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    modeling_utils,
    pipeline,
)

import hf_vanilla
from hf_vanilla.hub.card import render_model_card
from hf_vanilla.hub.folder import finish_model_folder, save_for_hub, save_model_folder
from hf_vanilla.hub.options import MULTI30K
from hf_vanilla.inference.options import DecodingOptions
from hf_vanilla.interop.convert import convert
from hf_vanilla.training.arguments import PaperTrainingArguments
from hf_vanilla.training.averaging import average_checkpoints
from hf_vanilla.training.trainer import PaperSeq2SeqTrainer


def _trainer(model, tokenizer, output_dir: Path) -> PaperSeq2SeqTrainer:
    args = PaperTrainingArguments(
        output_dir=str(output_dir), report_to="none", save_strategy="no", eval_strategy="no", max_steps=1
    )
    return PaperSeq2SeqTrainer(
        model=model,
        args=args,
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
    )


@pytest.mark.slow  # two clean-interpreter loads
def test_trainer_output_and_averaged_model_are_self_contained(tmp_path: Path, tokenizer) -> None:
    for seed in (0, 1):
        _trainer(tiny_model(seed), tokenizer, tmp_path / f"run-{seed}").save_model()
    saved = tmp_path / "run-1"
    assert not (saved / "training_args.bin").exists()
    assert json.loads((saved / "training_args.json").read_text())["output_dir"] == str(saved)
    assert (
        AutoTokenizer.from_pretrained(saved).model_max_length == tiny_model().config.max_position_embeddings
    )
    remote = assert_self_contained(saved, tmp_path)
    assert remote["max_length"] == 64
    averaged = average_checkpoints([tmp_path / "run-0", saved], tmp_path / "averaged")
    assert_self_contained(averaged, tmp_path)


def shard_class_as_fsdp2_does(model: torch.nn.Module) -> None:
    """Give ``model`` the class ``torch.distributed.fsdp.fully_shard`` gives every module it shards, without
    a process group: ``FSDP<Name>``, a subclass of ``FSDPModule`` and the model's class, created in
    torch's ``_fsdp_init`` (its ``_apply_to_module``), so that the class's module is torch's file."""
    cls = type(model)
    model.__class__ = type(f"FSDP{cls.__name__}", (FSDPModule, cls), {"__module__": _fsdp_init.__name__})


#: The last commit before the generation policy left the modeling file: the code a released folder holds.
RELEASED = "d9a04bb41689411f9b89925b224a41476a8af837"

RELEASED_CODE = (
    "configuration_vanilla_transformer.py",
    "fast_paths.py",
    "modeling_vanilla_transformer.py",
    "pipeline_vanilla_transformer.py",
)


@pytest.mark.slow  # a clean-interpreter load
def test_a_folder_written_by_the_released_code_loads_unchanged(tokenizer, tmp_path: Path) -> None:
    """Hub folders keep their file names and auto_map strings: a folder holding the released code
    files (no generation file) loads with trust_remote_code (its own code, in a clean process) and
    without it (this code), and both generate the same tokens (``assert_self_contained``)."""
    try:
        released = {
            name: subprocess.run(
                ["git", "show", f"{RELEASED}:hf_vanilla/{name}"],
                cwd=Path(__file__).parent,
                capture_output=True,
                check=True,
                text=True,
            ).stdout
            for name in RELEASED_CODE
        }
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"needs the git history (commit {RELEASED[:7]})")
    folder = save_model_folder(tiny_model(), tokenizer, tmp_path / "released")
    (folder / "generation_vanilla_transformer.py").unlink()
    (folder / "saving_vanilla_transformer.py").unlink()
    (folder / "vocabulary_vanilla_transformer.py").unlink()
    for name, text in released.items():
        (folder / name).write_text(text)
    assert sorted(path.name for path in folder.glob("*.py")) == sorted(RELEASED_CODE)
    config = json.loads((folder / "config.json").read_text())
    assert config["auto_map"] == {
        "AutoConfig": "configuration_vanilla_transformer.VanillaTransformerConfig",
        "AutoModel": "modeling_vanilla_transformer.VanillaTransformerModel",
        "AutoModelForSeq2SeqLM": "modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration",
    }
    assert "def _source_lengths" in released["modeling_vanilla_transformer.py"]  # the policy inside
    assert_self_contained(folder, tmp_path)


@pytest.mark.parametrize(
    "writer", ["save_model_folder", pytest.param("trainer", marks=pytest.mark.slow)]
)  # one clean-interpreter load each: the second in the slow tier
def test_folder_of_an_fsdp2_sharded_model_names_and_holds_the_hf_vanilla_code(
    tmp_path: Path, tokenizer, writer: str
) -> None:
    """Under FSDP2 the model's class is torch's ``FSDPVanillaTransformerForConditionalGeneration``: the
    folder must still name and hold hf_vanilla's classes, not torch's ``_fsdp_*.py`` files."""
    model, folder = tiny_model(), tmp_path / "out"
    if writer == "trainer":
        trainer = _trainer(model, tokenizer, folder)  # before the swap: FSDPModule.to() needs FSDP's state
        shard_class_as_fsdp2_does(model)
        trainer.save_model()
    else:
        shard_class_as_fsdp2_does(model)
        save_model_folder(model, tokenizer, folder)
    config = json.loads((folder / "config.json").read_text())
    assert config["auto_map"] == {
        "AutoConfig": "configuration_vanilla_transformer.VanillaTransformerConfig",
        "AutoModel": "modeling_vanilla_transformer.VanillaTransformerModel",
        "AutoModelForSeq2SeqLM": "modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration",
    }
    assert config["architectures"] == ["VanillaTransformerForConditionalGeneration"]
    assert sorted(path.name for path in folder.glob("*.py")) == [
        "configuration_vanilla_transformer.py",
        "generation_vanilla_transformer.py",
        "modeling_vanilla_transformer.py",
        "pipeline_vanilla_transformer.py",
        "saving_vanilla_transformer.py",
        "vocabulary_vanilla_transformer.py",
    ]
    assert type(model)._auto_class is None and getattr(model.config, "auto_map", None) is None
    assert_self_contained(folder, tmp_path)


def test_save_pretrained_with_push_to_hub_uploads_the_code_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers uploads the files written or changed after it looked at the folder: the code files
    must be among them, or the pushed repo's auto_map names files the repo does not hold."""
    uploaded: list[str] = []

    class Hub:
        def create_repo(self, repo_id: str, **kwargs: object) -> SimpleNamespace:
            return SimpleNamespace(repo_id=repo_id)

    def upload_modified_files(self, working_dir, repo_id, files_timestamps, **kwargs) -> None:
        for path in Path(working_dir).iterdir():
            if path.name not in files_timestamps or path.stat().st_mtime > files_timestamps[path.name]:
                uploaded.append(path.name)

    monkeypatch.setattr(modeling_utils, "hf_api", Hub)
    monkeypatch.setattr(modeling_utils.PreTrainedModel, "_upload_modified_files", upload_modified_files)
    model = tiny_model()
    model.register_for_auto_class("AutoModelForSeq2SeqLM")
    try:
        model.save_pretrained(tmp_path / "out", push_to_hub=True, repo_id="someone/x")
    finally:
        type(model)._auto_class = None
    assert {
        "config.json",
        "model.safetensors",
        "modeling_vanilla_transformer.py",
        "saving_vanilla_transformer.py",
    } <= set(uploaded)
    assert "configuration_vanilla_transformer.py" in uploaded


def test_a_users_subclass_is_saved_as_transformers_saves_any_class(tmp_path: Path) -> None:
    """Only FSDP2's generated class is looked through: a user's registered subclass keeps its own name
    in auto_map (transformers' behaviour), never silently the hf_vanilla class it extends."""
    (tmp_path / "my_model.py").write_text(
        "from hf_vanilla import VanillaTransformerForConditionalGeneration\n\n\n"
        "class MyModel(VanillaTransformerForConditionalGeneration):\n    pass\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        from my_model import MyModel

        model = MyModel(tiny_model().config)
        MyModel.register_for_auto_class("AutoModelForSeq2SeqLM")
        model.save_pretrained(tmp_path / "out")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("my_model", None)
    auto_map = json.loads((tmp_path / "out" / "config.json").read_text())["auto_map"]
    assert auto_map["AutoModelForSeq2SeqLM"] == "my_model.MyModel"
    assert (tmp_path / "out" / "my_model.py").is_file()


@pytest.mark.slow  # clean-interpreter loads and card runs
def test_converted_model_is_self_contained_and_its_card_runs(tmp_path: Path, tokenizer) -> None:
    save_with_side_files(marian(), tmp_path / "marian", tokenizer)
    (tmp_path / "marian" / "README.md").write_text(
        "---\nlicense: cc-by-4.0\nlanguage:\n- de\n- en\n---\n# OPUS\n"
    )
    out = tmp_path / "converted"
    convert(str(tmp_path / "marian"), out)
    assert_self_contained(out, tmp_path)
    data = ModelCard.load(out / "README.md").data
    assert (data.license, data.language, data.pipeline_tag) == ("cc-by-4.0", ["de", "en"], "translation")
    assert data.base_model is None  # a local folder is no Hub id
    run_card(out, tmp_path)


@pytest.mark.slow  # clean-interpreter loads and card runs
def test_publish_folder_is_self_contained_and_its_card_runs(model, tokenizer, tmp_path: Path) -> None:
    folder = tmp_path / "hub"
    result = {
        "split": "test",
        "bleu": 1.0,
        "chrf": 2.0,
        "bleu_signature": "nrefs:1|case:mixed|eff:no|tok:intl|smooth:exp|version:2.6.0",
        "chrf_signature": "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0",
        "num_segments": 3,
    }
    card = render_model_card(
        model.config,
        [result],
        DecodingOptions().to_dict(),
        "en",
        "de",
        dataset=MULTI30K,
        repo_id=str(folder),
        example_source="w1 w2",
    )
    save_for_hub(model, tokenizer, folder, card)
    assert_self_contained(folder, tmp_path)
    text = (folder / "README.md").read_text()
    assert "tok:intl" in text  # the card names the BLEU variant the scores used
    # The metadata parses back with huggingface_hub (model-index included) and says what was given.
    data = ModelCard.load(folder / "README.md", ignore_metadata_errors=False).data
    assert (data.license, data.datasets, data.language) == ("other", ["multi30k"], ["en", "de"])
    assert {r.metric_type: r.metric_config for r in data.eval_results}["bleu"] == result["bleu_signature"]
    run_card(folder, tmp_path)


def test_pipeline_is_registered_and_takes_per_call_settings(model, tokenizer) -> None:
    translator = pipeline(hf_vanilla.PIPELINE_TASK, model=model, tokenizer=tokenizer)
    assert isinstance(translator, hf_vanilla.VanillaTranslationPipeline)
    single = translator("w1 w2 w3", num_beams=1, max_new_tokens=3)
    with torch.no_grad():
        ids = model.generate(**tokenizer(["w1 w2 w3"], return_tensors="pt"), num_beams=1, max_new_tokens=3)
    assert single == {"translation_text": tokenizer.decode(ids[0], skip_special_tokens=True)}
    assert len(translator(SENTENCES, batch_size=2, max_new_tokens=3)) == len(SENTENCES)
    with pytest.raises(ValueError, match="translates strings; got int"):
        translator([1, 2])
    with pytest.raises(ValueError, match="one translation per input"):
        translator("w1", num_return_sequences=2)


def test_pipeline_refuses_an_input_longer_than_the_model_takes_unless_truncating(model, tokenizer) -> None:
    """As ``hf-vanilla-translate``: an input of more tokens than ``max_position_embeddings`` is refused in
    one line (the model would compute positions for it and translate it badly); ``truncation=True`` cuts it
    to the limit, which gives what the first ``limit`` tokens give."""
    translator = pipeline(hf_vanilla.PIPELINE_TASK, model=model, tokenizer=tokenizer)
    limit = model.config.max_position_embeddings
    settings = {"num_beams": 1, "max_new_tokens": 3}
    longest = " ".join(["w1", "w2"] * limit)
    assert len(tokenizer(longest).input_ids) > limit
    with pytest.raises(
        ValueError, match=rf"^An input of \d+ tokens is longer than the model's longest input of {limit} "
    ):
        translator(longest, **settings)
    with pytest.raises(ValueError, match="longest input"):
        translator(["w1", longest], batch_size=2, **settings)
    cut = tokenizer(longest, truncation=True, max_length=limit).input_ids
    assert len(cut) == limit
    with torch.no_grad():
        ids = model.generate(input_ids=torch.tensor([cut]), **settings)
    expected = {"translation_text": tokenizer.decode(ids[0], skip_special_tokens=True)}
    assert translator(longest, truncation=True, **settings) == expected
    fits = " ".join(["w1"] * (limit - 1))  # with </s>: exactly the limit
    assert (
        len(tokenizer(fits).input_ids) == limit
        and translator(fits, **settings)["translation_text"] is not None
    )


def test_plain_save_pretrained_writes_a_self_contained_folder(tokenizer, tmp_path: Path) -> None:
    """``save_pretrained`` as users (and the stock Trainer, ``push_to_hub``) call it, of a model built from a
    config or loaded from a folder (whose config carries the loaded ``auto_map`` and ``custom_pipelines``):
    the folder holds every code file its ``config.json`` names, the pipeline's included, and the model is
    left as it was. (The clean-interpreter load of such folders: tests/hub/test_stock_writers.py.)"""
    source = save_model_folder(tiny_model(), tokenizer, tmp_path / "source")
    for name, model in (
        ("built", tiny_model()),
        ("loaded", AutoModelForSeq2SeqLM.from_pretrained(source)),
        ("loaded-trusted", AutoModelForSeq2SeqLM.from_pretrained(source, trust_remote_code=True)),
    ):
        before = [getattr(model.config, key, None) for key in ("auto_map", "custom_pipelines")]
        model.save_pretrained(tmp_path / name)
        finish_model_folder(tmp_path / name)  # auto_map and custom_pipelines with their code files
        assert {p.name for p in (tmp_path / name).glob("*.py")} == {p.name for p in source.glob("*.py")}
        assert type(model)._auto_class is None
        assert [getattr(model.config, key, None) for key in ("auto_map", "custom_pipelines")] == before


def test_pipeline_from_a_folder_needs_no_trust_remote_code_as_auto_model(tokenizer, tmp_path: Path) -> None:
    """With hf_vanilla imported the registered pipeline serves a folder that advertises its own (as the
    registered model class does for ``AutoModelForSeq2SeqLM``); an empty list gives an empty list; bad
    input is one ValueError line."""
    folder = save_model_folder(tiny_model(), tokenizer, tmp_path / "out")
    assert hf_vanilla.PIPELINE_TASK in json.loads((folder / "config.json").read_text())["custom_pipelines"]
    translator = pipeline(hf_vanilla.PIPELINE_TASK, model=str(folder))
    assert type(translator) is hf_vanilla.VanillaTranslationPipeline
    assert translator([]) == [] and translator(()) == []
    assert translator(("w1", "w2"), max_new_tokens=3) == translator(["w1", "w2"], max_new_tokens=3)
    for bad in (None, [None], ["w1", 3]):
        with pytest.raises(ValueError, match="translates strings") as error:
            translator(bad)
        assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="one translation per input"):
        translator([], num_return_sequences=2)
