"""The Hub folder (weights, remote code with auto_map, tokenizer, generation config, model card) and the push."""

from __future__ import annotations

import json
import runpy
import sys
from dataclasses import dataclass, field
from pathlib import Path

import huggingface_hub
import pytest
import torch
import transformers
from helpers import assert_self_contained, run_clean
from huggingface_hub import ModelCard
from huggingface_hub.errors import OfflineModeIsEnabled
from torch.distributed.fsdp._fully_shard import _fsdp_init

from hf_vanilla.analysis.evaluation import write_results
from hf_vanilla.hub.card import card_data_recorded_in, dataset_card_from_args, load_results, render_model_card
from hf_vanilla.hub.folder import finish_model_folder, save_for_hub, save_model_folder
from hf_vanilla.hub.options import MULTI30K, PublishArguments
from hf_vanilla.hub.push import HubPushError, publish, push_to_hub
from hf_vanilla.hub.record import read_training_record, write_training_record
from hf_vanilla.inference.options import DecodingOptions
from hf_vanilla.io.checksums import weights_fingerprint
from hf_vanilla.io.pickles import PICKLE_SUFFIXES
from hf_vanilla.models.vanilla_transformer.configuration_vanilla_transformer import TRANSFORMERS_REQUIREMENT

REPO = Path(__file__).resolve().parents[2]

RESULT = {
    "split": "validation",
    "bleu": 35.4321,
    "chrf": 61.2345,
    "bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
    "chrf_signature": "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0",
    "num_segments": 1014,
    "source_lang": "en",
    "target_lang": "de",
}


def card_for(model, decoding: DecodingOptions | None = None) -> ModelCard:
    return render_model_card(
        model.config,
        [RESULT],
        (decoding or DecodingOptions()).to_dict(),
        "en",
        "de",
        dataset=MULTI30K,
        repo_id="someone/tiny-transformer",
        num_parameters=model.num_parameters(),
    )


# --- model card ----------------------------------------------------------------------------------------


def test_card_metadata_has_languages_license_and_scores(model) -> None:
    card = ModelCard(str(card_for(model)))  # parse the rendered text back, as the Hub does
    data = card.data.to_dict()
    assert data["language"] == ["en", "de"]
    assert data["license"] == "other" and data["license_name"] == "multi30k-non-commercial-research"
    assert "translation" in data["tags"] and data["datasets"] == ["multi30k"]
    assert data["metrics"] == ["bleu", "chrf"] and data["pipeline_tag"] == "translation"
    results = data["model-index"][0]["results"]
    metrics = {metric["type"]: metric for metric in results[0]["metrics"]}
    assert metrics["bleu"]["value"] == 35.43 and metrics["chrf"]["value"] == 61.23
    assert metrics["bleu"]["config"] == RESULT["bleu_signature"]
    assert results[0]["dataset"]["split"] == "validation"
    text = card.text
    assert "non-commercial research and education use only" in text
    assert "HF length penalty |Y|^0.6 inside beam search" in text and "input length + 50" in text
    assert RESULT["chrf_signature"] in text and "someone/tiny-transformer" in text
    assert "{{" not in text and "{%" not in text  # every template variable was filled


def test_card_says_when_gnmt_rescoring_was_used(model) -> None:
    text = card_for(model, DecodingOptions(length_penalty_type="gnmt")).text
    assert "GNMT length penalty ((5+|Y|)/6)^0.6 applied by rescoring" in text
    assert "not inside the search" in text


def test_card_tells_to_pin_a_revision_and_names_the_transformers_releases(model) -> None:
    """Remote code runs what the repository holds at download: the card says how to pin the reviewed files,
    which releases the code runs on, and which release wrote the card."""
    text = " ".join(card_for(model).text.split())
    assert 'from_pretrained("someone/tiny-transformer", trust_remote_code=True, revision="<commit>")' in text
    assert f"The code runs on transformers `{TRANSFORMERS_REQUIREMENT}`" in text
    assert f"This card was written with transformers {transformers.__version__}." in text


def test_card_needs_measured_scores(model) -> None:
    with pytest.raises(ValueError, match="lacks"):
        render_model_card(model.config, [{"split": "validation", "bleu": 1.0}], {}, "en", "de", MULTI30K)


# --- the folder ------------------------------------------------------------------------------------------


#: What a Hub folder holds, whichever command wrote it (hf-vanilla-publish, hf-vanilla-train --push_to_hub).
HUB_FOLDER_FILES = {
    "model.safetensors",
    "config.json",
    "generation_config.json",
    "modeling_vanilla_transformer.py",
    "configuration_vanilla_transformer.py",
    "generation_vanilla_transformer.py",
    "saving_vanilla_transformer.py",
    "vocabulary_vanilla_transformer.py",
    "pipeline_vanilla_transformer.py",
    "tokenizer.json",
    "tokenizer_config.json",
    "README.md",
    "hub_metadata.json",
}


def test_folder_has_everything_and_leaves_the_model_alone(model, tokenizer, tmp_path: Path) -> None:
    folder = save_for_hub(model, tokenizer, tmp_path / "hub", card_for(model), metadata={"results": [RESULT]})
    assert {p.name for p in folder.iterdir()} >= HUB_FOLDER_FILES
    config = json.loads((folder / "config.json").read_text())
    assert config["auto_map"] == {
        "AutoConfig": "configuration_vanilla_transformer.VanillaTransformerConfig",
        "AutoModel": "modeling_vanilla_transformer.VanillaTransformerModel",
        "AutoModelForSeq2SeqLM": "modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration",
    }
    generation = json.loads((folder / "generation_config.json").read_text())
    assert (generation["num_beams"], generation["length_penalty"]) == (4, 0.6)
    # the model is left as it was; a later plain save (e.g. a stock Trainer checkpoint) is the same folder
    assert type(model)._auto_class is None and getattr(model.config, "auto_map", None) is None
    model.save_pretrained(tmp_path / "plain")
    assert {p.name for p in (tmp_path / "plain").glob("*.py")} == {p.name for p in folder.glob("*.py")}
    assert json.loads((tmp_path / "plain" / "config.json").read_text())["auto_map"] == config["auto_map"]


def _break_folder(folder: Path, breakage: str) -> None:
    """Turn a good model folder into one that would not load where hf_vanilla is not installed."""
    config = json.loads((folder / "config.json").read_text())
    if breakage == "fsdp2":  # what FSDP2 runs wrote: torch's class and file instead of hf_vanilla's
        (folder / "_fsdp_init.py").write_text(Path(_fsdp_init.__file__).read_text())
        config["auto_map"]["AutoModelForSeq2SeqLM"] = (
            "_fsdp_init.FSDPVanillaTransformerForConditionalGeneration"
        )
    elif breakage == "relative import":
        (folder / "saving_vanilla_transformer.py").unlink()
    elif breakage == "class not in the file":
        (folder / "modeling_vanilla_transformer.py").write_text("class VanillaTransformerModel:\n    pass\n")
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (
            "fsdp2",
            r"maps Auto classes to code that is not hf_vanilla's \(AutoModelForSeq2SeqLM -> '_fsdp_init\.",
        ),
        ("relative import", r"is incomplete, missing: \['saving_vanilla_transformer\.py'\]"),
        (
            "class not in the file",
            r"does not define .*VanillaTransformerForConditionalGeneration in modeling_",
        ),
    ],
)
def test_folder_check_refuses_code_that_is_not_hf_vanillas(
    model, tokenizer, tmp_path: Path, breakage: str, message: str
) -> None:
    """Every ``auto_map`` entry must name hf_vanilla's class, defined in a code file of the folder whose
    relative imports are there too: one line naming what is wrong."""
    folder = save_model_folder(model, tokenizer, tmp_path / "out")
    _break_folder(folder, breakage)
    with pytest.raises(RuntimeError, match=message) as error:
        finish_model_folder(folder)
    assert "\n" not in str(error.value)


LOAD_WITHOUT_HF_VANILLA = r"""
import json, sys

try:
    import hf_vanilla  # noqa: F401
    raise SystemExit("hf_vanilla should not be importable here")
except ModuleNotFoundError:
    pass
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

folder = sys.argv[1]
model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
batch = tokenizer(json.loads(sys.argv[2]), padding=True, return_tensors="pt")
generated = model.generate(**batch, max_new_tokens=8)  # beam 4 and α 0.6 from generation_config.json
assert "hf_vanilla" not in sys.modules
print(json.dumps({"module": type(model).__module__, "ids": generated.tolist()}))
"""


@pytest.mark.slow  # a clean-interpreter load
def test_published_folder_loads_and_generates_without_hf_vanilla(model, tokenizer, tmp_path: Path) -> None:
    folder = save_for_hub(model, tokenizer, tmp_path / "hub", card_for(model))
    sentences = ["w1 w2 w3", "w4"]
    result = run_clean(LOAD_WITHOUT_HF_VANILLA, tmp_path, str(folder), json.dumps(sentences))
    remote = json.loads(result.stdout.strip().splitlines()[-1])
    assert remote["module"].startswith("transformers_modules.")
    with torch.no_grad():
        local = model.generate(**tokenizer(sentences, padding=True, return_tensors="pt"), max_new_tokens=8)
    assert remote["ids"] == local.tolist()


# --- pushing ---------------------------------------------------------------------------------------------


@pytest.fixture
def hub_folder(model, tokenizer, tmp_path: Path) -> Path:
    return save_for_hub(model, tokenizer, tmp_path / "hub", card_for(model))


def _must_not_be_called(self, **kwargs):
    raise AssertionError("no Hub call may happen in offline mode")


def test_push_offline_keeps_the_folder(hub_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", _must_not_be_called)
    with pytest.raises(HubPushError) as error:
        push_to_hub(hub_folder, "someone/tiny-transformer")
    message = str(error.value)
    assert "offline" in message and f"{hub_folder} is kept" in message
    assert (
        f"--push_only --output_dir {hub_folder} --push_to_hub --hub_model_id someone/tiny-transformer"
        in message
    )
    assert (hub_folder / "model.safetensors").is_file()


@pytest.mark.parametrize(
    "error",
    [OfflineModeIsEnabled("offline"), ConnectionError("Name or service not known"), TimeoutError("slow")],
)
def test_push_network_failure_is_a_clear_error(
    hub_folder: Path, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    def create_repo(self, **kwargs):
        raise error

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    with pytest.raises(HubPushError, match="is kept") as info:
        push_to_hub(hub_folder, "someone/tiny-transformer")
    assert info.value.__cause__ is error
    assert hub_folder.is_dir()


# --- the publish command -----------------------------------------------------------------------------------


def write_result_file(
    tmp_path: Path, decoding: DecodingOptions | None = None, model_dir: Path | None = None
) -> Path:
    """Results as hf-vanilla-evaluate writes them; with ``model_dir``, of that model (name and fingerprint)."""
    result = {**RESULT, "decoding": (decoding or DecodingOptions()).to_dict(), "hypotheses": ["x"]}
    if model_dir is not None:
        result.update(model=str(model_dir), model_sha256=weights_fingerprint(model_dir))
    return write_results(result, tmp_path / "eval" / "validation.results.json")


def test_publish_sets_generation_config_to_the_scored_decoding(model, tokenizer, tmp_path: Path) -> None:
    decoding = DecodingOptions(num_beams=5, length_penalty=1.0, early_stopping="true")
    results = write_result_file(tmp_path, decoding)
    args = PublishArguments(
        output_dir=str(tmp_path / "hub"), results_files=[str(results)], dataset="multi30k"
    )
    folder = publish(model, tokenizer, args)
    generation = json.loads((folder / "generation_config.json").read_text())
    assert (generation["num_beams"], generation["length_penalty"], generation["early_stopping"]) == (
        5,
        1.0,
        True,
    )
    assert "beam 5, HF length penalty |Y|^1.0" in (folder / "README.md").read_text()


def test_publish_script_offline_push_fails_clearly_and_keeps_folder(
    model, tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    results = write_result_file(tmp_path, model_dir=tmp_path / "model")
    folder = tmp_path / "hub"
    argv = ["publish.py", "--model_name_or_path", str(tmp_path / "model"), "--output_dir", str(folder)]
    argv += [
        "--results_files",
        str(results),
        "--push_to_hub",
        "--hub_model_id",
        "someone/tiny",
        "--dataset",
        "multi30k",
        "--private",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(REPO / "scripts" / "publish.py"), run_name="__main__")
    assert exit_info.value.code == 1
    [error] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert "offline mode is on" in error and f"The local folder {folder} is kept" in error
    assert f"hf-vanilla-publish --push_only --output_dir {folder} --push_to_hub" in error  # one line
    assert error.count("--private") == 2  # the retry commands keep the repo private
    assert (folder / "README.md").is_file() and (folder / "model.safetensors").is_file()


def test_publish_argument_errors(model, tokenizer, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs --hub_model_id"):
        publish(model, tokenizer, PublishArguments(output_dir=str(tmp_path), push_to_hub=True))
    with pytest.raises(ValueError, match="hf-vanilla-evaluate"):
        publish(model, tokenizer, PublishArguments(output_dir=str(tmp_path / "hub")))
    with pytest.raises(ValueError, match="--dataset is required"):
        dataset_card_from_args(PublishArguments(output_dir="x"))
    with pytest.raises(ValueError, match="--data_terms"):
        dataset_card_from_args(PublishArguments(output_dir="x", dataset="custom", dataset_id="wmt14"))
    first = write_result_file(tmp_path / "a")
    second = write_result_file(tmp_path / "b", DecodingOptions(length_penalty_type="gnmt"))
    with pytest.raises(ValueError, match="disagree on 'decoding'"):
        load_results([first, second])


# --- the training push: hf-vanilla-train --push_to_hub -------------------------------------------------------

CARD_ARGS = ["--dataset", "custom", "--dataset_id", "someone/pairs", "--data_terms", "CC BY 4.0, attribution"]
CARD_ARGS += ["--weights_license", "cc-by-4.0"]


def train_push_argv(tmp_path: Path, tokenizer, *extra: str) -> list[str]:
    """A 2-step run of the tiny model that pushes to someone/x, with a validation split to score."""
    if not (tmp_path / "tokenizer").is_dir():
        tokenizer.save_pretrained(tmp_path / "tokenizer")
        pairs = "".join(f"w{i} w{i + 1} w{i + 2}\tw{i + 2} w{i + 1} w{i}\n" for i in range(16))
        (tmp_path / "data.tsv").write_text(pairs, encoding="utf-8")
    data = str(tmp_path / "data.tsv")
    return [
        "--train_files", data, "--validation_files", data, "--source_lang", "en", "--target_lang", "de",
        "--tokenizer_name_or_path", str(tmp_path / "tokenizer"),
        "--d_model", "32", "--layers", "2", "--attention_heads", "4", "--ffn_dim", "64",
        "--max_steps", "2", "--save_steps", "1", "--warmup_steps", "1", "--learning_rate", "1e-3",
        "--per_device_train_batch_size", "4", "--eval_strategy", "no", "--do_eval", "false",
        "--report_to", "none", "--use_cpu", "--disable_tqdm", "true", "--dataloader_num_workers", "0",
        "--output_dir", str(tmp_path / "run"), "--push_to_hub", "--hub_model_id", "someone/x", *extra,
    ]  # fmt: skip


def train_main(argv: list[str]) -> int:
    return runpy.run_path(str(REPO / "scripts" / "train.py"))["main"](argv)


@pytest.fixture
def no_trainer_push(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Trainer's own push (which creates the repo when the Trainer is built) must never run."""

    def trainer_push(self, *args, **kwargs):
        raise AssertionError("the Trainer's own push ran")

    for name in ("init_hf_repo", "push_to_hub", "_push_from_checkpoint"):
        monkeypatch.setattr(transformers.Trainer, name, trainer_push)


@dataclass
class FakeHub:
    """What the faked Hub was asked: each ``create_repo``'s arguments, and each upload's repo, folder and
    the files the folder held at that moment."""

    repos: list[dict] = field(default_factory=list)
    branches: list[dict] = field(default_factory=list)
    uploads: list[dict] = field(default_factory=list)


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> FakeHub:
    fake = FakeHub()

    def create_repo(self, **kwargs):
        fake.repos.append(kwargs)
        name = kwargs["repo_id"]
        return huggingface_hub.RepoUrl(f"https://huggingface.co/{name if '/' in name else 'me/' + name}")

    def create_branch(self, **kwargs):
        fake.branches.append(kwargs)

    def upload_folder(self, **kwargs):
        folder = Path(kwargs["folder_path"])
        files = {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file()}
        fake.uploads.append(
            {
                "repo_id": kwargs["repo_id"],
                "folder": folder,
                "files": files,
                "revision": kwargs.get("revision"),
            }
        )
        return huggingface_hub.CommitInfo(
            commit_url=f"https://huggingface.co/{kwargs['repo_id']}/commit/abc",
            commit_message="m",
            commit_description="",
            oid="abc",
        )

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "create_branch", create_branch)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    return fake


def test_push_calls_create_repo_and_upload_folder(hub_folder: Path, hub: FakeHub) -> None:
    url = push_to_hub(hub_folder, "someone/tiny-transformer", private=True)
    assert url == "https://huggingface.co/someone/tiny-transformer/commit/abc"
    assert hub.repos == [
        {"repo_id": "someone/tiny-transformer", "repo_type": "model", "private": True, "exist_ok": True}
    ]
    [upload] = hub.uploads
    assert upload["folder"] == hub_folder and upload["repo_id"] == "someone/tiny-transformer"
    assert upload["revision"] is None and hub.branches == []


def test_push_keeps_the_owners_default_visibility_and_resolves_a_bare_name(
    hub_folder: Path, hub: FakeHub
) -> None:
    """No ``private``: ``create_repo`` gets None (the owner's default, e.g. an organisation's private
    repos), never False; a name without an owner is created under the logged-in user and uploaded there."""
    push_to_hub(hub_folder, "tiny-transformer")
    assert [repo["private"] for repo in hub.repos] == [None]
    assert [upload["repo_id"] for upload in hub.uploads] == ["me/tiny-transformer"]


def test_push_to_a_branch_creates_it_and_uploads_there(hub_folder: Path, hub: FakeHub) -> None:
    push_to_hub(hub_folder, "someone/tiny-transformer", revision="v2")
    assert hub.branches == [
        {"repo_id": "someone/tiny-transformer", "branch": "v2", "repo_type": "model", "exist_ok": True}
    ]
    assert [upload["revision"] for upload in hub.uploads] == ["v2"]
    push_to_hub(hub_folder, "someone/tiny-transformer", revision="refs/pr/3")  # a pull request: no branch
    assert len(hub.branches) == 1 and hub.uploads[-1]["revision"] == "refs/pr/3"


def test_a_failed_private_push_to_a_branch_names_both_in_the_retry_command(
    hub_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retrying with the printed command must not create a public repo or push to main."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubPushError) as failure:
        push_to_hub(hub_folder, "someone/tiny-transformer", private=True, revision="v2")
    message = str(failure.value)
    assert "\n" not in message
    assert (
        f"--output_dir {hub_folder} --push_to_hub --hub_model_id someone/tiny-transformer --hub_revision v2"
        " --private" in message
    )
    assert f"hf upload someone/tiny-transformer {hub_folder} . --revision v2 --private" in message


@pytest.mark.slow  # two training runs and a clean-interpreter load
def test_train_push_uploads_the_publish_folder_and_a_resumed_run_pushes_again(
    tokenizer, tmp_path: Path, hub: FakeHub, no_trainer_push: None
) -> None:
    run = tmp_path / "run"
    assert train_main(train_push_argv(tmp_path, tokenizer, *CARD_ARGS, "--hub_revision", "v2")) == 0
    [upload] = hub.uploads
    assert upload["repo_id"] == "someone/x" and upload["folder"] == run / "hub" and upload["revision"] == "v2"
    assert [repo["private"] for repo in hub.repos] == [None]  # no --hub_private_repo: the owner's default
    files = upload["files"]
    assert set(files) >= HUB_FOLDER_FILES
    assert not [name for name in files if Path(name).suffix in PICKLE_SUFFIXES]
    assert "AutoModelForSeq2SeqLM" in json.loads(files["config.json"])["auto_map"]
    # The scores come from the run's own evaluation, written as hf-vanilla-evaluate writes it.
    results = json.loads((run / "validation.results.json").read_text())
    assert (results["split"], results["source_lang"], results["target_lang"]) == ("validation", "en", "de")
    assert results["model"] == str(run) and results["decoding"] == DecodingOptions().to_dict()
    assert (run / "validation.hyp.de").is_file()
    card = ModelCard(files["README.md"].decode())
    data = card.data.to_dict()
    assert (data["license"], data["datasets"], data["language"]) == (
        "cc-by-4.0",
        ["someone/pairs"],
        ["en", "de"],
    )
    bleu = {m["type"]: m["value"] for m in data["model-index"][0]["results"][0]["metrics"]}["bleu"]
    assert bleu == round(results["bleu"], 2)
    assert "CC BY 4.0, attribution" in card.text and "Trained for 2 optimizer steps" in card.text
    recorded = json.loads((run / "training_args.json").read_text())
    assert (recorded["dataset"], recorded["dataset_id"], recorded["weights_license"]) == (
        "custom",
        "someone/pairs",
        "cc-by-4.0",
    )
    assert_self_contained(run / "hub", tmp_path)
    # hf-vanilla-publish from the training output takes the card's data the run recorded.
    publish_main = runpy.run_path(str(REPO / "scripts" / "publish.py"))["main"]
    argv = ["--model_name_or_path", str(run), "--output_dir", str(tmp_path / "published")]
    assert publish_main([*argv, "--results_files", str(run / "validation.results.json")]) == 0
    assert ModelCard.load(tmp_path / "published" / "README.md").data.datasets == ["someone/pairs"]

    # Resumed, the run names its data as recorded in the checkpoint, and replaces the Hub folder (--overwrite).
    argv = train_push_argv(tmp_path, tokenizer, "--max_steps", "3", "--resume_from_checkpoint", "last")
    assert train_main([*argv, "--overwrite"]) == 0
    assert (
        len(hub.uploads) == 2
        and "Trained for 3 optimizer steps" in hub.uploads[1]["files"]["README.md"].decode()
    )
    assert ModelCard.load(run / "hub" / "README.md").data.license == "cc-by-4.0"


def test_train_push_offline_is_one_line_and_keeps_the_folders(
    tokenizer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    no_trainer_push: None,
) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", _must_not_be_called)
    argv = train_push_argv(tmp_path, tokenizer, *CARD_ARGS, "--average_last_n_checkpoints", "2")
    assert train_main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert [line for line in err if line.startswith("error: ")] == [err[-1]]
    run = tmp_path / "run"
    retry = (
        f"hf-vanilla-publish --push_only --output_dir {run / 'hub'} --push_to_hub --hub_model_id someone/x"
    )
    assert "offline mode is on" in err[-1] and retry in err[-1]
    assert (run / "model.safetensors").is_file() and (run / "checkpoint-2").is_dir()
    assert (run / "hub" / "README.md").is_file() and (run / "hub" / "model.safetensors").is_file()
    # The card describes the averaged model, whose scores it shows.
    results = json.loads((run / "validation.results.json").read_text())
    assert results["model"] == str(run / "averaged")
    metadata = json.loads((run / "hub" / "hub_metadata.json").read_text())
    assert metadata["source_model"] == "averaged"  # its name and weights, not a local path
    assert metadata["source_model_sha256"] == weights_fingerprint(run / "averaged")
    assert not _files_naming(run / "hub", tmp_path), "a local path leaves the machine"
    card = (run / "hub" / "README.md").read_text()
    assert "with hf_vanilla's Trainer recipe (§5). The weights are the average of its last 2" in card
    # The run recorded a few of its training sources; the averaged folder keeps them; the card shows them.
    record = read_training_record(run / "averaged")
    assert "averaging 2 of its checkpoints" in record["trained_with"]
    assert record["example_sources"] and set(record["example_sources"]) <= {
        f"w{i} w{i + 1} w{i + 2}" for i in range(16)
    }
    assert f'tokenizer(["{record["example_sources"][0]}"]' in card
    # The averaged folder keeps the run's record, so hf-vanilla-publish on it finds the card's data.
    args = PublishArguments(output_dir=str(tmp_path / "republish"))
    card_data_recorded_in(run / "averaged", args)
    assert (args.dataset, args.dataset_id) == ("custom", "someone/pairs")


# --- what the published card states: only what the model folder records --------------------------


def _files_naming(folder: Path, path: Path) -> list[str]:
    """The files under ``folder`` whose bytes contain ``path`` (as given or resolved)."""
    needles = {str(path).encode(), str(path.resolve()).encode()}
    return [str(p) for p in folder.rglob("*") if p.is_file() and any(n in p.read_bytes() for n in needles)]


def _trained_folder(model, tokenizer, folder: Path, record: dict | None) -> Path:
    save_model_folder(model, tokenizer, folder)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 200, "epoch": 3.0}))
    if record is not None:
        write_training_record(folder, **record)
    return folder


def test_published_card_takes_title_data_training_and_examples_from_the_folder(
    model, tokenizer, tmp_path: Path
) -> None:
    record = {
        "trained_with": "a recipe of the test",
        "title": "Tiny words model",
        "dataset": {
            "dataset_id": "someone/words",
            "name": "Words corpus",
            "terms": "CC0",
            "license": "cc0-1.0",
        },
        "example_sources": ["w5 w6 w7", "w8 w9"],
    }
    model_dir = _trained_folder(model, tokenizer, tmp_path / "model", record)
    args = PublishArguments(
        output_dir=str(tmp_path / "hub"),
        results_files=[str(write_result_file(tmp_path, model_dir=model_dir))],
    )
    folder = publish(model, tokenizer, args, model_dir=model_dir)  # no --dataset: the folder records it
    card = ModelCard.load(folder / "README.md")
    assert card.data.model_name == "Tiny words model" and "# Tiny words model" in card.text
    assert card.data.license == "cc0-1.0" and card.data.datasets == ["someone/words"]
    assert "Trained for 200 optimizer steps (3.0 epochs) with a recipe of the test." in card.text
    assert 'tokenizer(["w5 w6 w7"]' in card.text and "`w8 w9`" in card.text
    assert not _files_naming(folder, tmp_path), "a local path leaves the machine"


def test_published_card_of_a_folder_that_records_nothing_says_unknown(
    model, tokenizer, tmp_path: Path
) -> None:
    """A folder written by a stock script (trainer_state.json, no record), or one whose weights were replaced
    after its record was written: the card claims no recipe, no title from a folder name, no foreign example."""
    stock = _trained_folder(model, tokenizer, tmp_path / "stock", None)
    replaced = _trained_folder(
        model, tokenizer, tmp_path / "replaced", {"trained_with": "hf_vanilla's recipe"}
    )
    (replaced / "model.safetensors").write_bytes((stock / "model.safetensors").read_bytes() + b" ")
    for model_dir in (stock, replaced):
        results = write_result_file(tmp_path / model_dir.name, model_dir=model_dir)
        out = tmp_path / f"{model_dir.name}-hub"
        args = PublishArguments(output_dir=str(out), results_files=[str(results)], dataset="multi30k")
        card = ModelCard.load(publish(model, tokenizer, args, model_dir=model_dir) / "README.md")
        assert (
            "Trained for 200 optimizer steps (3.0 epochs) by a recipe the folder does not record (unknown). "
            "These are the steps of the run that wrote the folder; training before that run is not recorded."
            in " ".join(card.text.split())
        )
        assert "recipe (§5)" not in card.text and "A man rides a bike." not in card.text
        assert card.data.model_name == "Transformer (Attention Is All You Need), English → German"
        assert not _files_naming(out, tmp_path), "a local path leaves the machine"
