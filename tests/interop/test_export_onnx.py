"""torch.export and ONNX: the exported encoder and cached decoder step equal the eager model,
greedy decoding with ONNX Runtime gives the tokens of generate(num_beams=1), and generate() over the
ONNX graphs gives the PyTorch model's tokens (greedy, beam search, sampling with a seed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import tiny_model

from hf_vanilla.data.tokenization import train_bpe_tokenizer
from hf_vanilla.hub.folder import save_model_folder
from hf_vanilla.interop.export_onnx import (
    DECODER_FILE,
    ENCODER_FILE,
    DecoderStepWithPast,
    EncoderWithFirstStep,
    export_programs,
    greedy_generate,
    load_onnx_sessions,
)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Three sentences of 7 tokens, the second padded after 5: other shapes than the export's example."""
    input_ids = torch.randint(4, 100, (3, 7), generator=torch.Generator().manual_seed(5))
    input_ids[:, -1] = 2
    attention_mask = torch.ones_like(input_ids)
    input_ids[1, 4], input_ids[1, 5:], attention_mask[1, 5:] = 2, 0, 0
    return input_ids, attention_mask


@pytest.mark.slow  # torch.export's graph capture (dynamo), as the compile checks
def test_torch_export_equals_eager_and_the_full_forward() -> None:
    model = tiny_model()
    encoder_program, decoder_program = export_programs(model)
    input_ids, attention_mask = _batch()
    with torch.no_grad():
        eager = EncoderWithFirstStep(model)(input_ids, attention_mask)
        exported = encoder_program.module()(input_ids, attention_mask)
        for got, want in zip(exported, eager, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)

        first = eager[0].argmax(-1, keepdim=True)  # (B, 1)
        eager_step = DecoderStepWithPast(model)(first, attention_mask, *eager[1:])
        exported_step = decoder_program.module()(first, attention_mask, *eager[1:])
        for got, want in zip(exported_step, eager_step, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
        assert exported_step[1].shape[2] == 2  # the self-attention cache grew by one position

        start = torch.full_like(first, model.config.decoder_start_token_id)
        full = model(input_ids, attention_mask=attention_mask, decoder_input_ids=torch.cat([start, first], 1))
    torch.testing.assert_close(exported[0], full.logits[:, 0], rtol=0, atol=1e-5)
    torch.testing.assert_close(exported_step[0], full.logits[:, 1], rtol=0, atol=1e-5)


def test_export_refuses_a_training_model() -> None:
    with pytest.raises(ValueError, match="eval"):
        export_programs(tiny_model().train())


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny model folder and its ONNX export, written by the command (its tests: the slow tier)."""
    pytest.importorskip(
        "onnxruntime", reason="the ONNX route needs the `onnx` extra: pip install -e '.[onnx]'"
    )
    from hf_vanilla.cli.export_onnx import main

    tmp = tmp_path_factory.mktemp("onnx")
    tokenizer = train_bpe_tokenizer(["x"], vocab_size=300)
    folder = save_model_folder(tiny_model(seed=1, vocab_size=len(tokenizer)), tokenizer, tmp / "model")
    assert main(["--model_dir", str(folder), "--output_dir", str(tmp / "onnx")]) == 0
    return folder, tmp / "onnx"


@pytest.mark.slow  # the ONNX export (torch's dynamo exporter): tens of seconds
def test_onnx_runtime_greedy_equals_generate(exported: tuple[Path, Path]) -> None:
    from transformers import AutoModelForSeq2SeqLM

    folder, onnx_dir = exported
    assert {ENCODER_FILE, DECODER_FILE, "config.json", "tokenizer.json"} <= {
        p.name for p in onnx_dir.iterdir()
    }
    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    input_ids, attention_mask = _batch()
    config = model.config
    with torch.no_grad():
        want = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            num_beams=1,
            do_sample=False,
            max_new_tokens=12,
        )
    got = greedy_generate(
        load_onnx_sessions(onnx_dir),
        input_ids.numpy(),
        attention_mask.numpy(),
        max_new_tokens=12,
        decoder_start_token_id=config.decoder_start_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    np.testing.assert_array_equal(got, want.numpy())


@pytest.mark.slow  # the ONNX export (torch's dynamo exporter): tens of seconds
def test_export_command_keeps_an_existing_output(exported: tuple[Path, Path], capsys) -> None:
    from hf_vanilla.cli.export_onnx import main

    folder, onnx_dir = exported
    before = (onnx_dir / ENCODER_FILE).stat().st_mtime_ns
    assert main(["--model_dir", str(folder), "--output_dir", str(onnx_dir)]) == 1
    assert "--overwrite" in capsys.readouterr().err
    assert (onnx_dir / ENCODER_FILE).stat().st_mtime_ns == before


def _pytorch_and_onnx(exported: tuple[Path, Path]) -> tuple[torch.nn.Module, torch.nn.Module]:
    from transformers import AutoModelForSeq2SeqLM

    from hf_vanilla.interop.onnx_generation import OnnxVanillaTransformerForConditionalGeneration

    folder, onnx_dir = exported
    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    return model, OnnxVanillaTransformerForConditionalGeneration.from_pretrained(onnx_dir, intra_op_threads=1)


@pytest.mark.slow  # the ONNX export (torch's dynamo exporter): tens of seconds
def test_onnx_generate_equals_pytorch_greedy_and_beam(exported: tuple[Path, Path]) -> None:
    model, onnx_model = _pytorch_and_onnx(exported)
    config = onnx_model.generation_config  # the paper's decoding, as the PyTorch model's (§6.1)
    assert (config.num_beams, config.length_penalty, config.early_stopping) == (4, 0.6, "never")
    input_ids, attention_mask = _batch()
    prompt = torch.tensor([[model.config.decoder_start_token_id, 7, 9]]).repeat(3, 1)  # a forced prefix
    # greedy; beam 4 (1 and 2 best); greedy and beam 4 from the prefix
    for settings in (
        {"num_beams": 1},
        {},
        {"num_return_sequences": 2},
        {"num_beams": 1, "decoder_input_ids": prompt},
        {"decoder_input_ids": prompt},
    ):
        want = model.generate(input_ids=input_ids, attention_mask=attention_mask, **settings)
        got = onnx_model.generate(input_ids=input_ids, attention_mask=attention_mask, **settings)
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=f"generate({settings})")


@pytest.mark.slow  # the ONNX export (torch's dynamo exporter): tens of seconds
def test_onnx_generate_samples_as_pytorch_with_a_seed(exported: tuple[Path, Path]) -> None:
    model, onnx_model = _pytorch_and_onnx(exported)
    input_ids, attention_mask = _batch()
    outputs = []
    for generator in (model, onnx_model, onnx_model):
        torch.manual_seed(3)
        outputs.append(
            generator.generate(
                input_ids=input_ids, attention_mask=attention_mask, do_sample=True, num_beams=1, top_k=0
            )
        )
    torch.testing.assert_close(outputs[1], outputs[0], rtol=0, atol=0)
    torch.testing.assert_close(outputs[2], outputs[0], rtol=0, atol=0)
    greedy = onnx_model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=1)
    assert not torch.equal(outputs[0], greedy)  # it did sample


@pytest.mark.slow  # the ONNX export (torch's dynamo exporter): tens of seconds
def test_onnx_forward_refuses_a_prompt_without_the_start_token(exported: tuple[Path, Path]) -> None:
    _, onnx_model = _pytorch_and_onnx(exported)
    input_ids, attention_mask = _batch()
    encoder_outputs = onnx_model.get_encoder()(input_ids, attention_mask)
    prompt = torch.full((3, 1), onnx_model.config.decoder_start_token_id + 5)
    with pytest.raises(ValueError, match="decoder start token"):
        onnx_model(decoder_input_ids=prompt, encoder_outputs=encoder_outputs, attention_mask=attention_mask)


def test_onnx_model_refuses_a_folder_without_the_graphs(tmp_path: Path) -> None:
    pytest.importorskip(
        "onnxruntime", reason="the ONNX route needs the `onnx` extra: pip install -e '.[onnx]'"
    )
    from hf_vanilla.interop.onnx_generation import OnnxVanillaTransformerForConditionalGeneration

    tiny_model().config.save_pretrained(tmp_path)  # a model folder's config, but no graphs
    with pytest.raises(OSError, match=f"holds no {ENCODER_FILE} or {DECODER_FILE}: .*hf-vanilla-export-onnx"):
        OnnxVanillaTransformerForConditionalGeneration.from_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]
