# Copyright 2026 The hf_vanilla authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""CPU fast paths of the installed package for the model of :mod:`modeling_vanilla_transformer`.

Each fast path computes exactly what its plain-PyTorch fallback computes (to floating-point
rounding), only faster on the CPU; none of them is part of the paper, and none travels into a model
folder: a folder loaded without hf_vanilla runs the stock operators. hf_vanilla's model class
(:mod:`hf_vanilla.speed.modeling`) enters them through transformers' and torch's extension points:

================================  =====================================  ====================================
fast path                         plain fallback                         how the model reaches it
================================  =====================================  ====================================
:func:`linear`                    ``nn.Linear.forward`` (``F.linear``)   each stock layer's ``forward``
                                                                         (:func:`route_modules`)
:func:`dropout`                   ``nn.Dropout.forward``                 each stock layer's ``forward``
:func:`sdpa_attention`            the model's ``"sdpa"`` entry           its ``AttentionInterface``
:class:`GrowableLayer`            ``DynamicLayer`` (concatenation)       the self-attention cache's layers
:func:`linear_cross_entropy`      ``lm_head(x)`` + ``F.cross_entropy``   the model's ``_logits_and_loss``
================================  =====================================  ====================================

:func:`linear` takes oneDNN's weight streaming in fp32 inference on AMD CPUs; :func:`dropout` draws its
mask from one 32-bit draw per two elements; :func:`sdpa_attention` computes Eq. (1) as two matrix
products in CPU decoding steps; :class:`GrowableLayer` appends in place (no O(P) copy per step);
:func:`linear_cross_entropy` makes no (N, V) gradient in CPU fp32 training. (Measured effects are in
``benchmarks/RESULTS.md``.)

**One gate each.** A fast path runs only where it was measured (the CPU, fp32; for :func:`linear`, an
AMD CPU) and only where it is invisible: never under ``torch.compile``, TorchScript tracing or
scripting, ``torch.func`` transforms, autocast, or for a module that is not exactly the stock
``nn.Linear`` with a plain weight (not a torchao tensor subclass) or that carries hooks (forward,
backward, global, or accelerate's, which replace ``module.forward``). Everywhere else — GPUs, other
dtypes, quantized or adapted layers, offloading — the model runs the stock operator, so every tool that
works on stock modules works on this model.

**One switch.** ``HF_VANILLA_FAST_PATHS=0`` in the environment turns every fast path off (read once,
when this module is imported); at run time :func:`set_enabled` or the :func:`disabled` context
manager switch them. Off, the model runs only stock operators.
"""

from __future__ import annotations

import functools
import math
import os
import platform
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.autograd.graph import get_gradient_edge
from torch.nn import functional as F
from torch.nn.modules import module as _module
from transformers.cache_utils import DynamicCache, DynamicLayer, EncoderDecoderCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from hf_vanilla.models.vanilla_transformer import modeling_vanilla_transformer as modeling

#: The environment variable that turns every fast path off when set to ``0`` before import.
SWITCH = "HF_VANILLA_FAST_PATHS"
#: ... read here, once: ``forward`` never reads the environment.
_enabled = os.environ.get(SWITCH, "1") != "0"


def enabled() -> bool:
    """Whether the fast paths may run at all (see :func:`set_enabled`)."""
    return _enabled


def set_enabled(on: bool) -> bool:
    """Turn every fast path on or off in this process (for the models whose modeling file imports this
    module); returns the previous setting. The start value is ``HF_VANILLA_FAST_PATHS`` at import."""
    global _enabled
    previous, _enabled = _enabled, bool(on)
    return previous


@contextmanager
def disabled() -> Iterator[None]:
    """``with fast_paths.disabled(): ...`` runs the model on stock operators only, then restores the
    previous setting."""
    previous = set_enabled(False)
    try:
        yield
    finally:
        set_enabled(previous)


def _transformed(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is being traced, scripted, compiled or transformed by ``torch.func``."""
    return (
        torch.compiler.is_compiling()
        or torch.jit.is_tracing()
        or torch.jit.is_scripting()
        or torch._C._functorch.is_functorch_wrapped_tensor(tensor)
    )


def _global_hooks() -> bool:
    """Whether module hooks are registered for every module (``nn.modules.module.register_module_*``)."""
    return bool(
        _module._global_forward_hooks
        or _module._global_forward_pre_hooks
        or _module._global_backward_hooks
        or _module._global_backward_pre_hooks
    )


def _stock_linear(module: nn.Module) -> bool:
    """Whether calling ``module`` would run exactly ``nn.Linear.forward`` on plain tensors and nothing
    else: its type is ``nn.Linear`` itself (not a quantized, adapted or subclassed layer), its weight is
    a plain parameter (torchao's quantization keeps the ``nn.Linear`` and swaps its weight for a tensor
    subclass that dispatches ``F.linear`` to int8 kernels), no hook is registered on it or globally, and
    no one replaced its ``forward`` but :func:`route_modules` (accelerate's hooks do)."""
    forward = module.__dict__.get("forward")
    return (
        type(module) is nn.Linear
        and type(module.weight) is nn.Parameter
        and not (module._forward_hooks or module._forward_pre_hooks)
        and not (module._backward_hooks or module._backward_pre_hooks)
        and (forward is None or _routed(forward))
        and not _global_hooks()
    )


def _cpu_fp32(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors) and not (
        torch.is_autocast_enabled("cpu")
    )


# --------------------------------------------------------------------------------------------------
# Linear layers in inference: oneDNN
# --------------------------------------------------------------------------------------------------
def _onednn_linear_available() -> bool:
    try:
        return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    except (AttributeError, RuntimeError):
        return False


_ONEDNN_LINEAR = _onednn_linear_available()


def cpu_vendor() -> str:
    """The CPU's vendor: ``/proc/cpuinfo``'s ``vendor_id`` ("GenuineIntel", "AuthenticAMD"), else
    ``platform.processor()`` (on Windows it ends with the vendor); "" where neither says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("vendor_id"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor()


def prefers_onednn_linear(vendor: str) -> bool:
    """Whether oneDNN multiplies decoding's few rows by a large weight faster than ``F.linear`` on a CPU
    of ``vendor``. ``F.linear``'s BLAS in x86 torch builds is Intel's MKL, which runs its fastest code on
    Intel CPUs only: on an AMD EPYC oneDNN streams the weights 1.35–1.6× faster, on an Intel Xeon MKL is
    the faster one (oneDNN 0.3–0.5× at 1–4 rows; decoding 8–23 % slower through it). Measured on those
    two (benchmarks/linear_kernels.py); any other CPU keeps ``F.linear``."""
    return "AuthenticAMD" in vendor


#: Whether :func:`linear` takes oneDNN on this machine's CPU (read once, at import).
ONEDNN_LINEAR_CPU = prefers_onednn_linear(cpu_vendor())

#: Weights with at least this many elements (1 MiB in fp32: from d_model 512 up for the attention
#: projections) go through oneDNN in CPU inference.
ONEDNN_MIN_WEIGHT_ELEMENTS = 2**18


def linear(module: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """What the class ``forward`` of ``module`` computes (``F.linear`` for an ``nn.Linear``); for a stock
    ``nn.Linear`` in fp32 CPU inference (no autograd) with a large weight, on a CPU where it is the
    faster kernel (:data:`ONEDNN_LINEAR_CPU`), the same product through oneDNN (the kernel
    ``torch.compile`` uses on CPUs) instead of ``F.linear``'s BLAS call. Decoding multiplies a few rows
    by each weight, so it streams weights from memory, and there oneDNN is faster than MKL on AMD CPUs.
    Results equal ``F.linear``'s to rounding."""
    if (
        _ONEDNN_LINEAR
        and ONEDNN_LINEAR_CPU
        and enabled()
        and not torch.is_grad_enabled()
        and _stock_linear(module)
        and module.weight.numel() >= ONEDNN_MIN_WEIGHT_ELEMENTS
        and _cpu_fp32(hidden_states, module.weight)
        and not _transformed(hidden_states)
    ):
        return torch.ops.mkldnn._linear_pointwise(hidden_states, module.weight, module.bias, "none", [], "")
    return type(module).forward(module, hidden_states)


def _linear_forward(module: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """The ``forward`` that :func:`route_modules` gives a linear layer: :func:`linear` (looked up at each call)."""
    return linear(module, hidden_states)


def _dropout_forward(module: nn.Dropout, hidden_states: torch.Tensor) -> torch.Tensor:
    """The ``forward`` that :func:`route_modules` gives a dropout layer: :func:`dropout`."""
    return dropout(hidden_states, module.p, module.training)


def _routed(forward: object) -> bool:
    return isinstance(forward, functools.partial) and forward.func is _linear_forward


def route_modules(model: nn.Module) -> None:
    """Enter :func:`linear` from the ``forward`` of every stock ``nn.Linear`` in ``model``, and
    :func:`dropout` from that of every stock ``nn.Dropout``, so that the layers call ``self.q_proj(x)``
    and ``self.dropout(x)`` and each gate lives here, once.

    The layer stays an ``nn.Linear`` (``quantize_dynamic({nn.Linear})``, PEFT, transformers' quantizers
    and the state dict see the stock module); only its instance gets a ``forward`` attribute, as
    accelerate's hooks and the ``kernels`` library's ``kernelize`` give one. Its hooks run around it as
    around any ``forward``; a layer whose class someone changes afterwards runs that class's
    ``forward``. hf_vanilla's model routes a new output projection too (``set_output_embeddings``, which
    the vocabulary resizing uses)."""
    for module in model.modules():
        if "forward" in module.__dict__:
            continue
        if type(module) is nn.Linear:
            module.forward = functools.partial(_linear_forward, module)
        elif type(module) is nn.Dropout and not module.inplace:
            module.forward = functools.partial(_dropout_forward, module)


# --------------------------------------------------------------------------------------------------
# Attention in a decoding step: two matrix products instead of SDPA's CPU kernel
# --------------------------------------------------------------------------------------------------
#: A decoding step has at most this many queries per key sequence: one per hypothesis, or a
#: sentence's beam hypotheses grouped over its source keys in cross-attention.
DECODING_QUERIES = 8

#: ... and, for the matrix products to win, at least this many (sequence, head, query) rows in all.
MATMUL_ATTENTION_MIN_ROWS = 128


def attention_interface(
    interface: Callable, eager: Callable, module: nn.Module, query: torch.Tensor, mask: torch.Tensor | None
) -> Callable:
    """``interface``; where it is SDPA, in fp32 CPU inference (eval mode, no autograd) for a decoding
    step over many rows, ``eager`` instead: Eq. (1) as two batched matrix products, which computes
    the same attention. SDPA's CPU kernel works through blocks of 32+ queries, so a step with one
    query per row (or a few, grouped) pays for the unused ones: at beam 4, batch 32 and base size the
    grouped cross-attention takes 0.66 ms per layer through SDPA and 0.20 ms through two products,
    self-attention 0.54 against 0.31 ms. With few rows (batch 1) SDPA's kernel is the faster one and
    stays. A causal call that SDPA would mask by itself (no mask, several queries) keeps SDPA: the
    eager kernel needs its mask."""
    if (
        interface is sdpa_attention_forward
        and enabled()
        and not module.training
        and not torch.is_grad_enabled()
        and _cpu_fp32(query)
        and not _transformed(query)
        and query.shape[-2] <= DECODING_QUERIES
        and query.shape[0] * query.shape[1] * query.shape[-2] >= MATMUL_ATTENTION_MIN_ROWS
        and (mask is not None or not module.is_causal or query.shape[-2] == 1)
    ):
        return eager
    return interface


def sdpa_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: object,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The model's ``"sdpa"`` attention entry (registered in its ``ALL_ATTENTION_FUNCTIONS`` by
    :mod:`hf_vanilla.speed.modeling`): the eager kernel where :func:`attention_interface` picks it (CPU
    decoding steps), else the folder's own SDPA entry."""
    kernel = attention_interface(
        sdpa_attention_forward, modeling.eager_attention_forward, module, query, attention_mask
    )
    if kernel is sdpa_attention_forward:
        kernel = modeling.sdpa_or_eager_attention_forward
    return kernel(module, query, key, value, attention_mask, **kwargs)


# --------------------------------------------------------------------------------------------------
# Dropout in training: a cheaper mask
# --------------------------------------------------------------------------------------------------
#: The CPU dropout mask draws 15 random bits per element: p is rounded to a multiple of 2⁻¹⁵.
_DROPOUT_LEVELS = 2**15


def _keep_mask(shape: torch.Size, drop: int) -> torch.Tensor:
    """A boolean mask of ``shape``, each element False (dropped) with probability drop / 2¹⁵.

    One 32-bit draw of the CPU generator feeds two elements: ``random_()`` on int32 gives 31
    uniform bits, read as two int16 halves whose low 15 bits are uniform on [0, 2¹⁵). ``bernoulli_``
    draws a float per element; the generator and its seeding are the same.
    """
    numel = math.prod(shape)
    halves = torch.empty((numel + 1) // 2, dtype=torch.int32).random_().view(torch.int16)
    keep = halves.bitwise_and_(_DROPOUT_LEVELS - 1) >= drop
    return keep[:numel].view(shape)


class _CpuDropout(torch.autograd.Function):
    """Inverted dropout x · mask / (1 − p) with the mask of :func:`_keep_mask`, kept as booleans
    (``F.dropout`` keeps a float32 mask on the CPU, four times larger)."""

    @staticmethod
    def forward(hidden_states: torch.Tensor, drop: int) -> tuple[torch.Tensor, torch.Tensor]:
        keep = _keep_mask(hidden_states.shape, drop)
        scale = _DROPOUT_LEVELS / (_DROPOUT_LEVELS - drop)  # 1 / (1 − p) for the rounded p
        return torch.where(keep, hidden_states, 0.0).mul_(scale), keep

    @staticmethod
    def setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: tuple) -> None:
        _, drop = inputs
        ctx.save_for_backward(output[1])
        ctx.scale = _DROPOUT_LEVELS / (_DROPOUT_LEVELS - drop)
        ctx.mark_non_differentiable(output[1])

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor, _grad_keep: torch.Tensor | None
    ) -> tuple[torch.Tensor, None]:
        (keep,) = ctx.saved_tensors
        return torch.where(keep, grad, 0.0).mul_(ctx.scale), None


def dropout(hidden_states: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """``F.dropout(hidden_states, p, training)``; on the CPU, when p is a multiple of 2⁻¹⁵ to within
    0.1 % of itself (0.1 → 0.100006), the same inverted dropout with the mask of :func:`_keep_mask`.
    The one visible difference: the drop rate is that rounded p."""
    if not training or p == 0.0:
        return hidden_states
    drop = round(p * _DROPOUT_LEVELS)
    if (
        enabled()
        and hidden_states.device.type == "cpu"
        and 0 < drop < _DROPOUT_LEVELS
        and abs(drop / _DROPOUT_LEVELS - p) <= 1e-3 * p
        and not _transformed(hidden_states)
    ):
        return _CpuDropout.apply(hidden_states, drop)[0]
    return F.dropout(hidden_states, p, training)


# --------------------------------------------------------------------------------------------------
# Incremental decoding: a self-attention cache that grows in place
# --------------------------------------------------------------------------------------------------
def _grows(tensor: torch.Tensor) -> bool:
    """Whether a cache may grow in place: in eager inference. With gradients enabled the in-place writes
    would overwrite keys and values that an earlier step saved for its backward pass; under compilation
    the buffer checks would break the graph."""
    return enabled() and not torch.is_grad_enabled() and not _transformed(tensor)


def _store_with_room(layer: object, keys: torch.Tensor, values: torch.Tensor, capacity: int) -> None:
    """Copy (B, H, P, Dh) keys/values into new buffers of ``capacity`` positions; the layer then holds
    (B, H, P, Dh) views of them, and the buffers are kept on the layer to be filled in place."""
    shape = (keys.shape[0], keys.shape[1], capacity, keys.shape[3])
    buffers = (keys.new_empty(shape), values.new_empty(shape))
    length = keys.shape[2]
    buffers[0][:, :, :length].copy_(keys)
    buffers[1][:, :, :length].copy_(values)
    layer.keys, layer.values = buffers[0][:, :, :length], buffers[1][:, :, :length]
    layer._hf_vanilla_buffers = buffers


def _room_for(layer: object, batch: int, length: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The layer's buffers if its keys/values are still views of them (no one replaced them) with room
    for ``length`` positions."""
    buffers = getattr(layer, "_hf_vanilla_buffers", None)
    if buffers is None or layer.keys is None or layer.keys.dim() != 4:
        return None
    for view, buffer in zip((layer.keys, layer.values), buffers, strict=True):
        if view.data_ptr() != buffer.data_ptr() or view.stride() != buffer.stride() or view.shape[0] != batch:
            return None
    return buffers if length <= buffers[0].shape[2] else None


class GrowableLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values live in buffers with spare positions (capacity doubles
    when full), so that a step writes only its own T positions. ``DynamicLayer.update`` concatenates,
    copying the whole cache at every step (O(P) per token, O(N²) per sentence). ``keys``/``values`` stay
    plain (B, H, P + T, Dh) tensors (views) for everything else in transformers; outside eager inference
    (:func:`_grows`) the layer updates as ``DynamicLayer`` does."""

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append (B, H, T, Dh) keys/values and return all (B, H, P + T, Dh) of them."""
        if not _grows(key_states):
            return super().update(key_states, value_states, *args, **kwargs)
        past = self.get_seq_length()
        total = past + key_states.shape[2]
        buffers = _room_for(self, key_states.shape[0], total)
        if buffers is None:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            old_keys = self.keys if past else key_states[:, :, :0]
            old_values = self.values if past else value_states[:, :, :0]
            _store_with_room(self, old_keys, old_values, capacity=2 * total if past else total + 16)
            buffers = self._hf_vanilla_buffers
        buffers[0][:, :, past:total].copy_(key_states)
        buffers[1][:, :, past:total].copy_(value_states)
        self.keys, self.values = buffers[0][:, :, :total], buffers[1][:, :, :total]
        return self.keys, self.values

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search: the surviving hypotheses' rows are gathered straight into buffers with room for
        the next step, so reordering and the next append copy the cache once."""
        if not _grows(beam_idx) or self.get_seq_length() == 0:
            return super().reorder_cache(beam_idx)
        length = self.keys.shape[2]
        shape = (beam_idx.shape[0], self.keys.shape[1], length + 1, self.keys.shape[3])
        buffers = (self.keys.new_empty(shape), self.values.new_empty(shape))
        index = beam_idx.to(self.keys.device)
        torch.index_select(self.keys, 0, index, out=buffers[0][:, :, :length])
        torch.index_select(self.values, 0, index, out=buffers[1][:, :, :length])
        self.keys, self.values = buffers[0][:, :, :length], buffers[1][:, :, :length]
        self._hf_vanilla_buffers = buffers
        return None


def make_growable(cache: object) -> None:
    """Give the self-attention cache of an ``EncoderDecoderCache`` :class:`GrowableLayer` layers where
    they are still empty ``DynamicLayer`` ones of a plain ``DynamicCache`` without offloading."""
    if not isinstance(cache, EncoderDecoderCache) or not enabled():
        return
    cache = cache.self_attention_cache
    if type(cache) is not DynamicCache or cache.offloading:
        return
    cache.layers = [
        GrowableLayer() if type(layer) is DynamicLayer and not layer.is_initialized else layer
        for layer in cache.layers
    ]
    if getattr(cache, "layer_class_to_replicate", None) is DynamicLayer:  # layers made on demand
        cache.layer_class_to_replicate = GrowableLayer


# --------------------------------------------------------------------------------------------------
# Training: the pre-softmax projection and the label-smoothed loss as one autograd node
# --------------------------------------------------------------------------------------------------
#: Blocks of the (N, V) logits that the loss works through at a time: about 8 MB of fp32, so each
#: block stays in the last-level cache between the passes over it.
_LOSS_BLOCK_ELEMENTS = 2**21


def _logsumexp_rows(logits: torch.Tensor) -> torch.Tensor:
    """(N, V) → (N,) log Σ exp over the vocabulary (max-shifted, as ``torch.logsumexp``), a block of
    rows at a time through one reused buffer: ``torch.logsumexp`` allocates an (N, V) temporary."""
    rows, vocab = logits.shape
    lse = logits.new_empty(rows)
    step = max(1, _LOSS_BLOCK_ELEMENTS // vocab)
    buffer = logits.new_empty(min(step, rows), vocab)
    for start in range(0, rows, step):
        block = logits[start : start + step]
        peak = block.amax(dim=-1, keepdim=True)  # (r, 1)
        peak.masked_fill_(peak.isinf(), 0.0)  # rows of ±inf: no shift, as torch.logsumexp
        work = torch.sub(block, peak, out=buffer[: block.shape[0]]).exp_()
        torch.sum(work, dim=-1, out=lse[start : start + step]).log_().add_(peak.squeeze(1))
    return lse


def _loss_gradient(
    out: torch.Tensor,
    logits: torch.Tensor,
    lse: torch.Tensor,
    target: torch.Tensor,
    row_scale: torch.Tensor,
    smoothing: float,
    start: int,
) -> torch.Tensor:
    """Write ∂loss/∂z for vocabulary entries [start, start + V_b) into ``out`` (N, V_b) and return
    it: row_scale · (softmax(z) − ε/V − (1 − ε)·onehot(y)). logits (N, V), lse, target (N,),
    row_scale (N, 1): the loss's incoming gradient, 0 on ignored rows."""
    stop = start + out.shape[1]
    torch.sub(logits[:, start:stop], lse[:, None], out=out).exp_()  # softmax
    if smoothing:
        out.sub_(smoothing / logits.shape[1])
    # −(1 − ε) at each row's label when it falls in this block; other rows add 0
    local = target - start
    inside = (local >= 0) & (local < out.shape[1])
    onehot = torch.where(inside, smoothing - 1.0, 0.0).to(out.dtype)[:, None]
    out.scatter_add_(1, local.clamp(0, out.shape[1] - 1)[:, None], onehot)
    return out.mul_(row_scale)


class _LinearSmoothedCrossEntropySum(torch.autograd.Function):
    """logits z = x Wᵀ (+ b), (N, D) → (N, V), and Σ over rows not labelled -100 of
    (1 − ε)·(lse − z_y) + ε·(lse − mean(z)): the value, logits and every gradient of ``F.linear``
    followed by ``F.cross_entropy(..., label_smoothing=ε, reduction="sum")``.

    Only the backward pass differs in how it works: the gradient of the loss with respect to the
    logits, softmax(z) − (1 − ε)·onehot(y) − ε/V per row, exists a block of about 8 MB of the
    vocabulary at a time, each block multiplied into ∂x += g W_b and ∂W_b = gᵀ x while in cache, so
    the (N, V) gradient is never materialised. Gradients that reach the returned logits from
    elsewhere (another loss on them) are added per block.
    """

    @staticmethod
    def forward(
        hidden_states: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        labels: torch.Tensor,
        smoothing: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = F.linear(hidden_states, weight, bias)  # (N, V)
        valid = labels != -100  # (N,)
        target = labels.masked_fill(~valid, 0)
        lse = _logsumexp_rows(logits)
        per_row = lse - logits.gather(1, target[:, None]).squeeze(1)  # −log p(y)
        if smoothing:
            per_row = (1.0 - smoothing) * per_row + smoothing * (lse - logits.mean(dim=-1))
        return torch.where(valid, per_row, 0.0).sum(), logits, lse

    @staticmethod
    def setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: tuple) -> None:
        hidden_states, weight, _, labels, smoothing = inputs
        _, logits, lse = output
        valid = labels != -100
        ctx.save_for_backward(hidden_states, weight, logits, lse, labels.masked_fill(~valid, 0), valid)
        ctx.smoothing = smoothing
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)  # no (N, V) zeros when nothing else uses the logits

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx,
        grad_total: torch.Tensor | None,
        grad_logits: torch.Tensor | None,
        _grad_lse: torch.Tensor | None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, None, None]:
        hidden_states, weight, logits, lse, target, valid = ctx.saved_tensors
        rows, vocab = logits.shape
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.zeros_like(hidden_states) if need_hidden else None
        grad_weight = torch.empty_like(weight) if need_weight else None
        grad_bias = weight.new_empty(vocab) if need_bias else None
        row_scale = (grad_total * valid)[:, None] if grad_total is not None else None  # (N, 1)
        width = min(vocab, max(1024, _LOSS_BLOCK_ELEMENTS // max(rows, 1)))
        buffer = logits.new_empty(rows, width)
        for start in range(0, vocab, width):
            stop = min(start + width, vocab)
            block = buffer[:, : stop - start]  # (N, V_b): ∂loss/∂z for vocabulary entries [start, stop)
            if row_scale is None:
                block.zero_()
            else:
                _loss_gradient(block, logits, lse, target, row_scale, ctx.smoothing, start)
            if grad_logits is not None:
                block.add_(grad_logits[:, start:stop])
            if grad_hidden is not None:
                grad_hidden.addmm_(block, weight[start:stop])
            if grad_weight is not None:
                torch.mm(block.t(), hidden_states, out=grad_weight[start:stop])
            if grad_bias is not None:
                torch.sum(block, dim=0, out=grad_bias[start:stop])
        return grad_hidden, grad_weight, grad_bias, None, None


class _LossOfLogits(torch.autograd.Function):
    """0, added to the loss of :class:`_LinearSmoothedCrossEntropySum` so that the loss is a function
    of the logits it returns (transformers' contract: ``torch.autograd.grad(loss, logits)``).

    Its backward gives ∂loss/∂z (an (N, V) tensor) only where the backward pass stops at the logits
    (``torch.autograd.grad(loss, logits)``). Where it goes on to the projection's inputs
    (``loss.backward()``), the fused node computes that gradient a block at a time and this one
    passes nothing, so no (N, V) gradient is made: which of the two, the autograd engine says
    (``_will_engine_execute_node`` of the inputs' gradient nodes, as ``torch.utils.checkpoint`` asks).
    """

    @staticmethod
    def forward(
        logits: torch.Tensor, lse: torch.Tensor, labels: torch.Tensor, smoothing: float, upstream: tuple
    ) -> torch.Tensor:
        return logits.new_zeros(())

    @staticmethod
    def setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: torch.Tensor) -> None:
        logits, lse, labels, smoothing, upstream = inputs
        valid = labels != -100
        ctx.save_for_backward(logits, lse, labels.masked_fill(~valid, 0), valid)
        ctx.smoothing, ctx.upstream = smoothing, upstream

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor | None, None, None, None, None]:
        if any(torch._C._will_engine_execute_node(node) for node in ctx.upstream):
            return None, None, None, None, None
        logits, lse, target, valid = ctx.saved_tensors
        flat = logits.reshape(-1, logits.shape[-1])  # (N, V)
        row_scale = (grad * valid)[:, None]  # (N, 1)
        gradient = _loss_gradient(torch.empty_like(flat), flat, lse, target, row_scale, ctx.smoothing, 0)
        return gradient.view(logits.shape), None, None, None, None


def linear_cross_entropy(
    lm_head: nn.Module,
    hidden_states: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    smoothing: float,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The summed label-smoothed loss and the (…, V) logits of hidden states (…, D) with labels (…)
    through a bias-free stock ``lm_head`` (plus ``bias``, if any) in one autograd node, in fp32 CPU
    training; ``None`` where that does not apply (then the caller runs ``lm_head`` and
    ``F.cross_entropy``). The loss is a function of the returned logits (:class:`_LossOfLogits`)."""
    weight = getattr(lm_head, "weight", None)
    if not (
        enabled()
        and torch.is_grad_enabled()
        and _stock_linear(lm_head)
        and lm_head.bias is None
        and _cpu_fp32(hidden_states, weight)
        and not _transformed(hidden_states)
    ):
        return None
    shape = (*hidden_states.shape[:-1], weight.shape[0])  # (…, V)
    rows, labels = hidden_states.reshape(-1, hidden_states.shape[-1]), labels.reshape(-1)  # (N, D), (N,)
    total, logits, lse = _LinearSmoothedCrossEntropySum.apply(rows, weight, bias, labels, smoothing)
    logits = logits.view(shape)
    upstream = tuple(
        get_gradient_edge(tensor).node
        for tensor in (hidden_states, weight, bias)
        if tensor is not None and tensor.requires_grad
    )
    if upstream:
        total = total + _LossOfLogits.apply(logits, lse, labels, smoothing, upstream)
    return total, logits
