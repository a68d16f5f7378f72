"""The CPU fast paths (hf_vanilla/speed/fast_paths.py): each computes what its stock fallback computes, and
each is invisible to the tools users combine a model with (TorchScript, autocast, dynamic
quantization, accelerate hooks, module hooks, torch.func, deepcopy/pickle, other dtypes, compile)."""

from __future__ import annotations

import copy
import importlib.util
import math
import pickle
import sys
from collections.abc import Callable

import pytest
import torch
from helpers import copy_task, tiny_model
from torch import nn
from torch.nn import functional as F

from hf_vanilla import VanillaTransformerForConditionalGeneration
from hf_vanilla.models.vanilla_transformer import modeling_vanilla_transformer as modeling_vanilla_transformer
from hf_vanilla.speed import fast_paths as fast_paths


def _ran_onednn(fn: Callable[[], object]) -> bool:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return any("linear_pointwise" in event.name for event in prof.events())


@pytest.mark.skipif(not fast_paths._ONEDNN_LINEAR, reason="this torch build has no oneDNN")
def test_linear_is_f_linear_with_onednn_in_cpu_inference(monkeypatch) -> None:
    monkeypatch.setattr(fast_paths, "ONEDNN_LINEAR_CPU", True)  # as on an AMD CPU, whatever this one is
    torch.manual_seed(0)
    layer = nn.Linear(512, 640)  # 327,680 weights: over the threshold
    x = torch.randn(3, 5, 1024)[..., ::2]  # not contiguous
    expected = F.linear(x, layer.weight, layer.bias)
    with torch.no_grad():
        assert _ran_onednn(lambda: fast_paths.linear(layer, x))
        torch.testing.assert_close(fast_paths.linear(layer, x), expected, rtol=1e-5, atol=1e-5)
        half = copy.deepcopy(layer).bfloat16()
        assert not _ran_onednn(lambda: fast_paths.linear(half, x.bfloat16()))  # other dtypes: F.linear
    assert torch.equal(fast_paths.linear(layer, x), expected) and not _ran_onednn(
        lambda: fast_paths.linear(layer, x)
    )  # autograd: F.linear
    small = nn.Linear(32, 64)
    with torch.no_grad():
        assert not _ran_onednn(lambda: fast_paths.linear(small, x[..., :32]))
        assert torch.equal(
            fast_paths.linear(small, x[..., :32]), F.linear(x[..., :32], small.weight, small.bias)
        )
    monkeypatch.setattr(fast_paths, "ONEDNN_LINEAR_CPU", False)  # an Intel CPU: MKL's F.linear is faster
    with torch.no_grad():
        assert not _ran_onednn(lambda: fast_paths.linear(layer, x))
        assert torch.equal(fast_paths.linear(layer, x), expected)


def test_onednn_linear_is_taken_on_amd_cpus_only() -> None:
    """MKL (``F.linear``'s BLAS) runs its fast code on Intel CPUs; oneDNN was measured faster on AMD's."""
    assert fast_paths.prefers_onednn_linear("AuthenticAMD")
    assert fast_paths.prefers_onednn_linear("AMD64 Family 25 Model 33 Stepping 0, AuthenticAMD")  # Windows
    assert not fast_paths.prefers_onednn_linear("GenuineIntel")
    assert not fast_paths.prefers_onednn_linear("Intel64 Family 6 Model 85 Stepping 7, GenuineIntel")
    assert not fast_paths.prefers_onednn_linear("")  # unknown (e.g. an ARM machine): F.linear
    vendor = fast_paths.cpu_vendor()
    assert isinstance(vendor, str)
    assert fast_paths.prefers_onednn_linear(vendor) == fast_paths.ONEDNN_LINEAR_CPU


@pytest.mark.skipif(not fast_paths._ONEDNN_LINEAR, reason="this torch build has no oneDNN")
def test_generation_through_onednn_equals_generation_through_f_linear(batch, monkeypatch) -> None:
    monkeypatch.setattr(fast_paths, "ONEDNN_LINEAR_CPU", True)
    model = tiny_model(
        encoder_ffn_dim=8192, decoder_ffn_dim=8192
    )  # 32 × 8192 = 2^18 weights: at the threshold
    source = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    with torch.no_grad():
        assert _ran_onednn(lambda: model(**batch))
        logits = model(**batch).logits
        greedy = model.generate(**source, num_beams=1, max_new_tokens=10)
        beam = model.generate(**source, num_beams=3, max_new_tokens=10)
    monkeypatch.setattr(fast_paths, "ONEDNN_MIN_WEIGHT_ELEMENTS", float("inf"))
    with torch.no_grad():
        assert not _ran_onednn(lambda: model(**batch))
        torch.testing.assert_close(model(**batch).logits, logits, rtol=1e-5, atol=1e-5)
        assert torch.equal(model.generate(**source, num_beams=1, max_new_tokens=10), greedy)
        assert torch.equal(model.generate(**source, num_beams=3, max_new_tokens=10), beam)


def test_every_linear_of_an_inference_forward_is_offered_to_the_fast_path(batch, monkeypatch) -> None:
    """The output projection too: it is the largest matrix a decoding step reads (a refactor once left
    it on F.linear, 6 ms of a 16 ms greedy step at base size). The layers stay ``nn.Linear``."""
    model = tiny_model()
    offered = []
    original = fast_paths.linear

    def spy(module: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
        offered.append(module)
        return original(module, hidden_states)

    monkeypatch.setattr(fast_paths, "linear", spy)
    decoder_input_ids = batch["labels"].clamp(min=0)
    with torch.no_grad():
        model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            decoder_input_ids=decoder_input_ids,
        )
    linears = {id(module) for module in model.modules() if type(module) is nn.Linear}
    assert len(linears) == sum(isinstance(module, nn.Linear) for module in model.modules())
    assert {id(module) for module in offered} == linears
    assert any(module is model.lm_head for module in offered)

    untied = tiny_model(tie_word_embeddings=False)  # resizing gives it a new output projection
    untied.resize_token_embeddings(104)
    offered.clear()
    with torch.no_grad():
        untied(input_ids=batch["input_ids"], decoder_input_ids=decoder_input_ids)
    assert any(module is untied.lm_head for module in offered)


def test_attention_gate_picks_matrix_products_only_for_many_rows_of_a_decoding_step() -> None:
    model = tiny_model()  # 4 heads
    self_attn = model.model.decoder.layers[0].self_attn
    cross_attn = model.model.decoder.layers[0].encoder_attn

    def eager(*args: object, **kwargs: object) -> None:
        return None

    def flash(*args: object, **kwargs: object) -> None:  # another kernel, e.g. one the user registered
        return None

    def pick(module: nn.Module, query: torch.Tensor, mask: torch.Tensor | None = None) -> Callable:
        return fast_paths.attention_interface(fast_paths.sdpa_attention_forward, eager, module, query, mask)

    step = torch.randn(32, 4, 1, 8)  # 32 hypotheses × 4 heads × 1 query = 128 rows
    with torch.no_grad():
        assert pick(self_attn, step) is eager
        assert pick(cross_attn, torch.randn(8, 4, 4, 8)) is eager  # 8 sentences × 4 grouped beams
        assert pick(self_attn, step[:16]) is fast_paths.sdpa_attention_forward  # 64 rows: SDPA is faster
        assert pick(cross_attn, torch.randn(8, 4, 16, 8)) is fast_paths.sdpa_attention_forward  # not a step
        two_queries = torch.randn(32, 4, 2, 8)  # causal with no mask: only SDPA's is_causal masks it
        assert pick(self_attn, two_queries) is fast_paths.sdpa_attention_forward
        assert pick(self_attn, two_queries, torch.ones(1, 1, 2, 2, dtype=torch.bool)) is eager
        assert pick(self_attn, step.bfloat16()) is fast_paths.sdpa_attention_forward
        assert fast_paths.attention_interface(flash, eager, self_attn, step, None) is flash  # not SDPA
        model.train()
        assert pick(self_attn, step) is fast_paths.sdpa_attention_forward  # attention dropout: SDPA's
        model.eval()
    assert pick(self_attn, step) is fast_paths.sdpa_attention_forward  # autograd


@pytest.mark.parametrize("num_beams", [1, 4])
def test_decoding_attention_through_matrix_products_equals_sdpa(monkeypatch, num_beams: int) -> None:
    model = tiny_model()  # 4 heads: 32 hypotheses give 128 rows per decoding step
    generator = torch.Generator().manual_seed(5)
    source = torch.randint(4, 100, (32 // num_beams, 9), generator=generator)
    mask = torch.ones_like(source)
    source[1, 5:], mask[1, 5:] = 0, 0
    calls = _record_fast_paths(monkeypatch)
    options = dict(num_beams=num_beams, max_new_tokens=10, output_scores=True, return_dict_in_generate=True)
    with torch.no_grad():
        fast = model.generate(source, attention_mask=mask, **options)
        assert "attention" in calls
        monkeypatch.setattr(fast_paths, "MATMUL_ATTENTION_MIN_ROWS", float("inf"))
        calls.clear()
        plain = model.generate(source, attention_mask=mask, **options)
        assert "attention" not in calls
    assert torch.equal(fast.sequences, plain.sequences)
    for a, b in zip(fast.scores, plain.scores, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------
# Training-step kernels: the same function as the plain operators
# ------------------------------------------------------------------------------------------------
def _reference_linear_loss(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = F.linear(hidden, weight, bias)
    loss = F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum", label_smoothing=eps)
    return loss, logits


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("logits_used", [False, True])
def test_fused_output_projection_and_loss_equal_f_linear_then_cross_entropy(
    eps: float, with_bias: bool, logits_used: bool, monkeypatch
) -> None:
    """Loss, logits and every gradient equal F.linear → F.cross_entropy, with ignored rows, several
    vocabulary blocks and a ragged last one, and with a second loss on the returned logits."""
    # log-sum-exp one row at a time; the backward in vocabulary blocks of 1024, 1024 and 452 words
    monkeypatch.setattr(fast_paths, "_LOSS_BLOCK_ELEMENTS", 7 * 37)
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(37, 16, generator=generator, dtype=torch.float64)
    weight = torch.randn(2500, 16, generator=generator, dtype=torch.float64)
    bias = torch.randn(2500, generator=generator, dtype=torch.float64) if with_bias else None
    labels = torch.randint(0, 2500, (37,), generator=generator)
    labels[[0, 5, 36]] = -100
    other = torch.randn(37, 2500, generator=generator, dtype=torch.float64)  # a second loss's weights

    def run(fused: bool) -> tuple[torch.Tensor, ...]:
        leaves = [t.clone().requires_grad_() for t in (hidden, weight) + ((bias,) if with_bias else ())]
        h, w, b = leaves[0], leaves[1], leaves[2] if with_bias else None
        if fused:
            loss, logits, _ = fast_paths._LinearSmoothedCrossEntropySum.apply(h, w, b, labels, eps)
        else:
            loss, logits = _reference_linear_loss(h, w, b, labels, eps)
        total = loss + (logits * other).sum() if logits_used else loss
        total.backward()
        return (loss.detach(), logits.detach(), *(leaf.grad for leaf in leaves))

    for got, expected in zip(run(fused=True), run(fused=False), strict=True):
        torch.testing.assert_close(got, expected)


def test_blockwise_logsumexp_equals_torch(monkeypatch) -> None:
    monkeypatch.setattr(fast_paths, "_LOSS_BLOCK_ELEMENTS", 3 * 50)  # blocks of 3 rows, the last one of 1
    logits = torch.randn(10, 50) * 30
    logits[4] = -math.inf
    torch.testing.assert_close(fast_paths._logsumexp_rows(logits), torch.logsumexp(logits, dim=-1))


@pytest.mark.parametrize("final_logits_bias", [False, True])
def test_training_step_through_the_fused_kernels_equals_the_plain_path(
    batch, final_logits_bias: bool, monkeypatch
) -> None:
    """In CPU fp32 training the model runs the fused projection + loss and looks the source and target
    up in one call; loss, logits and every parameter's gradient equal the plain path's."""
    model = tiny_model(dropout=0.0, label_smoothing=0.1, final_logits_bias=final_logits_bias)
    if final_logits_bias:
        model.final_logits_bias.normal_()
    model.train()
    calls = []
    original = fast_paths._LinearSmoothedCrossEntropySum.forward
    monkeypatch.setattr(
        fast_paths._LinearSmoothedCrossEntropySum,
        "forward",
        staticmethod(lambda *args: calls.append(1) or original(*args)),
    )

    lookups = []
    embed_both = model._embed_both
    monkeypatch.setattr(model, "_embed_both", lambda *args: lookups.append(1) or embed_both(*args))

    def step(**inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        out = model(**inputs, attention_mask=batch["attention_mask"], labels=batch["labels"])
        out.loss.backward()
        return out.loss.detach(), out.logits.detach(), [p.grad.clone() for p in model.parameters()]

    fused = step(input_ids=batch["input_ids"])
    assert calls == [1] and lookups == [1]
    # The plain path: F.linear + F.cross_entropy, and two separate embedding lookups.
    embed = model.get_input_embeddings()
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(batch["labels"])
    with fast_paths.disabled():
        plain = step(inputs_embeds=embed(batch["input_ids"]), decoder_inputs_embeds=embed(decoder_input_ids))
        assert calls == [1] and lookups == [1]
    torch.testing.assert_close(fused[0], plain[0])
    torch.testing.assert_close(fused[1], plain[1])
    for got, expected in zip(fused[2], plain[2], strict=True):
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


def test_a_hooked_or_replaced_output_projection_is_called_as_a_module(batch) -> None:
    model = tiny_model().train()
    seen = []
    handle = model.lm_head.register_forward_hook(lambda module, args, output: seen.append(output.shape))
    model(**batch).loss.backward()
    assert seen == [(2, 7, 100)]
    handle.remove()

    class Adapted(nn.Linear):  # e.g. an adapter that wraps the projection
        def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
            seen.append("adapted")
            return super().forward(hidden_states)

    model.lm_head.__class__ = Adapted
    model(**batch).loss.backward()
    assert seen == [(2, 7, 100), "adapted"]


def test_cpu_dropout_keeps_1_minus_p_and_scales_and_is_seeded() -> None:
    x = torch.ones(999, 1001, requires_grad=True)  # odd size: the last 32-bit draw feeds one element
    torch.manual_seed(0)
    y = fast_paths.dropout(x, 0.1, training=True)
    kept = y != 0
    scale = 2**15 / (2**15 - round(0.1 * 2**15))
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], scale))
    for half in (kept.view(-1)[0::2], kept.view(-1)[1::2]):  # low and high 16 bits of each draw
        rate = half.float().mean().item()
        assert abs(rate - 0.9) < 5 * math.sqrt(0.09 / half.numel()), rate
    y.backward(torch.full_like(y, 2.0))
    torch.testing.assert_close(x.grad, 2.0 * y.detach())  # the same mask and scale
    torch.manual_seed(0)
    assert torch.equal(fast_paths.dropout(x, 0.1, training=True), y)
    assert torch.equal(fast_paths.dropout(x, 0.1, training=False), x)


def test_dropout_rates_that_do_not_round_use_f_dropout(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(
        fast_paths._CpuDropout, "apply", lambda *args: calls.append(args[1]) or (args[0], None)
    )
    x = torch.ones(64, 64)
    for p in (1e-6, 0.99999):  # p·2¹⁵ rounds to 0 or 2¹⁵: the mask could not draw them
        out = fast_paths.dropout(x, p, training=True)
        assert out is not None and out.shape == x.shape
    fast_paths.dropout(x, 0.3, training=True)
    assert calls == [round(0.3 * 2**15)]


# ------------------------------------------------------------------------------------------------
# One switch turns every fast path off
# ------------------------------------------------------------------------------------------------
def _record_fast_paths(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record each fast-path kernel that runs (oneDNN is seen by the profiler instead)."""
    calls: list[str] = []
    for name, function in (
        ("dropout", fast_paths._CpuDropout),
        ("loss", fast_paths._LinearSmoothedCrossEntropySum),
    ):
        original = function.apply
        monkeypatch.setattr(
            function, "apply", lambda *args, _o=original, _n=name: calls.append(_n) or _o(*args)
        )
    store = fast_paths._store_with_room
    monkeypatch.setattr(
        fast_paths,
        "_store_with_room",
        lambda *args, **kwargs: calls.append("cache") or store(*args, **kwargs),
    )
    eager = modeling_vanilla_transformer.eager_attention_forward  # runs only where the fast path picks it
    monkeypatch.setattr(
        modeling_vanilla_transformer,
        "eager_attention_forward",
        lambda *args, **kwargs: calls.append("attention") or eager(*args, **kwargs),
    )
    return calls


def _train_step_and_generate(model: VanillaTransformerForConditionalGeneration, batch: dict) -> None:
    model.train()
    model(**batch).loss.backward()
    model.eval()
    with torch.no_grad():
        model.generate(
            batch["input_ids"], attention_mask=batch["attention_mask"], num_beams=2, max_new_tokens=4
        )


def test_the_switch_turns_every_fast_path_off(batch, monkeypatch) -> None:
    model = tiny_model(
        encoder_ffn_dim=8192, decoder_ffn_dim=8192, dropout=0.1
    )  # fc weights at the oneDNN threshold
    monkeypatch.setattr(fast_paths, "MATMUL_ATTENTION_MIN_ROWS", 1)  # the tiny batch counts as many rows
    monkeypatch.setattr(fast_paths, "ONEDNN_LINEAR_CPU", True)  # as on an AMD CPU
    calls = _record_fast_paths(monkeypatch)
    assert _ran_onednn(lambda: _train_step_and_generate(model, batch)) == fast_paths._ONEDNN_LINEAR
    assert set(calls) == {"dropout", "loss", "cache", "attention"}
    calls.clear()
    with fast_paths.disabled():
        assert not _ran_onednn(lambda: _train_step_and_generate(model, batch))
        assert calls == []
    assert fast_paths.enabled()  # restored on leaving the block


# ------------------------------------------------------------------------------------------------
# The fast paths compose with the tools users combine a model with
# ------------------------------------------------------------------------------------------------
def _base_width_model(**overrides: object) -> VanillaTransformerForConditionalGeneration:
    """d_model 512 (attention projections over the oneDNN threshold), one layer each, tiny vocabulary."""
    sizes = dict(d_model=512, encoder_attention_heads=8, decoder_attention_heads=8, encoder_layers=1)
    sizes.update(decoder_layers=1, encoder_ffn_dim=64, decoder_ffn_dim=64)
    return tiny_model(**{**sizes, **overrides})


def test_torchscript_trace_equals_eager() -> None:
    model = _base_width_model()
    encoder = model.get_encoder()
    input_ids = torch.randint(4, 100, (2, 7))
    hidden = torch.randn(2, 7, 512)
    with torch.no_grad():
        traced_projection = torch.jit.trace(encoder.layers[0].self_attn.q_proj, hidden)
        traced_encoder = torch.jit.trace(encoder, input_ids, strict=False)
        torch.testing.assert_close(traced_projection(hidden), encoder.layers[0].self_attn.q_proj(hidden))
        traced = traced_encoder(input_ids)["last_hidden_state"]
        torch.testing.assert_close(traced, encoder(input_ids).last_hidden_state)
        assert "mkldnn" not in str(traced_encoder.inlined_graph)


def test_autocast_gives_what_stock_modules_give(batch) -> None:
    """Under CPU autocast (bf16) every projection runs as the stock module, so the outputs are those of
    the model with its fast paths off, to the bit (one fp32 projection would change them)."""
    model = _base_width_model()
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")} | {
        "decoder_input_ids": batch["labels"].clamp(min=1)
    }
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        fast = model(**inputs)
        with fast_paths.disabled():
            stock = model(**inputs)
    assert fast.logits.dtype == torch.bfloat16
    assert torch.equal(fast.logits, stock.logits)
    assert torch.equal(fast.encoder_last_hidden_state, stock.encoder_last_hidden_state)


def test_dynamic_quantization_quantizes_every_linear_and_keeps_greedy_tokens(copy_model) -> None:
    linears = [name for name, module in copy_model.named_modules() if type(module) is nn.Linear]
    quantized = torch.ao.quantization.quantize_dynamic(
        copy.deepcopy(copy_model), {nn.Linear}, dtype=torch.qint8
    )
    modules = dict(quantized.named_modules())
    assert len(linears) == 2 * (4 + 2) + 2 * (8 + 2) + 1  # attention projections, FFNs, lm_head
    for name in linears:
        assert isinstance(modules[name], torch.ao.nn.quantized.dynamic.Linear), name
    source, _ = copy_task(torch.Generator().manual_seed(1), 64)
    with torch.no_grad():
        fp32 = copy_model.generate(source, num_beams=1, max_new_tokens=8)
        int8 = quantized.generate(source, num_beams=1, max_new_tokens=8)
    assert (fp32[:, 1:8] == source).all(dim=1).float().mean() >= 0.8  # the model copies (untrained: 0)
    # Measured: 63 or 64 of 64 sentences identical, 99.8–100 % of the tokens, as the weights vary.
    assert (int8 == fp32).all(dim=1).float().mean() >= 0.95
    assert (int8 == fp32).float().mean() >= 0.99


def test_accelerate_hooks_and_module_hooks_fire_in_cpu_fp32_training(batch) -> None:
    from accelerate.hooks import ModelHook, add_hook_to_module, remove_hook_from_module

    model = tiny_model().train()
    seen: list[str] = []

    class Record(ModelHook):
        def pre_forward(self, module: nn.Module, *args: object, **kwargs: object) -> tuple:
            seen.append("accelerate")
            return args, kwargs

    add_hook_to_module(model.lm_head, Record())
    model(**batch).loss.backward()
    assert seen == ["accelerate"]
    remove_hook_from_module(model.lm_head)

    handle = model.lm_head.register_full_backward_hook(lambda *args: seen.append("backward"))
    model(**batch).loss.backward()
    assert seen == ["accelerate", "backward"]
    handle.remove()

    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, output: seen.append("global") if isinstance(module, nn.Linear) else None
    )
    try:
        model(**batch).loss.backward()
    finally:
        handle.remove()
    linears = sum(isinstance(module, nn.Linear) for module in model.modules())
    assert seen.count("global") == linears  # each projection once, the output projection included


def test_accelerate_cpu_offload_gives_the_same_logits(batch) -> None:
    from accelerate import cpu_offload

    model = tiny_model()
    with torch.no_grad():
        expected = model(**batch).logits
        offloaded = cpu_offload(copy.deepcopy(model), execution_device=torch.device("cpu"))
        torch.testing.assert_close(offloaded(**batch).logits, expected)


def test_per_sample_gradients_with_torch_func_equal_a_loop(batch) -> None:
    model = tiny_model(dropout=0.0).train()
    params = {name: p.detach() for name, p in model.named_parameters()}
    input_ids, labels = batch["input_ids"], batch["labels"]

    def loss(params: dict[str, torch.Tensor], ids: torch.Tensor, row_labels: torch.Tensor) -> torch.Tensor:
        inputs = {"input_ids": ids[None], "labels": row_labels[None]}
        return torch.func.functional_call(model, params, (), inputs).loss

    per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, input_ids, labels)
    # torch.func.functional_call unties a weight shared by aliased modules when it restores them
    # (the shared embedding is both `shared` and `encoder.embed_tokens`): the loop uses a fresh model.
    model = tiny_model(dropout=0.0).train()
    for row in range(input_ids.shape[0]):
        model.zero_grad()
        model(input_ids=input_ids[row : row + 1], labels=labels[row : row + 1]).loss.backward()
        for name, p in model.named_parameters():
            torch.testing.assert_close(per_sample[name][row], p.grad, atol=1e-6, rtol=1e-5, msg=name)


def test_copies_other_dtypes_and_frozen_parts_equal_the_original(batch) -> None:
    model = tiny_model(dropout=0.0).train()
    loss = model(**batch).loss
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert torch.equal(other(**batch).loss, loss.detach())
    float64 = copy.deepcopy(model).to(torch.float64)
    torch.testing.assert_close(float64(**batch).loss, loss.detach().double(), atol=1e-5, rtol=1e-5)
    frozen = copy.deepcopy(model)
    frozen.zero_grad(set_to_none=True)
    frozen.model.encoder.layers.requires_grad_(False)
    frozen(**batch).loss.backward()
    for name, p in frozen.named_parameters():
        if name.startswith("model.encoder.layers."):
            assert p.grad is None, name
        else:
            torch.testing.assert_close(p.grad, grads[name], msg=name)


def test_the_environment_switch_is_read_once_at_import(monkeypatch: pytest.MonkeyPatch) -> None:
    """``HF_VANILLA_FAST_PATHS=0`` set before import turns the fast paths off; the environment is not
    read again afterwards (no environment read in ``forward``), ``set_enabled`` switches at run time.
    (A fresh copy of the module file, imported in this process as a new process would import it.)"""
    for value, expected in (("0", [False, False, (False, True)]), ("1", [True, True, (True, False)])):
        monkeypatch.setenv(fast_paths.SWITCH, value)
        spec = importlib.util.spec_from_file_location("fresh_fast_paths", fast_paths.__file__)
        assert spec is not None and spec.loader is not None
        fresh = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, spec.name, fresh)
        spec.loader.exec_module(fresh)
        seen: list[object] = [fresh.enabled()]
        monkeypatch.setenv(fast_paths.SWITCH, "1" if value == "0" else "0")
        seen.append(fresh.enabled())
        seen.append((fresh.set_enabled(not fresh.enabled()), fresh.enabled()))
        assert seen == expected
