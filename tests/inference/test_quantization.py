"""Reduced-precision inference through the ecosystem's routes (hf_vanilla/inference/quantization.py): each loads,
generates, and keeps the greedy tokens of the fp32 model on a tiny model trained to copy its input.
(``quantize_dynamic`` alone: tests/models/test_fast_paths.py.)"""

from __future__ import annotations

import copy
from pathlib import Path
from types import ModuleType

import pytest
import torch
from helpers import copy_task, tiny_model
from tokenizers import Tokenizer, models, pre_tokenizers
from torch import nn
from torch.nn import functional as F
from transformers import AutoModelForSeq2SeqLM, PreTrainedTokenizerFast

from hf_vanilla import VanillaTransformerForConditionalGeneration
from hf_vanilla.inference.loading import load_model_and_tokenizer
from hf_vanilla.inference.options import InferenceModelArguments
from hf_vanilla.inference.quantization import ROUTES, check_route, from_pretrained_kwargs, quantize_loaded
from hf_vanilla.speed import fast_paths as fast_paths

TORCHAO_ROUTES = ("torchao-int8-weight", "torchao-int8-dynamic")


def _torchao() -> ModuleType:
    """torchao, or a skip of only the test that needs it (the other routes run without it)."""
    return pytest.importorskip("torchao", reason="the torchao routes need pip install 'hf_vanilla[quant]'")


@pytest.fixture(scope="module")
def copy_folder(copy_model: VanillaTransformerForConditionalGeneration, tmp_path_factory) -> Path:
    """The copy model saved with a word-level tokenizer of its 20 tokens."""
    folder = tmp_path_factory.mktemp("copy_model")
    copy_model.save_pretrained(folder)
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3} | {f"w{i}": i for i in range(4, 20)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    ).save_pretrained(folder)
    return folder


def _greedy(model: nn.Module, source: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(source, num_beams=1, max_new_tokens=8)


def _agreement(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """(share of identical sentences, share of identical tokens); outputs that stopped earlier are
    padded with -1, which matches no token."""
    width = max(a.shape[1], b.shape[1])
    a, b = (F.pad(x, (0, width - x.shape[1]), value=-1) for x in (a, b))
    same = a == b
    return same.all(dim=1).float().mean().item(), same.float().mean().item()


SOURCE, _ = copy_task(torch.Generator().manual_seed(1), 64)


@pytest.mark.parametrize("route", TORCHAO_ROUTES)
def test_torchao_config_quantizes_every_projection_and_keeps_greedy_tokens(
    copy_model, copy_folder, route, tmp_path
) -> None:
    torchao = _torchao()
    kwargs = from_pretrained_kwargs(route)
    quantized = AutoModelForSeq2SeqLM.from_pretrained(copy_folder, **kwargs)
    linears = {name: module for name, module in quantized.named_modules() if type(module) is nn.Linear}
    assert len(linears) == 2 * (4 + 2) + 2 * (8 + 2) + 1  # attention projections, FFNs, lm_head
    for name, module in linears.items():
        # transformers leaves the output projection (tied to the embeddings, §3.4) unquantized
        expected = nn.Parameter if name == "lm_head" else torchao.quantization.Int8Tensor
        assert type(module.weight) is expected, name
    fp32 = _greedy(copy_model, SOURCE)
    assert (fp32[:, 1:8] == SOURCE).all(dim=1).float().mean() >= 0.8  # the model copies
    sentences, tokens = _agreement(_greedy(quantized, SOURCE), fp32)
    # Measured: 64 of 64 sentences identical with either scheme.
    assert sentences >= 0.95 and tokens >= 0.99
    # A quantized model saves and loads as such (no quantization_config needed to load it).
    quantized.save_pretrained(tmp_path)
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    assert type(reloaded.model.decoder.layers[0].fc1.weight) is torchao.quantization.Int8Tensor
    assert torch.equal(_greedy(reloaded, SOURCE), _greedy(quantized, SOURCE))


def test_a_torchao_weight_takes_the_stock_linear_not_the_onednn_fast_path(monkeypatch) -> None:
    """torchao keeps the ``nn.Linear`` and swaps its weight for a tensor subclass: the fast path must
    call the module (oneDNN has no kernel for the subclass)."""
    torchao = _torchao()
    monkeypatch.setattr(fast_paths, "ONEDNN_LINEAR_CPU", True)  # the CPU where the fast path runs
    layer = nn.Linear(512, 640)  # over the oneDNN threshold
    torchao.quantization.quantize_(layer, torchao.quantization.Int8WeightOnlyConfig())
    x = torch.randn(2, 3, 512)
    with torch.no_grad():
        assert torch.equal(fast_paths.linear(layer, x), layer(x))


def test_bf16_weights_and_cpu_autocast_keep_greedy_tokens(copy_model, copy_folder) -> None:
    """bf16 weights (``dtype=torch.bfloat16``) and fp32 weights under CPU autocast both run (on any CPU:
    without AVX-512-BF16 or AMX oneDNN converts to fp32 and back) and keep the greedy tokens."""
    fp32 = _greedy(copy_model, SOURCE)
    bf16 = AutoModelForSeq2SeqLM.from_pretrained(copy_folder, **from_pretrained_kwargs("bf16"))
    assert bf16.model.decoder.layers[0].fc1.weight.dtype == torch.bfloat16
    with torch.no_grad():
        assert bf16(input_ids=SOURCE, decoder_input_ids=SOURCE).logits.dtype == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = _greedy(copy_model, SOURCE)
    for tokens in (_greedy(bf16, SOURCE), autocast):
        sentences, same_tokens = _agreement(tokens, fp32)
        assert sentences >= 0.95 and same_tokens >= 0.99  # measured: 64 of 64 identical


@pytest.mark.parametrize("route", ROUTES)
def test_every_route_loads_through_the_command_line_arguments(copy_model, copy_folder, route) -> None:
    """``--quantization`` of the translation and evaluation commands (``ModelArguments``): the loaded
    model is the route's (its weights' type or dtype; an fp32 model would agree with itself) and keeps
    the fp32 greedy tokens."""
    if route in TORCHAO_ROUTES:
        _torchao()
    model, _ = load_model_and_tokenizer(
        InferenceModelArguments(model_name_or_path=str(copy_folder), device="cpu", quantization=route)
    )
    fc1, lm_head = model.model.encoder.layers[0].fc1, model.lm_head
    if route == "dynamic-int8":
        assert isinstance(fc1, torch.ao.nn.quantized.dynamic.Linear)
        assert isinstance(lm_head, torch.ao.nn.quantized.dynamic.Linear)
    elif route in TORCHAO_ROUTES:
        assert type(fc1.weight).__name__ == "Int8Tensor" and type(lm_head) is nn.Linear
    else:
        assert type(fc1) is nn.Linear and type(fc1.weight) is nn.Parameter
        assert fc1.weight.dtype == (torch.bfloat16 if route == "bf16" else torch.float32)
    fp32 = _greedy(copy_model, SOURCE)
    assert _agreement(_greedy(model, SOURCE), fp32)[0] >= 0.95


def test_quantize_loaded_is_quantize_dynamic_and_unknown_routes_are_refused(copy_model) -> None:
    model = quantize_loaded(copy.deepcopy(copy_model), "dynamic-int8")
    assert isinstance(model.model.encoder.layers[0].fc1, torch.ao.nn.quantized.dynamic.Linear)
    with pytest.raises(ValueError, match="choose one of none, dynamic-int8"):
        check_route("int4")
    with pytest.raises(ValueError, match="CPU only"):
        check_route("dynamic-int8", "cuda")


def test_an_untrained_model_disagrees_so_the_agreement_checks_can_fail(copy_model) -> None:
    untrained = tiny_model(vocab_size=20, d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128)
    assert _agreement(_greedy(untrained, SOURCE), _greedy(copy_model, SOURCE))[0] < 0.5
