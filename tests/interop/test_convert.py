"""Converting Marian (OPUS-MT) and FSMT (fairseq) models: same logits, same translations, clear refusals.

The source models are built by transformers itself with random weights (tiny configs, no downloads).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import SMALL, marian, randomize, save_with_side_files
from torch import nn
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    BartConfig,
    BartForConditionalGeneration,
    FSMTConfig,
    FSMTForConditionalGeneration,
    HfArgumentParser,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)
from transformers.models.fsmt.modeling_fsmt import SinusoidalPositionalEmbedding
from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

from hf_vanilla import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla.interop.convert import ConversionError, convert, convert_model
from hf_vanilla.interop.options import ConversionArguments
from hf_vanilla.models.vanilla_transformer.modeling_vanilla_transformer import sinusoidal_position_encoding

ROOT = Path(__file__).resolve().parents[2]


def fsmt(seed: int = 0, **overrides: object) -> FSMTForConditionalGeneration:
    """A fairseq-WMT-like FSMT: <s> 0, <pad> 1, </s> 2 (also the decoder start)."""
    fields = {
        **SMALL,
        "langs": ["en", "de"],
        "src_vocab_size": 50,
        "tgt_vocab_size": 70,
        "encoder_attention_heads": 4,
        "decoder_attention_heads": 4,
        "encoder_ffn_dim": 64,
        "decoder_ffn_dim": 64,
        **overrides,
    }
    torch.manual_seed(seed)
    return randomize(FSMTForConditionalGeneration(FSMTConfig(**fields)), seed)


MARIAN_CASES = {
    # OPUS-MT's usual shape: shared vocabulary, swish, no √d scaling, a logits bias; here also
    # different encoder/decoder heads and FFN widths.
    "opus-mt": {"decoder_attention_heads": 2, "decoder_ffn_dim": 48},
    "separate-vocabularies": {
        "share_encoder_decoder_embeddings": False,
        "decoder_vocab_size": 45,
        "pad_token_id": 44,
        "decoder_start_token_id": 44,
        "activation_function": "gelu",
        "scale_embedding": True,
    },
    "untied-projection": {
        "tie_word_embeddings": False,
        "activation_function": "relu",
        "d_model": 16,
        "encoder_layers": 1,
        "decoder_layers": 3,
    },
}

FSMT_CASES = {
    "separate-vocabularies": {},  # fairseq WMT19's layout: own dictionaries, untied projection
    "shared-tied": {"src_vocab_size": 60, "tgt_vocab_size": 60, "tie_word_embeddings": True},
    "gelu-one-layer": {
        "activation_function": "gelu",
        "encoder_layers": 1,
        "decoder_layers": 1,
        "d_model": 16,
    },
}


def source_batch(model: PreTrainedModel, length: int = 12) -> dict[str, torch.Tensor]:
    """Three right-padded source rows over non-special ids."""
    config = model.config
    vocab = getattr(config, "src_vocab_size", config.vocab_size)
    high = config.pad_token_id if config.pad_token_id > 3 else vocab  # Marian's <pad> is the last id
    input_ids = torch.randint(3, high, (3, length), generator=torch.Generator().manual_seed(3))
    attention_mask = torch.ones_like(input_ids)
    input_ids[1, 8:], attention_mask[1, 8:] = config.pad_token_id, 0
    input_ids[2, 5:], attention_mask[2, 5:] = config.pad_token_id, 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def target_ids(config: VanillaTransformerConfig, length: int = 10) -> torch.Tensor:
    """Decoder inputs: the start token, then random non-pad target ids."""
    generator = torch.Generator().manual_seed(4)
    ids = torch.randint(3, config.target_vocab_size, (3, length), generator=generator)
    ids[ids == config.pad_token_id] = 3
    ids[:, 0] = config.decoder_start_token_id
    return ids


def assert_same_model(source: PreTrainedModel, converted: VanillaTransformerForConditionalGeneration) -> None:
    """Equal logits (1e-5) and identical greedy and beam-4 outputs under the same settings, which
    include the generation defaults the conversion copies (e.g. OPUS-MT's beam size, bad words)."""
    assert converted.generation_config.to_dict() == source.generation_config.to_dict()
    batch = source_batch(source)
    decoder_input_ids = target_ids(converted.config)
    with torch.no_grad():
        expected = source(**batch, decoder_input_ids=decoder_input_ids, use_cache=False).logits
        actual = converted(**batch, decoder_input_ids=decoder_input_ids).logits
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0)

    for num_beams in (1, 4):
        settings = {"num_beams": num_beams, "max_new_tokens": 16, "do_sample": False, "length_penalty": 1.0}
        expected_ids = source.generate(**batch, **settings)
        actual_ids = converted.generate(**batch, **settings)
        assert torch.equal(actual_ids, expected_ids), f"num_beams={num_beams}"
        # The translations depend on the source (the same output for every row would prove little).
        assert len({tuple(row) for row in expected_ids.tolist()}) > 1


@pytest.mark.parametrize("case", MARIAN_CASES)
def test_marian_conversion_keeps_logits_and_translations(
    case: str, tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    source = marian(seed=len(case), **MARIAN_CASES[case])
    save_with_side_files(source, tmp_path / "marian", tokenizer)
    convert(str(tmp_path / "marian"), tmp_path / "converted")
    converted = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "converted").eval()
    assert isinstance(converted, VanillaTransformerForConditionalGeneration)
    assert converted.config.position_encoding_layout == "halves"
    assert converted.config.position_encoding_timescales == "paper"
    assert converted.config.position_offset == 0
    assert converted.config.final_logits_bias  # the random bias is not zero
    assert converted.generation_config.decoder_start_token_id == source.config.decoder_start_token_id
    assert_same_model(source, converted)


@pytest.mark.parametrize("case", FSMT_CASES)
def test_fsmt_conversion_keeps_logits_and_translations(case: str, tmp_path: Path) -> None:
    source = fsmt(seed=len(case), **FSMT_CASES[case])
    source.save_pretrained(tmp_path / "fsmt")
    converted = AutoModelForSeq2SeqLM.from_pretrained(convert_to(tmp_path / "fsmt", tmp_path / "out")).eval()
    config = converted.config
    assert (config.position_encoding_timescales, config.position_offset) == ("tensor2tensor", 2)
    tied = case == "shared-tied"
    assert config.share_encoder_decoder_embeddings is tied and config.tie_word_embeddings is tied
    assert (converted.lm_head.weight is converted.model.decoder.embed_tokens.weight) is tied
    assert_same_model(source, converted)


def convert_to(source: Path, output: Path) -> Path:
    convert(str(source), output)
    return output


def test_conversion_copies_tokenizer_and_keeps_the_license(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    save_with_side_files(marian(), tmp_path / "marian", tokenizer)
    out = convert_to(tmp_path / "marian", tmp_path / "out")
    text = "w1 w2 w3 w99"
    assert AutoTokenizer.from_pretrained(out)(text).input_ids == tokenizer(text).input_ids
    assert (out / "LICENSE").read_text() == "CC-BY 4.0\n"
    assert (out / "ORIGINAL_README.md").read_text() == (tmp_path / "marian" / "README.md").read_text()
    card = (out / "README.md").read_text()
    assert "license: cc-by-4.0" in card and "keeps the original model's license" in card


def test_fsmt_vocabulary_files_are_copied(tmp_path: Path) -> None:
    """FSMT's tokenizer is a set of plain files (its class needs sacremoses only to run)."""
    folder = tmp_path / "fsmt"
    fsmt().save_pretrained(folder)
    files = {
        "vocab-src.json": json.dumps({"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}),
        "vocab-tgt.json": json.dumps({"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}),
        "merges.txt": "a b 10\n",
        "tokenizer_config.json": json.dumps({"tokenizer_class": "FSMTTokenizer", "langs": ["en", "de"]}),
    }
    for name, content in files.items():
        (folder / name).write_text(content)
    out = convert_to(folder, tmp_path / "out")
    for name, content in files.items():
        assert (out / name).read_text() == content
    assert json.loads((out / "config.json").read_text())["model_type"] == "vanilla_transformer"


def test_all_zero_logits_bias_is_left_out() -> None:
    source = marian()
    source.final_logits_bias.zero_()
    converted = convert_model(source)
    assert not converted.config.final_logits_bias
    assert "final_logits_bias" not in converted.state_dict()


def test_position_encodings_match_marian_and_fairseq_tables() -> None:
    """The two new layouts are the tables the source classes store (Marian: float64-built halves;
    fairseq: tensor2tensor frequencies from position pad + 1)."""
    d_model, n, pad = 24, 200, 1
    marian_table = MarianSinusoidalPositionalEmbedding(n, d_model).create_weight()
    ours = sinusoidal_position_encoding(torch.arange(n), d_model, layout="halves")
    torch.testing.assert_close(ours, marian_table, atol=2e-5, rtol=0)
    fairseq_table = SinusoidalPositionalEmbedding.get_embedding(n + pad + 1, d_model, pad)[pad + 1 :]
    ours = sinusoidal_position_encoding(
        torch.arange(pad + 1, n + pad + 1), d_model, layout="halves", timescales="tensor2tensor"
    )
    torch.testing.assert_close(ours, fairseq_table, atol=1e-6, rtol=0)
    paper = sinusoidal_position_encoding(torch.arange(n), d_model)
    assert not torch.allclose(paper, marian_table, atol=1e-2)  # the layouts do differ


def test_paper_model_has_none_of_the_options() -> None:
    config = VanillaTransformerConfig()
    assert (config.position_encoding_layout, config.position_encoding_timescales) == ("interleaved", "paper")
    assert (config.position_offset, config.final_logits_bias, config.decoder_vocab_size) == (0, False, None)
    assert config.share_encoder_decoder_embeddings
    model = VanillaTransformerForConditionalGeneration(
        VanillaTransformerConfig(
            vocab_size=40,
            d_model=16,
            encoder_layers=1,
            decoder_layers=1,
            encoder_ffn_dim=32,
            decoder_ffn_dim=32,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
        )
    )
    assert "final_logits_bias" not in model.state_dict()
    assert model.model.decoder.embed_tokens is model.model.shared is model.model.encoder.embed_tokens


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda m: setattr(m.config, "normalize_before", True), "normalize_before"),
        (lambda m: setattr(m.config, "add_final_layer_norm", True), "add_final_layer_norm"),
        (lambda m: setattr(m.config, "activation_function", "gelu_fast"), "gelu_fast"),
        (
            lambda m: m.model.encoder.embed_positions.weight.data.normal_(),
            "model.encoder.embed_positions.weight",
        ),
        (lambda m: setattr(m.model.encoder, "layernorm_embedding", nn.LayerNorm(32)), "layernorm_embedding"),
    ],
    ids=["pre-LN", "final-layer-norm", "activation", "learned-positions", "embedding-layer-norm"],
)
def test_unrepresentable_checkpoints_are_refused_by_name(change: object, named: str) -> None:
    source = marian()
    change(source)
    with pytest.raises(ConversionError, match=named):
        convert_model(source)


@pytest.mark.parametrize("scale", [1.01, 2.0])
def test_a_checkpoint_whose_logits_the_conversion_does_not_reproduce_is_refused(scale: float) -> None:
    """The probe at the end of every conversion: a source model computing something the converter does
    not detect (here its encoder output scaled, as an unknown option would) is refused with the size
    of the difference, not saved as a model that translates differently."""
    source = marian(seed=1).eval()
    source.model.encoder.register_forward_hook(
        lambda module, args, output: output.__class__(last_hidden_state=output.last_hidden_state * scale)
    )
    with pytest.raises(ConversionError, match=r"logits differ from the original's by .*report it"):
        convert_model(source)


def test_other_architectures_and_unreachable_hub_ids_are_refused(tmp_path: Path) -> None:
    bart = BartForConditionalGeneration(
        BartConfig(
            vocab_size=40,
            d_model=16,
            encoder_layers=1,
            decoder_layers=1,
            encoder_ffn_dim=32,
            decoder_ffn_dim=32,
        )
    )
    with pytest.raises(ConversionError, match="MarianMTModel"):
        convert_model(bart)
    bart.save_pretrained(tmp_path / "bart")
    with pytest.raises(ConversionError, match="'bart'"):
        convert(str(tmp_path / "bart"), tmp_path / "out")
    # conftest sets HF_HUB_OFFLINE=1: an uncached Hub id cannot load, and the error says what to do.
    with pytest.raises(ConversionError, match="hf download"):
        convert("Helsinki-NLP/opus-mt-xx-not-cached", tmp_path / "out")
    marian().save_pretrained(tmp_path / "marian")
    with pytest.raises(ConversionError, match="--from fsmt"):
        convert(str(tmp_path / "marian"), tmp_path / "out", source_format="fsmt")


def test_arguments_take_from_as_the_source_format() -> None:
    parser = HfArgumentParser(ConversionArguments)
    (args,) = parser.parse_args_into_dataclasses(["--source", "m", "--output_dir", "o", "--from", "fsmt"])
    assert (args.source, args.output_dir, args.source_format) == ("m", "o", "fsmt")


@pytest.mark.slow
def test_script_converts_a_folder(tmp_path: Path) -> None:
    marian().save_pretrained(tmp_path / "marian")
    command = [sys.executable, str(ROOT / "scripts" / "convert.py"), "--source", str(tmp_path / "marian")]
    command += ["--output_dir", str(tmp_path / "out"), "--from", "marian"]
    subprocess.run(command, check=True, capture_output=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert (tmp_path / "out" / "model.safetensors").is_file()


@pytest.mark.parametrize("case", ["opus-mt", "separate-vocabularies"])
def test_resizing_the_vocabularies_does_what_marian_does(case: str) -> None:
    """resize_token_embeddings (and resize_decoder_token_embeddings for separate vocabularies) on a
    converted model and on the Marian it came from: the same sizes, the same logits bias (kept
    entries, new ones 0) and the same logits over the old vocabulary; the new rows are random."""
    source = marian(seed=len(case), **MARIAN_CASES[case])
    converted = convert_model(source).eval()
    old_source, old_target = converted.config.vocab_size, converted.config.target_vocab_size
    shared = converted.config.share_encoder_decoder_embeddings
    for model in (source, converted):
        model.resize_token_embeddings(old_source + 7)
        if not shared:
            model.resize_decoder_token_embeddings(old_target + 5)
    new_target = old_source + 7 if shared else old_target + 5
    assert (
        converted.config.vocab_size
        == source.config.vocab_size
        == source.get_input_embeddings().num_embeddings
    )
    assert converted.config.target_vocab_size == new_target == source.lm_head.weight.shape[0]
    assert converted.lm_head.weight.shape == source.lm_head.weight.shape
    assert torch.equal(converted.final_logits_bias, source.final_logits_bias)
    assert not converted.final_logits_bias[0, old_target:].any()
    batch = source_batch(source)
    decoder_input_ids = target_ids(converted.config)
    decoder_input_ids[decoder_input_ids >= old_target] = 3
    with torch.no_grad():
        expected = source(**batch, decoder_input_ids=decoder_input_ids, use_cache=False).logits
        actual = converted(**batch, decoder_input_ids=decoder_input_ids).logits
    assert actual.shape == expected.shape == (3, decoder_input_ids.shape[1], new_target)
    torch.testing.assert_close(actual[..., :old_target], expected[..., :old_target], atol=1e-5, rtol=0)


def test_resize_decoder_token_embeddings_refuses_a_shared_vocabulary() -> None:
    converted = convert_model(marian())
    with pytest.raises(ValueError, match="resize_token_embeddings"):
        converted.resize_decoder_token_embeddings(80)
