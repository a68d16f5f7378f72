"""VanillaTransformerConfig: the paper's Table 3 defaults and presets, HF conventions, validation."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import pytest
import torch
from huggingface_hub.errors import StrictDataclassClassValidationError, StrictDataclassFieldValidationError
from transformers import AutoConfig
from transformers.utils import logging as hf_logging

from hf_vanilla import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration


def test_defaults_are_the_paper_base_model() -> None:
    config = VanillaTransformerConfig()
    assert config.model_type == "vanilla_transformer"
    assert (config.encoder_layers, config.decoder_layers) == (6, 6)  # N
    assert config.d_model == 512
    assert (config.encoder_attention_heads, config.decoder_attention_heads) == (8, 8)  # h
    assert (config.encoder_ffn_dim, config.decoder_ffn_dim) == (2048, 2048)  # d_ff
    assert config.dropout == 0.1  # P_drop
    assert config.attention_dropout == 0.0 and config.activation_dropout == 0.0
    assert config.activation_function == "relu"
    assert config.scale_embedding is True and config.tie_word_embeddings is True
    assert config.attention_bias is False
    assert config.to_dict() == VanillaTransformerConfig.from_preset("base").to_dict()


def test_big_preset() -> None:
    config = VanillaTransformerConfig.from_preset("big", vocab_size=1000)
    assert (config.d_model, config.encoder_attention_heads, config.encoder_ffn_dim, config.dropout) == (
        1024,
        16,
        4096,
        0.3,
    )
    assert config.vocab_size == 1000
    with pytest.raises(ValueError, match="Unknown preset 'huge'"):
        VanillaTransformerConfig.from_preset("huge")


@pytest.mark.parametrize(
    ("preset", "low", "high"), [("base", 63e6, 65e6), ("big", 0.99 * 213e6, 1.01 * 213e6)]
)
def test_presets_have_the_paper_parameter_counts(preset: str, low: float, high: float) -> None:
    """Table 3: base ≈ 65 M and big ≈ 213 M parameters with a 37,000-token shared vocabulary
    (the paper rounds; we accept 63–65 M and 213 M ± 1 %)."""
    config = VanillaTransformerConfig.from_preset(preset, vocab_size=37000)
    with torch.device("meta"):
        model = VanillaTransformerForConditionalGeneration(config)
    count = sum(p.numel() for p in model.parameters())  # shared embeddings are counted once
    print(f"{preset}: {count / 1e6:.1f} M parameters")
    assert low <= count <= high


def test_attribute_map_and_special_tokens() -> None:
    config = VanillaTransformerConfig(d_model=64, encoder_attention_heads=4, encoder_layers=3, vocab_size=50)
    assert (config.hidden_size, config.num_attention_heads, config.num_hidden_layers) == (64, 4, 3)
    assert (config.pad_token_id, config.bos_token_id, config.eos_token_id) == (0, 1, 2)
    assert config.decoder_start_token_id == config.bos_token_id
    custom = VanillaTransformerConfig(
        vocab_size=50, pad_token_id=3, bos_token_id=4, eos_token_id=5, decoder_start_token_id=6
    )
    assert (custom.pad_token_id, custom.bos_token_id, custom.eos_token_id, custom.decoder_start_token_id) == (
        3,
        4,
        5,
        6,
    )


def test_default_config_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    hf_logging.enable_propagation()
    try:
        with caplog.at_level(logging.DEBUG), warnings.catch_warnings():
            warnings.simplefilter("error")
            VanillaTransformerConfig()
    finally:
        hf_logging.disable_propagation()
    assert caplog.records == []


def test_save_load_and_auto_config(tmp_path) -> None:
    config = VanillaTransformerConfig(
        vocab_size=123, d_model=64, encoder_attention_heads=4, label_smoothing=0.1
    )
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, VanillaTransformerConfig)
    assert loaded.to_diff_dict() == config.to_diff_dict()
    assert loaded.to_dict() == {**config.to_dict(), "_name_or_path": str(tmp_path)}


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"d_model": 100, "encoder_attention_heads": 8}, "encoder_attention_heads"),
        ({"d_model": 96, "decoder_attention_heads": 5}, "decoder_attention_heads"),
        ({"d_model": 0}, "d_model"),
        ({"encoder_layers": -1}, "encoder_layers"),
        ({"decoder_ffn_dim": 0}, "decoder_ffn_dim"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"max_position_embeddings": 0}, "max_position_embeddings"),
        ({"dropout": 1.0}, "dropout"),
        ({"attention_dropout": -0.1}, "attention_dropout"),
        ({"activation_dropout": 1.5}, "activation_dropout"),
        ({"label_smoothing": 1.0}, "label_smoothing"),
        ({"vocab_size": 10, "pad_token_id": 10}, "pad_token_id"),
        ({"vocab_size": 10, "eos_token_id": 12}, "eos_token_id"),
        ({"vocab_size": 10, "bos_token_id": -1}, "bos_token_id"),
        ({"vocab_size": 10, "decoder_start_token_id": 99}, "decoder_start_token_id"),
        ({"init_std": 0.0}, "init_std"),
    ],
)
def test_invalid_configurations_name_the_field(overrides: dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"`{field}`"):
        VanillaTransformerConfig(**overrides)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"activation_function": "tanhh"}, "activation_function"),
        ({"position_encoding_layout": "diagonal"}, "position_encoding_layout"),
        ({"position_encoding_timescales": "t5"}, "position_encoding_timescales"),
        ({"d_model": "512"}, "d_model"),
        ({"dropout": None}, "dropout"),
    ],
)
def test_types_and_choices_are_checked_by_strict_validation(overrides: dict, field: str) -> None:
    """transformers' ``@strict`` dataclass validation (as for Marian) names the field; choices are ``Literal``."""
    with pytest.raises(StrictDataclassFieldValidationError, match=f"field '{field}'"):
        VanillaTransformerConfig(**overrides)


def test_invalid_changes_are_refused_on_save(tmp_path) -> None:
    """Assignment checks the type at once; ranges are checked again when the config is saved."""
    config = VanillaTransformerConfig(vocab_size=100, d_model=32)
    with pytest.raises(StrictDataclassFieldValidationError, match="field 'encoder_layers'"):
        config.encoder_layers = "2"
    config.encoder_layers = 0
    with pytest.raises(
        StrictDataclassClassValidationError, match="`encoder_layers` must be a positive integer"
    ):
        config.save_pretrained(tmp_path)
    assert not (tmp_path / "config.json").exists()


def test_head_divisibility_error_suggests_a_fix() -> None:
    with pytest.raises(ValueError, match=r"divisible.*Choose e\.g\. encoder_attention_heads=6"):
        VanillaTransformerConfig(d_model=30, encoder_attention_heads=8, decoder_attention_heads=6)


@pytest.mark.parametrize("separate", [False, True])
def test_text_config_of_each_side(separate: bool) -> None:
    """transformers flattens the config per side (``decoder_*`` fields renamed to the plain names);
    generation reads the decoder side's sizes, so each must be that side's own."""
    extra = {"share_encoder_decoder_embeddings": False, "decoder_vocab_size": 80} if separate else {}
    config = VanillaTransformerConfig(
        vocab_size=100,
        d_model=32,
        encoder_layers=2,
        decoder_layers=3,
        encoder_attention_heads=4,
        decoder_attention_heads=8,
        **extra,
    )
    decoder, encoder = config.get_text_config(decoder=True), config.get_text_config(encoder=True)
    sizes = ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers")
    assert [getattr(decoder, name) for name in sizes] == [80 if separate else 100, 32, 8, 3]
    assert [getattr(encoder, name) for name in sizes] == [100, 32, 4, 2]
    assert config.get_text_config() is config  # both sides at once: the config itself, unchanged


def test_decoder_text_config_follows_resized_embeddings() -> None:
    config = VanillaTransformerConfig(vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1)
    model = VanillaTransformerForConditionalGeneration(config)
    model.resize_token_embeddings(120)
    assert model.config.get_text_config(decoder=True).vocab_size == 120
    assert model.get_output_embeddings().weight.shape[0] == 120


@pytest.mark.parametrize("name", ["paper", "imported"])
def test_config_json_saved_before_typed_fields_loads_unchanged(name: str, tmp_path) -> None:
    """config.json files written by the config class before it had typed fields (tests/fixtures, one with
    the paper's fields, one with every option for imported checkpoints) load to the same values and
    save back to the same file."""
    folder = Path(__file__).parents[1] / "fixtures" / "config_before_typed_fields" / name
    saved = json.loads((folder / "config.json").read_text())
    config = VanillaTransformerConfig.from_pretrained(folder)
    for key, value in saved.items():
        if key != "transformers_version":
            assert getattr(config, key) == value, key
    config.save_pretrained(tmp_path)
    again = json.loads((tmp_path / "config.json").read_text())
    assert {k: v for k, v in again.items() if k != "transformers_version"} == {
        k: v for k, v in saved.items() if k != "transformers_version"
    }


def test_a_config_json_of_the_wrong_type_is_one_line_in_the_commands(
    tmp_path, model, tokenizer, capsys: pytest.CaptureFixture[str]
) -> None:
    """A hand-edited ``config.json`` with a field of the wrong type ends a command in one ``error:`` line."""
    from hf_vanilla.cli.translate import main as translate_main

    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    config_file = tmp_path / "model" / "config.json"
    config_file.write_text(config_file.read_text().replace('"d_model": 32', '"d_model": "32"'))
    (tmp_path / "source.txt").write_text("w1 w2\n")
    status = translate_main(
        ["--model_name_or_path", str(tmp_path / "model"), "--input_file", str(tmp_path / "source.txt")]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 1
    assert err[-1].startswith("error: ") and "'d_model'" in err[-1] and "expected int" in err[-1]
