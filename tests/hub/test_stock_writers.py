"""Every folder a *stock* call writes loads where hf_vanilla is not installed, or advertises nothing.

The writers are transformers' and accelerate's own: ``save_pretrained`` (+ the tokenizer's), ``push_to_hub``
(to a faked Hub), the stock ``Trainer`` and ``Seq2SeqTrainer`` (a checkpoint and the final model) and
accelerate's ``save_model`` (weights only: no config, so it advertises nothing). They write from a model built
from a config, loaded from a folder, and loaded with ``trust_remote_code=True``, with hf_vanilla imported and
(in a clean interpreter, remote code only) not. One clean interpreter then loads every folder with the
model, the tokenizer and the ``vanilla-translation`` pipeline its ``config.json`` advertises.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import ROOT, SENTENCES, TINY, run_clean, tiny_model
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

import hf_vanilla
from hf_vanilla.hub.folder import save_model_folder

#: Writes, for each way of getting the model named in argv[4], every stock writer's folder under
#: argv[2]/<way>/ (the faked Hub's repos under argv[2]/hub/); argv[3] == "1": with hf_vanilla imported.
WRITE = r"""
import json, shutil, sys
from pathlib import Path

from accelerate import Accelerator
from transformers import (AutoModelForSeq2SeqLM, AutoTokenizer, DataCollatorForSeq2Seq, Seq2SeqTrainer,
                          Seq2SeqTrainingArguments, Trainer, TrainingArguments)
from transformers.utils import hub

source, out, imported, ways, tiny = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "1", *map(json.loads, sys.argv[4:])
if imported:
    import hf_vanilla  # noqa: F401


class FakeApi:
    def create_repo(self, repo_id, **kwargs):
        return type("RepoUrl", (), {"repo_id": repo_id})()


class Card:
    def save(self, path):
        Path(path).write_text("# card\n")


def upload(self, working_dir, repo_id, files_timestamps, **kwargs):
    shutil.copytree(working_dir, out / "hub" / repo_id, dirs_exist_ok=True)


hub.hf_api = FakeApi
hub.create_and_tag_model_card = lambda *args, **kwargs: Card()
hub.PushToHubMixin._upload_modified_files = upload

tokenizer = AutoTokenizer.from_pretrained(source)
data = [{"input_ids": ids, "labels": ids} for ids in tokenizer(["w1 w2 w3", "w4 w5"])["input_ids"]]
for way in ways:
    loaded = AutoModelForSeq2SeqLM.from_pretrained(source, trust_remote_code=way != "folder")
    model = type(loaded)(type(loaded.config)(**tiny)) if way == "config" else loaded
    folder = out / way
    model.save_pretrained(folder / "save_pretrained")
    tokenizer.save_pretrained(folder / "save_pretrained")
    model.push_to_hub(f"me/{way}")
    tokenizer.push_to_hub(f"me/{way}")
    for trainer_class, args_class in ((Trainer, TrainingArguments), (Seq2SeqTrainer, Seq2SeqTrainingArguments)):
        args = args_class(output_dir=str(folder / trainer_class.__name__), max_steps=1, save_strategy="steps",
                          save_steps=1, per_device_train_batch_size=2, report_to="none", use_cpu=True,
                          disable_tqdm=True)
        collator = DataCollatorForSeq2Seq(tokenizer, model=model)
        trainer = trainer_class(model=model, args=args, train_dataset=data, processing_class=tokenizer,
                                data_collator=collator)
        trainer.train()
        trainer.save_model()
    Accelerator(cpu=True).save_model(model, folder / "accelerate")
"""

#: Loads every folder of argv[1] (a JSON list) with its model, tokenizer and advertised pipeline.
LOAD_ALL = r"""
import json, sys
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

folders, sentences = json.loads(sys.argv[1]), json.loads(sys.argv[2])
loaded = {}
for folder in folders:
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    ids = model.generate(**tokenizer(sentences, padding=True, return_tensors="pt"), max_new_tokens=8, num_beams=1)
    translator = pipeline("vanilla-translation", model=folder, trust_remote_code=True)
    texts = [row["translation_text"] for row in translator(sentences, max_new_tokens=8, num_beams=1)]
    loaded[folder] = {"module": type(model).__module__, "pipeline": type(translator).__name__,
                      "ids": ids.tolist(), "texts": texts}
assert not any(name == "hf_vanilla" or name.startswith("hf_vanilla.") for name in sys.modules)
print(json.dumps(loaded))
"""

WRITERS = (
    "save_pretrained",
    "Trainer",
    "Trainer/checkpoint-1",
    "Seq2SeqTrainer",
    "Seq2SeqTrainer/checkpoint-1",
)


def _write(source: Path, out: Path, tmp_path: Path, imported: bool, ways: list[str]) -> None:
    # The worktree first on sys.path: this checkout's hf_vanilla, whatever the environment's install.
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r})\n" + WRITE if imported else WRITE
    run_clean(code, tmp_path, str(source), str(out), "1" if imported else "0", json.dumps(ways), json.dumps(TINY),
              block_hf_vanilla=not imported)  # fmt: skip


@pytest.mark.slow
def test_every_stock_writers_folder_loads_without_hf_vanilla(tokenizer, tmp_path: Path) -> None:
    source = save_model_folder(tiny_model(), tokenizer, tmp_path / "source")
    out = tmp_path / "written"
    _write(source, out, tmp_path, True, ["config", "folder", "trusted"])
    _write(source, out / "clean", tmp_path, False, ["config", "trusted"])
    ways = [out / way for way in ("config", "folder", "trusted")] + [
        out / "clean" / w for w in ("config", "trusted")
    ]
    folders = [way / writer for way in ways for writer in WRITERS]
    folders += [way.parent / "hub" / "me" / way.name for way in ways]
    for way in ways:  # accelerate's save_model: weights only, nothing advertised
        assert sorted(path.name for path in (way / "accelerate").iterdir()) == ["model.safetensors"]
    result = run_clean(
        LOAD_ALL, tmp_path, json.dumps([str(folder) for folder in folders]), json.dumps(SENTENCES)
    )
    assert "Do you wish to run the custom code" not in result.stdout + result.stderr
    remote = json.loads(result.stdout.strip().splitlines()[-1])
    assert sorted(remote) == sorted(map(str, folders))
    for folder in folders:
        loaded = remote[str(folder)]
        assert loaded["module"].startswith("transformers_modules."), folder
        assert loaded["pipeline"] == "VanillaTranslationPipeline"
        # The same folder with hf_vanilla imported: its own classes, no trust_remote_code, same output.
        local = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
        assert isinstance(local, hf_vanilla.VanillaTransformerForConditionalGeneration)
        words = AutoTokenizer.from_pretrained(folder)
        with torch.no_grad():
            ids = local.generate(
                **words(SENTENCES, padding=True, return_tensors="pt"), max_new_tokens=8, num_beams=1
            )
        assert loaded["ids"] == ids.tolist(), folder
        translator = pipeline(hf_vanilla.PIPELINE_TASK, model=str(folder))
        texts = [row["translation_text"] for row in translator(SENTENCES, max_new_tokens=8, num_beams=1)]
        assert loaded["texts"] == texts, folder
