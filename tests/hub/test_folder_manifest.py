"""Every model folder hf_vanilla writes carries a manifest of its weights and tokenizer
(``checksums.sha256``) and a record of its architecture (``architecture.json``), which the loaders check:
damage in place and config edits the weights cannot follow are refused in one error naming the file or
the field, while generation settings and the card stay free to edit."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import marian, save_with_side_files, tiny_model, word_tokenizer
from huggingface_hub import ModelCard
from safetensors.torch import load_file, save_file

from hf_vanilla.data.tokenization import load_tokenizer
from hf_vanilla.hub.folder import save_for_hub, save_model_folder
from hf_vanilla.interop.convert import convert
from hf_vanilla.io.checked_loading import load_pretrained_checked
from hf_vanilla.io.errors import CheckpointError
from hf_vanilla.training.averaging import average_checkpoints


def _model_folder(tmp: Path) -> Path:
    tokenizer = word_tokenizer()
    return save_model_folder(tiny_model(vocab_size=len(tokenizer)), tokenizer, tmp / "model")


def _published(tmp: Path) -> Path:
    tokenizer = word_tokenizer()
    model = tiny_model(vocab_size=len(tokenizer))
    return save_for_hub(model, tokenizer, tmp / "hub", ModelCard("---\nlicense: mit\n---\n# a model\n"))


def _averaged(tmp: Path) -> Path:
    tokenizer = word_tokenizer()
    first = save_model_folder(tiny_model(seed=1, vocab_size=len(tokenizer)), tokenizer, tmp / "a")
    second = save_model_folder(tiny_model(seed=2, vocab_size=len(tokenizer)), tokenizer, tmp / "b")
    return average_checkpoints([first, second], tmp / "averaged")


def _converted(tmp: Path) -> Path:
    save_with_side_files(marian(), tmp / "marian", word_tokenizer())
    convert(str(tmp / "marian"), tmp / "converted")
    return tmp / "converted"


WRITERS: dict[str, Callable[[Path], Path]] = {
    "save_model_folder": _model_folder,
    "published (save_for_hub)": _published,
    "averaged": _averaged,
    "converted": _converted,
}


def _flip_a_bit(weights: Path) -> None:
    """One bit of the first tensor's bytes flipped in place: the file keeps its size and header."""
    data = bytearray(weights.read_bytes())
    (header,) = struct.unpack("<Q", data[:8])
    data[8 + header + 3] ^= 0x40  # the exponent of a float32: a huge but finite value
    weights.write_bytes(bytes(data))


def _truncate_vocabulary(tokenizer_json: Path) -> None:
    """A tokenizer.json that still parses, with half its vocabulary gone (as a cut merges list is)."""
    tokenizer = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    vocab = tokenizer["model"]["vocab"]
    tokenizer["model"]["vocab"] = dict(list(vocab.items())[: len(vocab) // 2])
    tokenizer_json.write_text(json.dumps(tokenizer), encoding="utf-8")


def _edit_json(path: Path, **changes: object) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text(encoding="utf-8")), **changes}), encoding="utf-8")


@pytest.mark.parametrize("writer", WRITERS)
def test_every_written_folder_refuses_damage_in_place_but_not_edited_settings(
    writer: str, tmp_path: Path
) -> None:
    folder = WRITERS[writer](tmp_path)
    manifest = (folder / "checksums.sha256").read_text(encoding="utf-8")
    listed = {line.split("  ", 1)[1] for line in manifest.splitlines()}
    assert {"model.safetensors", "tokenizer.json", "tokenizer_config.json", "architecture.json"} <= listed
    assert not listed & {"config.json", "generation_config.json", "README.md"}
    if shutil.which("sha256sum"):
        subprocess.run(["sha256sum", "--quiet", "-c", "checksums.sha256"], cwd=folder, check=True)

    _edit_json(folder / "generation_config.json", num_beams=2)  # a user's own decoding settings
    (folder / "README.md").write_text("# my model\n", encoding="utf-8")
    _edit_json(folder / "config.json", dropout=0.3, use_cache=False, max_position_embeddings=128)
    assert load_pretrained_checked(folder).config.dropout == 0.3
    load_tokenizer(folder)

    damaged = Path(shutil.copytree(folder, tmp_path / "damaged"))
    _flip_a_bit(damaged / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model\.safetensors' is damaged: its sha256 differs"):
        load_pretrained_checked(damaged)
    _truncate_vocabulary(damaged / "tokenizer.json")
    with pytest.raises(CheckpointError, match=r"tokenizer\.json' is damaged: its sha256 differs"):
        load_tokenizer(damaged)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("scale_embedding", False),
        ("position_encoding_layout", "halves"),
        ("position_encoding_timescales", "tensor2tensor"),
        ("position_offset", 2),
        ("encoder_attention_heads", 2),
        ("activation_function", "gelu"),
        ("model_type", "marian"),
    ],
)
def test_a_config_edit_the_weights_cannot_follow_is_refused_naming_the_field(
    field: str, value: object, tmp_path: Path
) -> None:
    folder = _model_folder(tmp_path)
    recorded = json.loads((folder / "architecture.json").read_text(encoding="utf-8"))[field]
    _edit_json(folder / "config.json", **{field: value})
    expected = f"{field} is {json.dumps(value)}, recorded {json.dumps(recorded)} in architecture.json"
    with pytest.raises(CheckpointError, match=f"config.json' contradicts the weights .*{expected}") as raised:
        load_pretrained_checked(folder)
    assert "\n" not in str(raised.value)


def test_a_folder_without_a_manifest_loads_as_before(tmp_path: Path) -> None:
    """A stock ``save_pretrained`` folder (or a Hub download) has nothing to check damage against."""
    tokenizer = word_tokenizer()
    tiny_model(vocab_size=len(tokenizer)).save_pretrained(tmp_path / "stock")
    tokenizer.save_pretrained(tmp_path / "stock")
    _edit_json(tmp_path / "stock" / "config.json", scale_embedding=False)
    assert load_pretrained_checked(tmp_path / "stock").config.scale_embedding is False
    load_tokenizer(tmp_path / "stock")


def test_a_folder_saved_over_on_purpose_says_how_to_load_it(tmp_path: Path) -> None:
    """A stock ``save_pretrained`` over a folder hf_vanilla wrote leaves the old manifest behind: the
    refusal says which files to delete when that was on purpose, and the folder then loads."""
    folder = _model_folder(tmp_path)
    tiny_model(seed=5, vocab_size=len(word_tokenizer())).save_pretrained(folder)  # writes no manifest
    with pytest.raises(
        CheckpointError, match=r"delete its checksums\.sha256 and architecture\.json"
    ) as refused:
        load_pretrained_checked(folder)
    assert "model.safetensors' is damaged" in str(refused.value)
    (folder / "checksums.sha256").unlink()
    (folder / "architecture.json").unlink()
    assert load_pretrained_checked(folder).config.d_model == tiny_model().config.d_model


def test_a_damaged_tensor_name_is_damage_not_a_config_edit(tmp_path: Path) -> None:
    folder = _model_folder(tmp_path)
    weights = folder / "model.safetensors"
    state = load_file(str(weights))
    name = next(key for key in state if key.endswith("fc1.weight"))
    state[name.replace("fc1", "fcX")] = state.pop(name)
    save_file(state, str(weights), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"model\.safetensors' is damaged"):
        load_pretrained_checked(folder)
    (folder / "checksums.sha256").unlink()  # no manifest: the names tell
    with pytest.raises(CheckpointError, match="holds tensor names the model does not have") as raised:
        load_pretrained_checked(folder)
    assert "fcX" in str(raised.value) and "config.json" not in str(raised.value)


@pytest.mark.parametrize("change", [{"decoder_layers": 1}, {"attention_bias": False}])
def test_names_a_config_would_give_the_model_are_blamed_on_the_config(change: dict, tmp_path: Path) -> None:
    """Without a record: more layers, or biases, in the weights than config.json asks for."""
    tokenizer = word_tokenizer()
    tiny_model(vocab_size=len(tokenizer), attention_bias=True).save_pretrained(tmp_path / "stock")
    _edit_json(tmp_path / "stock" / "config.json", **change)
    with pytest.raises(CheckpointError, match=r"its config\.json disagrees with its weights"):
        load_pretrained_checked(tmp_path / "stock")


def test_a_ctranslate2_export_refuses_damage_in_place_but_not_edited_settings(tmp_path: Path) -> None:
    pytest.importorskip("ctranslate2")
    import torch

    from hf_vanilla.inference.ctranslate2 import CTranslate2Model
    from hf_vanilla.interop.export_ctranslate2 import export_ctranslate2

    export = Path(export_ctranslate2(_model_folder(tmp_path), tmp_path / "ct2"))
    _edit_json(export / "generation_config.json", num_beams=2)
    CTranslate2Model(export, torch.device("cpu"))
    data = bytearray((export / "model.bin").read_bytes())
    data[-5] ^= 0x40
    (export / "model.bin").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"model\.bin' is damaged: its sha256 differs"):
        CTranslate2Model(export, torch.device("cpu"))


def test_a_trained_tokenizer_folder_refuses_damage_in_place(tmp_path: Path) -> None:
    from hf_vanilla.cli.train_tokenizer import main

    data = tmp_path / "data.tsv"
    data.write_text("".join(f"w{i} w{i + 1}\tw{i + 1} w{i}\n" for i in range(20)), encoding="utf-8")
    argv = ["--train_files", str(data), "--source_lang", "en", "--target_lang", "de", "--vocab_size", "300"]
    assert main([*argv, "--output_dir", str(tmp_path / "tok")]) == 0
    load_tokenizer(tmp_path / "tok")
    _truncate_vocabulary(tmp_path / "tok" / "tokenizer.json")
    with pytest.raises(CheckpointError, match=r"tokenizer\.json' is damaged: its sha256 differs"):
        load_tokenizer(tmp_path / "tok")


@pytest.mark.parametrize("manifest", [True, False])
def test_a_config_value_of_the_wrong_type_is_one_error_naming_config_json(
    manifest: bool, tmp_path: Path
) -> None:
    folder = _model_folder(tmp_path)
    if not manifest:
        (folder / "checksums.sha256").unlink()
        (folder / "architecture.json").unlink()
    _edit_json(folder / "config.json", d_model="32")
    with pytest.raises(
        CheckpointError, match=r"config\.json' does not describe a valid model \(.*d_model"
    ) as raised:
        load_pretrained_checked(folder)
    assert "\n" not in str(raised.value)
