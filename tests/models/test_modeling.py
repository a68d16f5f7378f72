"""The model, tested by the properties the paper and transformers promise (not by snapshots)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import pytest
import torch
from helpers import TINY, run_clean, tiny_config, tiny_model
from torch import nn
from transformers import (
    AutoModel,
    AutoModelForSeq2SeqLM,
    DataCollatorForSeq2Seq,
    GenerationConfig,
    MarianConfig,
    MarianMTModel,
)

from hf_vanilla import (
    VanillaTransformerConfig,
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerModel,
)
from hf_vanilla.models.vanilla_transformer.generation_vanilla_transformer import _SourceLengthBound
from hf_vanilla.models.vanilla_transformer.modeling_vanilla_transformer import (
    VanillaTransformerDecoderLayer,
    VanillaTransformerEncoderLayer,
    sinusoidal_position_encoding,
)
from hf_vanilla.speed import fast_paths


def closed_form_pe(length: int, d_model: int) -> torch.Tensor:
    """§3.5 written out element by element, in float64."""
    pe = torch.empty(length, d_model, dtype=torch.float64)
    for pos in range(length):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            pe[pos, 2 * i] = math.sin(angle)
            pe[pos, 2 * i + 1] = math.cos(angle)
    return pe


# ------------------------------------------------------------------------------------------------
# The paper's structure
# ------------------------------------------------------------------------------------------------
def test_positional_encoding_closed_form_any_length() -> None:
    pe = sinusoidal_position_encoding(torch.arange(300), 32)
    torch.testing.assert_close(pe.double(), closed_form_pe(300, 32), atol=2e-5, rtol=0)


def test_embedding_output_is_scaled_embedding_plus_pe_after_from_pretrained(model, batch, tmp_path) -> None:
    """`encoder_hidden_states[0]` = √d_model · E[x] + PE, also for a model built on the meta device
    by `from_pretrained`, and for inputs longer than `max_position_embeddings`."""
    model.save_pretrained(tmp_path)
    loaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path).eval()
    length = loaded.config.max_position_embeddings + 36
    input_ids = torch.randint(4, 100, (1, length))
    out = loaded(input_ids=input_ids, decoder_input_ids=input_ids[:, :3], output_hidden_states=True)
    expected = loaded.model.shared.weight[input_ids[0]].double() * math.sqrt(32) + closed_form_pe(length, 32)
    torch.testing.assert_close(out.encoder_hidden_states[0][0].double(), expected, atol=1e-4, rtol=0)
    assert len(out.encoder_hidden_states) == 3 and len(out.decoder_hidden_states) == 3
    assert torch.isfinite(out.logits).all()


def test_layers_are_post_layer_norm() -> None:
    """§3.1: each sub-layer is LayerNorm(x + Sublayer(x)); there is no pre-LN."""
    torch.manual_seed(0)
    config = tiny_config()
    layer = VanillaTransformerEncoderLayer(config).eval()
    x = torch.randn(2, 5, 32)
    attn, _ = layer.self_attn(x)
    h = layer.self_attn_layer_norm(x + attn)
    expected = layer.final_layer_norm(h + layer.fc2(torch.relu(layer.fc1(h))))
    torch.testing.assert_close(layer(x)[0], expected)

    dec = VanillaTransformerDecoderLayer(config, layer_idx=0).eval()
    memory = torch.randn(2, 7, 32)
    self_out, _ = dec.self_attn(x)
    h = dec.self_attn_layer_norm(x + self_out)
    cross_out, _ = dec.encoder_attn(h, key_value_states=memory)
    h = dec.encoder_attn_layer_norm(h + cross_out)
    expected = dec.final_layer_norm(h + dec.fc2(torch.relu(dec.fc1(h))))
    torch.testing.assert_close(dec(x, memory)[0], expected)


def test_no_final_layer_norm_and_shared_weights(model) -> None:
    """No LayerNorm outside the layers (unlike pre-LN or nn.Transformer); one matrix for source
    embedding, target embedding and pre-softmax projection (§3.4)."""
    for stack in (model.model.encoder, model.model.decoder):
        norms = [name for name, module in stack.named_modules() if isinstance(module, nn.LayerNorm)]
        assert norms and all(name.startswith("layers.") for name in norms)
    shared = model.model.shared.weight
    assert model.lm_head.weight is shared
    assert (
        model.model.encoder.embed_tokens.weight is shared
        and model.model.decoder.embed_tokens.weight is shared
    )
    names = {name for name, _ in model.named_parameters()}
    assert not any("embed_positions" in name for name in names)  # the encoding is not a parameter


def test_attention_has_the_paper_projections(model) -> None:
    attn = model.model.decoder.layers[0].encoder_attn
    assert attn.num_heads == 4 and attn.head_dim == 8 and attn.scaling == pytest.approx(8**-0.5)
    for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj):
        assert proj.weight.shape == (32, 32) and proj.bias is None  # W^Q, W^K, W^V, W^O, no bias
    layer = model.model.encoder.layers[0]
    assert layer.fc1.weight.shape == (64, 32) and layer.fc1.bias is not None  # Eq. (2): W_1, b_1


def test_initialisation_is_the_documented_choice() -> None:
    model = tiny_model(vocab_size=4000, d_model=64)
    shared = model.model.shared.weight
    assert torch.all(shared[0] == 0)  # padding row
    assert shared[1:].std().item() == pytest.approx(64**-0.5, rel=0.05)
    fc1 = model.model.encoder.layers[0].fc1
    bound = math.sqrt(6 / (fc1.in_features + fc1.out_features))  # Xavier-uniform
    assert fc1.weight.abs().max().item() <= bound and fc1.weight.abs().max().item() > 0.9 * bound
    assert torch.all(fc1.bias == 0)
    ln = model.model.encoder.layers[0].final_layer_norm
    assert torch.all(ln.weight == 1) and torch.all(ln.bias == 0)


# ------------------------------------------------------------------------------------------------
# Masks and attention implementations
# ------------------------------------------------------------------------------------------------


def test_eager_equals_sdpa(batch, tmp_path) -> None:
    tiny_model().save_pretrained(tmp_path)
    logits = {}
    for impl in ("eager", "sdpa"):
        loaded = VanillaTransformerForConditionalGeneration.from_pretrained(
            tmp_path, attn_implementation=impl
        )
        assert loaded.config._attn_implementation == impl
        logits[impl] = loaded.eval()(**batch).logits
    torch.testing.assert_close(logits["eager"], logits["sdpa"], atol=1e-5, rtol=1e-5)


def test_output_attentions_under_default_sdpa(model, batch) -> None:
    assert model.config._attn_implementation == "sdpa"
    out = model(**batch, output_attentions=True)
    assert len(out.encoder_attentions) == len(out.decoder_attentions) == len(out.cross_attentions) == 2
    enc, dec, cross = out.encoder_attentions[0], out.decoder_attentions[0], out.cross_attentions[0]
    assert enc.shape == (2, 4, 9, 9) and dec.shape == (2, 4, 7, 7) and cross.shape == (2, 4, 7, 9)
    for weights in (enc, dec, cross):
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    assert torch.all(cross[1, :, :, 6:] == 0) and torch.all(enc[1, :, :6, 6:] == 0)  # padded keys
    assert torch.all(dec[0].triu(diagonal=1) == 0)  # causal
    without = model(**batch)
    torch.testing.assert_close(out.logits, without.logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fully_padded_rows_stay_finite(dtype: torch.dtype) -> None:
    model = tiny_model().to(dtype)
    input_ids = torch.tensor([[5, 6, 7, 2], [0, 0, 0, 0]])
    attention_mask = (input_ids != 0).long()
    decoder_input_ids = torch.tensor([[1, 8, 9], [0, 0, 0]])
    decoder_attention_mask = (decoder_input_ids != 0).long()
    for impl in ("sdpa", "eager"):
        model.config._attn_implementation = impl
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            output_attentions=impl == "eager",
        )
        assert torch.isfinite(out.logits).all(), (dtype, impl)


# ------------------------------------------------------------------------------------------------
# Cache and generation
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("grad", [False, True], ids=["inference", "with-gradients"])
def test_incremental_decoding_equals_full_forward(model, batch, grad: bool) -> None:
    """Token by token with the cache = one full forward. Without gradients the self-attention cache
    grows in place; with gradients (scheduled sampling, RL fine-tuning) each step's keys/values stay
    intact for the backward pass, which gives the full forward's gradients."""
    labels = batch["labels"].clamp(min=0)
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
    full = model(batch["input_ids"], batch["attention_mask"], decoder_input_ids=decoder_input_ids).logits
    full_grads = torch.autograd.grad(full.square().sum(), list(model.parameters()), allow_unused=True)
    with torch.set_grad_enabled(grad):
        encoder_outputs = model.get_encoder()(batch["input_ids"], batch["attention_mask"])
        cache = None
        steps = []
        for t in range(decoder_input_ids.shape[1]):
            out = model(
                attention_mask=batch["attention_mask"],
                encoder_outputs=encoder_outputs,
                decoder_input_ids=decoder_input_ids[:, t : t + 1],
                cache=cache,
                use_cache=True,
            )
            cache = out.cache
            steps.append(out.logits)
        incremental = torch.cat(steps, dim=1)
    assert cache.get_seq_length() == decoder_input_ids.shape[1]
    torch.testing.assert_close(incremental, full.detach(), atol=1e-5, rtol=1e-5)
    if grad:
        grads = torch.autograd.grad(incremental.square().sum(), list(model.parameters()), allow_unused=True)
        for got, expected in zip(grads, full_grads, strict=True):
            if expected is not None:
                torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_cross_attention_keys_and_values_are_computed_once(model, batch) -> None:
    calls = []
    handle = model.model.decoder.layers[0].encoder_attn.k_proj.register_forward_hook(
        lambda *args: calls.append(1)
    )
    try:
        model.generate(
            batch["input_ids"], attention_mask=batch["attention_mask"], num_beams=1, max_new_tokens=6
        )
    finally:
        handle.remove()
    assert len(calls) == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_beams": 1},
        {"num_beams": 3},
        {"num_beams": 1, "do_sample": True},
        {"num_beams": 3, "num_return_sequences": 2},
    ],
    ids=["greedy", "beam", "sampling", "beam-nbest"],
)
@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_static_cache_equals_dynamic_cache(model, batch, kwargs: dict, attn_implementation: str) -> None:
    """generate(cache_implementation="static"), the route to compiled decoding, gives the dynamic
    cache's tokens, with padding, with the §6.1 default bound and with explicit lengths."""
    model.config._attn_implementation = attn_implementation
    source = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    for lengths in ({"max_new_tokens": 12}, {}):
        torch.manual_seed(0)
        dynamic = model.generate(**source, **lengths, **kwargs)
        torch.manual_seed(0)
        static = model.generate(**source, **lengths, cache_implementation="static", **kwargs)
        assert torch.equal(static, dynamic), lengths


@pytest.fixture
def fast_paths_off() -> Iterator[None]:
    """Stock operators only, as on a GPU (the documented run-time switch)."""
    with fast_paths.disabled():
        yield


def _static_cache(model: VanillaTransformerForConditionalGeneration, source_length: int) -> object:
    from transformers.cache_utils import EncoderDecoderCache, StaticCache

    return EncoderDecoderCache(
        StaticCache(config=model.config, max_cache_len=16),
        StaticCache(config=model.config, max_cache_len=source_length),
    )


@pytest.mark.slow  # an inductor compile: tens of seconds on 2 cores
def test_compiled_decoding_step_has_no_graph_break_and_equals_the_full_forward(
    model, batch, fast_paths_off
) -> None:
    """torch.compile(model.forward, fullgraph=True) on a cached decoding step (a static cache): no graph
    break, so no host sync or data-dependent control flow on the GPU path (fast paths off)."""
    source = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    forward = torch.compile(model.forward, fullgraph=True)
    with torch.no_grad():
        encoder_outputs = model.get_encoder()(**source)
        cache = _static_cache(model, batch["input_ids"].shape[1])
        decoder_input_ids = torch.ones(2, 1, dtype=torch.long)
        step = {
            "encoder_outputs": encoder_outputs,
            "attention_mask": source["attention_mask"],
            "use_cache": True,
        }
        out = model(decoder_input_ids=decoder_input_ids, cache=cache, **step)  # the first step, eager
        for _ in range(3):
            next_ids = out.logits[:, -1].argmax(dim=-1, keepdim=True)
            decoder_input_ids = torch.cat([decoder_input_ids, next_ids], dim=1)
            out = forward(decoder_input_ids=next_ids, cache=cache, **step)
        full = model(**source, decoder_input_ids=decoder_input_ids)
    torch.testing.assert_close(out.logits[:, -1], full.logits[:, -1], atol=1e-5, rtol=1e-5)


@pytest.mark.slow  # an inductor compile: tens of seconds on 2 cores
def test_compiled_training_step_has_no_graph_break_and_equals_eager(batch, fast_paths_off) -> None:
    """torch.compile(model, fullgraph=True) of forward + backward with padding and labels (the GPU
    training path: fast paths off) compiles without a graph break and gives eager's loss and gradients."""
    model = tiny_model(dropout=0.0).train()
    compiled = torch.compile(model, fullgraph=True)
    results = []
    for run in (compiled, model):
        model.zero_grad(set_to_none=True)
        loss = run(**batch).loss
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (loss, grads), (expected_loss, expected_grads) = results
    torch.testing.assert_close(loss, expected_loss)
    for got, expected in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


#: benchmarks/experiments/early_stopping.py's tiny configuration.
TINY_EARLY_STOPPING = {
    "vocab_size": 100, "d_model": 32, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
    "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
}  # fmt: skip


@pytest.mark.parametrize("mode", ["greedy", "beam"])
def test_generate_with_cache_equals_without(model, batch, mode: str) -> None:
    kwargs = (
        {"num_beams": 1}
        if mode == "greedy"
        else {"num_beams": 3, "length_penalty": 0.6, "early_stopping": True}
    )
    source = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    with_cache = model.generate(**source, max_new_tokens=12, use_cache=True, **kwargs)
    without = model.generate(**source, max_new_tokens=12, use_cache=False, **kwargs)
    assert torch.equal(with_cache, without)


def test_the_default_early_stopping_never_finds_a_better_hypothesis_than_true() -> None:
    """§6.1's "terminate early when possible" is transformers' ``early_stopping="never"`` (stop when no
    running hypothesis can beat the finished ones), not ``True`` (stop once ``num_beams`` have
    finished). A case found by benchmarks/experiments/early_stopping.py (its model seed 2, source 2 of the first
    batch): ``True`` returns a 3-token hypothesis scoring -2.21; the default search goes on to a
    56-token one scoring -0.48 (log P / |Y|^0.6)."""
    torch.manual_seed(2)
    config = VanillaTransformerConfig(**TINY_EARLY_STOPPING, init_std=0.5, final_logits_bias=True)
    model = VanillaTransformerForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.final_logits_bias[0, config.eos_token_id] = 9.0  # hypotheses end at many lengths
    source = torch.tensor([[73, 46, 39, 89, 30, 74, 99, 2]])
    scores = {}
    with torch.no_grad():
        for name, kwargs in (("default", {}), ("True", {"early_stopping": True})):
            out = model.generate(input_ids=source, output_scores=True, return_dict_in_generate=True, **kwargs)
            scores[name] = (out.sequences_scores.item(), out.sequences.shape[1])
    assert scores["default"][0] > scores["True"][0] + 1.0, scores
    assert scores["default"][1] > scores["True"][1], scores


def test_generation_defaults_follow_section_6_1(model, batch) -> None:
    config = model.generation_config
    # "never": beam search stops only when no running hypothesis can beat the finished ones (§6.1).
    assert (config.num_beams, config.length_penalty, config.early_stopping) == (4, 0.6, "never")
    assert config.max_length is None and config.max_new_tokens is None and config.max_length_offset == 50
    assert config.decoder_start_token_id == 1 and config.eos_token_id == 2 and config.pad_token_id == 0
    # The random tiny model never ends a sentence by itself, so each row runs to its own bound:
    # source length + 50 tokens, </s> included.
    out = model.generate(batch["input_ids"], attention_mask=batch["attention_mask"], num_beams=1)
    lengths = batch["attention_mask"].sum(-1)  # 9 and 6
    assert out.shape[1] == 1 + int(lengths.max()) + 50  # never HF's silent 20-token cut
    assert 2 not in out[0, :-1].tolist() and out[0, -1] == 2
    second = out[1, 1:].tolist()
    assert second.index(2) == int(lengths[1]) + 50 - 1  # the 56th token of row 2 is the forced </s>
    # The same per-sentence bound when the encoder states are given instead of the source.
    encoder_outputs = model.get_encoder()(batch["input_ids"], batch["attention_mask"])
    again = model.generate(
        encoder_outputs=encoder_outputs, attention_mask=batch["attention_mask"], num_beams=1
    )
    assert torch.equal(again, out)


def _never_ends(model: VanillaTransformerForConditionalGeneration) -> torch.utils.hooks.RemovableHandle:
    """Ban </s> in the logits: every sentence then runs to the §6.1 bound, which forces it."""
    eos = model.config.eos_token_id
    return model.lm_head.register_forward_hook(
        lambda module, inputs, logits: logits.index_fill(-1, torch.tensor([eos]), -1e4)
    )


def _first_eos(sequences: torch.Tensor, eos: int = 2) -> list[int]:
    """Per row, how many tokens after the start token up to and including the first </s>."""
    return [row[1:].tolist().index(eos) + 1 for row in sequences]


def test_the_bound_survives_trainer_defaults_and_user_configs(model, batch, tmp_path) -> None:
    """source + max_length_offset per sentence on every call: through HF's max_length=20 written into
    the generation config (Seq2SeqTrainer does that), a user GenerationConfig without the key, and a
    saved and reloaded model; a user's own max_length / max_new_tokens caps it."""
    _never_ends(model)
    source = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    bounds = [9 + 50, 6 + 50]
    assert _first_eos(model.generate(**source, num_beams=1)) == bounds

    model.generation_config.update(**GenerationConfig._get_default_generation_params(), defaults_only=True)
    assert model.generation_config.max_length == 20  # what Seq2SeqTrainer.prediction_step leaves
    assert _first_eos(model.generate(**source, num_beams=1)) == bounds
    assert _first_eos(model.generate(**source, generation_config=GenerationConfig(num_beams=2))) == bounds
    assert _first_eos(model.generate(**source, num_beams=1, max_length_offset=3)) == [9 + 3, 6 + 3]
    with pytest.raises(ValueError, match="max_length_offset"):
        model.generate(**source, max_length_offset=-1)

    # A cap set by the user: for the whole batch, never longer than each sentence's bound.
    capped = GenerationConfig(num_beams=1, max_new_tokens=57)
    out = model.generate(**source, generation_config=capped)
    assert out.shape[1] == 1 + 57 and 2 not in out[0].tolist()  # cut at the cap, before its bound
    assert _first_eos(out[1:]) == [6 + 50]
    assert model.generate(**source, num_beams=1, max_length=20).shape[1] == 20  # explicit: a cap

    model.save_pretrained(tmp_path)
    reloaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert reloaded.generation_config.max_length == 20 and reloaded.generation_config.max_length_offset == 50
    _never_ends(reloaded)
    assert _first_eos(reloaded.generate(**source, num_beams=1)) == bounds
    reloaded.generation_config.max_length_offset = 10
    assert _first_eos(reloaded.generate(**source, num_beams=1)) == [9 + 10, 6 + 10]


def test_a_cap_that_ends_every_sentence_before_its_bound_runs_no_bound(model, batch, monkeypatch) -> None:
    """The §6.1 bound costs a logits-processor call per step: a max_new_tokens that stops every sentence
    before its bound (here 6 + 50 tokens for the shorter one) leaves it out; one that reaches it keeps it."""
    calls = []
    bound_call = _SourceLengthBound.__call__

    def counted(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        calls.append(input_ids.shape[1])
        return bound_call(self, input_ids, scores)

    monkeypatch.setattr(_SourceLengthBound, "__call__", counted)
    _never_ends(model)
    source = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    assert model.generate(**source, num_beams=1, max_new_tokens=55).shape[1] == 1 + 55 and calls == []
    assert _first_eos(model.generate(**source, num_beams=1, max_new_tokens=56)[1:]) == [6 + 50]
    assert len(calls) == 56


def test_beam_search_outputs_have_marians_shapes(model, batch) -> None:
    """generate(return_dict_in_generate, output_hidden_states, output_attentions) with beams: every
    tensor has the shape MarianMTModel of the same size gives (transformers 5.24): encoder states and
    attentions once per sentence (B, ...), decoder and cross-attention per hypothesis (B × beams, ...)."""
    config = MarianConfig(
        **TINY,
        pad_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=1,
        forced_eos_token_id=None,
    )
    config._attn_implementation = "eager"  # Marian's SDPA returns no attention weights
    torch.manual_seed(0)
    marian = MarianMTModel(config).eval()
    settings = {
        "num_beams": 3,
        "max_new_tokens": 4,
        "min_new_tokens": 4,  # both run the same number of steps
        "return_dict_in_generate": True,
        "output_hidden_states": True,
        "output_attentions": True,
        "output_scores": True,
    }
    source = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    ours, theirs = model.generate(**source, **settings), marian.generate(**source, **settings)

    def shapes(value: object) -> object:
        if isinstance(value, torch.Tensor):
            return tuple(value.shape)
        return [shapes(item) for item in value]

    fields = ["sequences", "sequences_scores", "scores", "beam_indices", "encoder_hidden_states"]
    fields += ["encoder_attentions", "decoder_hidden_states", "decoder_attentions", "cross_attentions"]
    for name in fields:
        assert shapes(getattr(ours, name)) == shapes(getattr(theirs, name)), name
    assert shapes(ours.encoder_hidden_states)[0] == (2, 9, 32)  # per sentence, not per hypothesis
    assert shapes(ours.cross_attentions)[0][0] == (2 * 3, 4, 1, 9)


def test_forced_end_keeps_the_real_end_score(model, batch) -> None:
    """At the §6.1 bound only </s> may follow, scored with its own log-probability (not 0), so a
    truncated hypothesis does not look better than it is in beam search."""
    source = batch["input_ids"][:1, :3]
    out = model.generate(source, num_beams=1, output_scores=True, return_dict_in_generate=True)
    assert out.sequences.shape[1] == 1 + 3 + 50 and out.sequences[0, -1] == 2
    assert 2 not in out.sequences[0, :-1].tolist()  # it ended at the bound, not by itself
    logits = model(source, decoder_input_ids=out.sequences[:, :-1]).logits[0, -1]
    assert out.scores[-1][0, 2] == pytest.approx(logits[2].item(), abs=1e-4)
    assert torch.isinf(out.scores[-1][0, 3:]).all()


@pytest.mark.parametrize("num_beams", [1, 3])
def test_the_bound_wins_over_a_longer_min_new_tokens(model, batch, num_beams: int) -> None:
    """min_new_tokens beyond source + 50 bans </s> where the bound forces it: the sentence still
    stops at the bound, and no score becomes NaN (an all -inf row)."""
    source = batch["input_ids"][:1, :3]
    out = model.generate(
        source,
        num_beams=num_beams,
        min_new_tokens=80,
        output_scores=True,
        return_dict_in_generate=True,
    )
    assert out.sequences.shape[1] <= 1 + 3 + 50
    assert not any(torch.isnan(scores).any() for scores in out.scores)
    if num_beams == 1:  # greedy: the bound's </s> is the only finite choice
        assert out.sequences.shape[1] == 1 + 3 + 50 and out.sequences[0, -1] == 2


def test_the_bound_forces_eos_only_in_rows_at_their_bound() -> None:
    """Two sentences × two beams, bound 3 + 2 tokens after a 1-token prompt: at decoder length 5 the
    first sentence's rows may only end (</s> keeps its score, or the lowest finite score where another
    processor banned it); the second sentence's rows are untouched; before any bound is reached the
    scores pass through unchanged (the same tensor, no full-vocabulary pass)."""
    bound = _SourceLengthBound(torch.tensor([3, 9]), start_length=1, eos_token_id=2, offset=2)
    scores = torch.randn(4, 10)
    scores[1, 2] = -math.inf
    assert bound(torch.zeros(4, 4, dtype=torch.long), scores) is scores
    out = bound(torch.zeros(4, 5, dtype=torch.long), scores.clone())
    assert out[0, 2] == scores[0, 2] and out[1, 2] == torch.finfo(scores.dtype).min
    others = [column for column in range(10) if column != 2]
    assert torch.isneginf(out[:2, others]).all()
    assert torch.equal(out[2:], scores[2:])


def test_sampling_is_reproducible(model, batch) -> None:
    source = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    torch.manual_seed(3)
    first = model.generate(**source, do_sample=True, num_beams=1, top_k=10, max_new_tokens=8)
    torch.manual_seed(3)
    second = model.generate(**source, do_sample=True, num_beams=1, top_k=10, max_new_tokens=8)
    assert torch.equal(first, second) and first.shape == (2, 9)


# ------------------------------------------------------------------------------------------------
# Loss
# ------------------------------------------------------------------------------------------------
def test_loss_uses_labels_as_given(model, batch) -> None:
    out = model(**batch)
    expected = nn.functional.cross_entropy(out.logits.reshape(-1, 100), batch["labels"].reshape(-1))
    torch.testing.assert_close(out.loss, expected)
    smoothed = tiny_model(label_smoothing=0.1)(**batch)
    expected = nn.functional.cross_entropy(
        smoothed.logits.reshape(-1, 100), batch["labels"].reshape(-1), label_smoothing=0.1
    )
    torch.testing.assert_close(smoothed.loss, expected)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_gradient_accumulation_equals_one_big_batch(label_smoothing: float) -> None:
    """One step on batch 8 = two accumulated steps on batch 4 when the Trainer passes
    `num_items_in_batch` (the label count over both micro-batches): the summed losses and the
    gradients, also for the label-smoothed loss (ε_ls = 0.1, §5.4)."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(4, 100, (8, 6), generator=generator)
    labels = torch.randint(4, 100, (8, 5), generator=generator)
    labels[::2, 3:] = -100  # unequal label counts per micro-batch
    labels[:4, 4] = -100  # and unequal counts between the two micro-batches (9 + 14 against 23)
    model = tiny_model(dropout=0.0, label_smoothing=label_smoothing)
    model.train()
    big_loss = model(input_ids=input_ids, labels=labels).loss
    big_loss.backward()
    big = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    total, accumulated = (labels != -100).sum(), torch.zeros(())
    for part in (slice(0, 4), slice(4, 8)):
        loss = model(input_ids=input_ids[part], labels=labels[part], num_items_in_batch=total).loss
        loss.backward()
        accumulated += loss.detach()
    torch.testing.assert_close(accumulated, big_loss.detach(), atol=0, rtol=1e-6)
    for g_big, p in zip(big, model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, g_big, atol=1e-6, rtol=1e-5)


def test_data_collator_builds_decoder_inputs(model, tokenizer) -> None:
    collator = DataCollatorForSeq2Seq(tokenizer, model=model)
    features = [
        {"input_ids": tokenizer("w1 w2 w3")["input_ids"], "labels": tokenizer("w4 w5")["input_ids"]},
        {"input_ids": tokenizer("w6")["input_ids"], "labels": tokenizer("w7 w8 w9 w10")["input_ids"]},
    ]
    batch = collator(features)
    assert batch["labels"][0].tolist() == [8, 9, 2, -100, -100]
    assert batch["decoder_input_ids"][0].tolist() == [1, 8, 9, 2, 0]
    assert model(**batch).loss.isfinite()


# ------------------------------------------------------------------------------------------------
# Bad input
# ------------------------------------------------------------------------------------------------
def test_token_ids_outside_the_vocabulary_give_a_clear_error(model) -> None:
    with pytest.raises(
        ValueError, match=r"token id 100, outside the vocabulary \[0, 100\).*resize_token_embeddings"
    ):
        model(input_ids=torch.tensor([[5, 100]]), decoder_input_ids=torch.tensor([[1]]))
    with pytest.raises(ValueError, match=r"decoder_input_ids.*token id -3"):
        model(input_ids=torch.tensor([[5, 6]]), decoder_input_ids=torch.tensor([[1, -3]]))


def test_empty_input_and_missing_decoder_inputs(model) -> None:
    with pytest.raises(ValueError, match="empty"):
        model(input_ids=torch.zeros(1, 0, dtype=torch.long), decoder_input_ids=torch.tensor([[1]]))
    with pytest.raises(ValueError, match="decoder_input_ids"):
        model.model(input_ids=torch.tensor([[5, 6]]))


# ------------------------------------------------------------------------------------------------
# HF integration
# ------------------------------------------------------------------------------------------------
def test_auto_classes(tmp_path) -> None:
    config = tiny_config()
    assert isinstance(AutoModel.from_config(config), VanillaTransformerModel)
    assert isinstance(AutoModelForSeq2SeqLM.from_config(config), VanillaTransformerForConditionalGeneration)
    tiny_model().save_pretrained(tmp_path)
    assert isinstance(
        AutoModelForSeq2SeqLM.from_pretrained(tmp_path), VanillaTransformerForConditionalGeneration
    )
    base = AutoModel.from_pretrained(tmp_path)
    assert isinstance(base, VanillaTransformerModel)
    full = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path)
    torch.testing.assert_close(base.shared.weight, full.model.shared.weight)


def test_save_load_is_exact(model, batch, tmp_path) -> None:
    before = model(**batch).logits
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists() and (tmp_path / "generation_config.json").exists()
    loaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert torch.equal(loaded(**batch).logits, before)
    assert loaded.lm_head.weight is loaded.model.shared.weight
    assert loaded.generation_config.num_beams == 4


def test_untied_output_projection_round_trips(batch, tmp_path) -> None:
    model = tiny_model(tie_word_embeddings=False)
    assert model.lm_head.weight is not model.model.shared.weight
    model.save_pretrained(tmp_path)
    loaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert loaded.lm_head.weight is not loaded.model.shared.weight
    assert torch.equal(loaded(**batch).logits, model(**batch).logits)


def test_resize_token_embeddings_keeps_tying(model, batch) -> None:
    model.resize_token_embeddings(120)
    assert model.config.vocab_size == 120
    assert model.lm_head.weight is model.model.shared.weight
    assert model.model.encoder.embed_tokens is model.model.shared is model.model.decoder.embed_tokens
    out = model(input_ids=torch.tensor([[110, 2]]), decoder_input_ids=torch.tensor([[1, 115]]))
    assert out.logits.shape == (1, 2, 120)


def test_resize_token_embeddings_resizes_an_untied_projection_and_the_logits_bias() -> None:
    model = tiny_model(tie_word_embeddings=False, final_logits_bias=True)
    with torch.no_grad():
        model.final_logits_bias.normal_()
    bias = model.final_logits_bias.clone()
    model.resize_token_embeddings(90)
    assert model.lm_head.weight.shape == (90, 32) and model.lm_head.weight is not model.model.shared.weight
    assert torch.equal(model.final_logits_bias, bias[:, :90])
    out = model(input_ids=torch.tensor([[80, 2]]), decoder_input_ids=torch.tensor([[1, 85]]))
    assert out.logits.shape == (1, 2, 90)


def test_gradient_checkpointing_gives_the_same_gradients(batch) -> None:
    grads = []
    for checkpointing in (False, True):
        model = tiny_model(dropout=0.0)
        model.train()
        if checkpointing:
            model.activation_checkpointing_enable()
        model(**batch).loss.backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)


def test_device_map_auto_places_layers(model, batch, tmp_path) -> None:
    model.save_pretrained(tmp_path)
    placed = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path, device_map="auto").eval()
    assert placed.lm_head.weight is placed.model.shared.weight
    torch.testing.assert_close(placed(**batch).logits, model(**batch).logits)


def test_config_is_validated_for_the_model() -> None:
    with pytest.raises(ValueError, match="`d_model`"):
        VanillaTransformerForConditionalGeneration(
            VanillaTransformerConfig(d_model=33, encoder_attention_heads=3)
        )


BLOCK_AND_LOAD = """
import sys
try:
    import hf_vanilla  # noqa: F401
    raise SystemExit("hf_vanilla should not be importable here")
except ModuleNotFoundError:
    pass
import torch
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM
torch.set_num_threads(1)  # as in the test process
folder = sys.argv[1]
config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
assert type(config).__name__ == "VanillaTransformerConfig"
base = AutoModel.from_pretrained(folder, trust_remote_code=True)
assert type(base).__name__ == "VanillaTransformerModel", type(base)
model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
assert "hf_vanilla" not in sys.modules
batch = torch.load(folder + "/batch.pt", weights_only=True)
out = model(**batch)
generated = model.generate(batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=5)
torch.save({"logits": out.logits, "generated": generated}, folder + "/remote.pt")
"""


def test_remote_code_loads_where_hf_vanilla_is_not_installed(model, batch, tmp_path) -> None:
    model.register_for_auto_class("AutoModelForSeq2SeqLM")
    try:
        model.save_pretrained(tmp_path)
    finally:
        type(model)._auto_class = None
    assert getattr(model.config, "auto_map", None) is None  # the in-memory config is left as it was
    assert type(model.config)._auto_class is None
    auto_map = json.loads((tmp_path / "config.json").read_text())["auto_map"]
    assert set(auto_map) == {"AutoConfig", "AutoModel", "AutoModelForSeq2SeqLM"}
    assert (tmp_path / "modeling_vanilla_transformer.py").exists()
    assert (tmp_path / "configuration_vanilla_transformer.py").exists()
    torch.save(batch, tmp_path / "batch.pt")
    run_clean(BLOCK_AND_LOAD, tmp_path, str(tmp_path))  # hf_vanilla blocked
    remote = torch.load(tmp_path / "remote.pt", weights_only=True)
    torch.testing.assert_close(remote["logits"], model(**batch).logits, atol=1e-6, rtol=0)
    local = model.generate(batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=5)
    assert torch.equal(remote["generated"], local)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_generate_continued_from_its_cache_equals_one_longer_call(batch, seed: int) -> None:
    """generate(decoder_input_ids=first.sequences, cache=first.cache) feeds only the new token (the
    cached positions are not fed again), with a padded source row too."""
    model = tiny_model(seed=seed)
    source = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    greedy = {"num_beams": 1, "do_sample": False}
    first = model.generate(
        **source, max_new_tokens=4, min_new_tokens=4, return_dict_in_generate=True, **greedy
    )
    continued = model.generate(
        **source,
        decoder_input_ids=first.sequences,
        cache=first.cache,
        max_new_tokens=4,
        min_new_tokens=4,
        **greedy,
    )
    assert torch.equal(continued, model.generate(**source, max_new_tokens=8, min_new_tokens=8, **greedy))
