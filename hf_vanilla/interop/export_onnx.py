"""hf_vanilla → ``torch.export`` programs and ONNX graphs for cached decoding, run by ONNX Runtime.

    pip install -e ".[onnx]"
    hf-vanilla-export-onnx --model_dir demo_output --output_dir demo_output_onnx

A cache starts empty, and a graph with a dimension that may be 0 does not export well, so the
decoding loop is cut into two graphs, each a plain-tensor wrapper around the model's own forward:

* ``encoder.onnx`` — :class:`EncoderWithFirstStep`: ``input_ids``, ``attention_mask`` (B, S) → the
  encoder, then the first decoder step (the decoder start token): ``logits`` (B, V) of that step and,
  for each decoder layer *i*, ``present.i.decoder.key/value`` (B, H, 1, Dh, the self-attention cache)
  and ``present.i.encoder.key/value`` (B, H, S, Dh, the cross-attention keys and values, computed once).
* ``decoder_with_past.onnx`` — :class:`DecoderStepWithPast`: ``input_ids`` (B, 1), ``encoder_attention_mask``
  (B, S) and ``past.i.decoder.key/value`` (B, H, P, Dh), ``past.i.encoder.key/value`` → ``logits`` (B, V)
  and ``present.i.decoder.key/value`` (B, H, P + 1, Dh).

Batch, source length and past length are dynamic. :func:`export_programs` gives the two
``torch.export`` programs (ATen graphs that ``torch.export.save`` writes as ``.pt2`` files; the same
programs are what the ONNX exporter translates), :func:`export_onnx` writes the folder (the two
graphs, ``config.json``, ``generation_config.json`` and the tokenizer), and :func:`greedy_generate`
decodes with ONNX Runtime: its tokens equal ``model.generate(num_beams=1)`` (tested). Beam search
and sampling over the same graphs run through transformers' ``generate()``:
:mod:`hf_vanilla.interop.onnx_generation`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput

from hf_vanilla.io.atomic import atomic_directory, refuse_to_replace

logger = logging.getLogger(__name__)

__all__ = [
    "DecoderStepWithPast",
    "EncoderWithFirstStep",
    "export_onnx",
    "export_programs",
    "greedy_generate",
    "load_onnx_sessions",
    "past_names",
]

ENCODER_FILE, DECODER_FILE = "encoder.onnx", "decoder_with_past.onnx"


def past_names(num_layers: int, prefix: str) -> list[str]:
    """``prefix.i.decoder.key``, ``….decoder.value``, ``….encoder.key``, ``….encoder.value`` per layer *i*:
    the order of the cache tensors in every graph's inputs and outputs."""
    return [
        f"{prefix}.{layer}.{side}.{kind}"
        for layer in range(num_layers)
        for side in ("decoder", "encoder")
        for kind in ("key", "value")
    ]


def _flatten(cache: EncoderDecoderCache, num_layers: int, cross: bool = True) -> list[torch.Tensor]:
    tensors = []
    for layer in range(num_layers):
        own = cache.self_attention_cache.layers[layer]
        tensors += [own.keys, own.values]
        if cross:
            other = cache.cross_attention_cache.layers[layer]
            tensors += [other.keys, other.values]
    return tensors


class EncoderWithFirstStep(nn.Module):
    """input_ids, attention_mask (B, S) → first-step logits (B, V) and the cache after it (see the module
    docstring for the order)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.num_layers = model.config.decoder_layers
        self.start = model.config.decoder_start_token_id

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        start = input_ids[:, :1].new_full((input_ids.shape[0], 1), self.start)  # (B, 1)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=start,
            cache=cache,
            use_cache=True,
        )
        return (outputs.logits[:, -1], *_flatten(cache, self.num_layers))


class DecoderStepWithPast(nn.Module):
    """One cached decoder step: input_ids (B, 1), encoder_attention_mask (B, S) and the cache →
    logits (B, V) and the decoder self-attention cache grown by one position."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.num_layers = model.config.decoder_layers

    def forward(
        self, input_ids: torch.Tensor, encoder_attention_mask: torch.Tensor, *past: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        own, cross = DynamicCache(), DynamicCache()
        for layer in range(self.num_layers):
            own.update(past[4 * layer], past[4 * layer + 1], layer)
            cross.update(past[4 * layer + 2], past[4 * layer + 3], layer)
        cache = EncoderDecoderCache(own, cross)
        for layer in range(self.num_layers):
            cache.is_updated[layer] = True  # cross-attention reads its keys and values from the cache
        cross_key = past[2]  # (B, H, S, Dh): the encoder output itself is not needed, only its shape
        encoder_shape = (cross_key.shape[0], cross_key.shape[2], self.model.config.d_model)
        outputs = self.model(
            attention_mask=encoder_attention_mask,
            encoder_outputs=BaseModelOutput(last_hidden_state=cross_key.new_zeros(encoder_shape)),
            decoder_input_ids=input_ids,
            cache=cache,
            use_cache=True,
        )
        return (outputs.logits[:, -1], *_flatten(cache, self.num_layers, cross=False))


def _example_inputs(model: nn.Module, batch: int = 2, source_length: int = 5) -> dict[str, torch.Tensor]:
    ids = torch.arange(source_length).repeat(batch, 1) % model.config.vocab_size
    ids[:, -1] = model.config.eos_token_id
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def export_programs(
    model: nn.Module,
) -> tuple[torch.export.ExportedProgram, torch.export.ExportedProgram]:
    """``torch.export`` the encoder-with-first-step and the cached decoder step of an eval-mode
    model, with dynamic batch, source length and past length."""
    if model.training:
        raise ValueError("Export an inference graph: call model.eval() first (dropout would be traced).")
    batch, source, past = torch.export.Dim("batch"), torch.export.Dim("source"), torch.export.Dim("past")
    encoder = EncoderWithFirstStep(model).eval()
    inputs = _example_inputs(model)
    encoder_program = torch.export.export(
        encoder,
        (inputs["input_ids"], inputs["attention_mask"]),
        dynamic_shapes=({0: batch, 1: source}, {0: batch, 1: source}),
    )
    with torch.no_grad():
        first = encoder(**inputs)
    logits, cache = first[0], list(first[1:])
    # a past of 3 positions: the first step's, grown by two more steps' worth of the same values
    for index in range(0, len(cache), 4):
        cache[index] = cache[index].repeat(1, 1, 3, 1)
        cache[index + 1] = cache[index + 1].repeat(1, 1, 3, 1)
    step_ids = logits.argmax(-1, keepdim=True)
    layer_shapes = [{0: batch, 2: past}, {0: batch, 2: past}, {0: batch, 2: source}, {0: batch, 2: source}]
    decoder_program = torch.export.export(
        DecoderStepWithPast(model).eval(),
        (step_ids, inputs["attention_mask"], *cache),
        dynamic_shapes=({0: batch}, {0: batch, 1: source}, tuple(layer_shapes * model.config.decoder_layers)),
    )
    return encoder_program, decoder_program


def export_onnx(
    model: nn.Module, tokenizer: Any | None, output_dir: str | Path, overwrite: bool = False
) -> Path:
    """Write ``encoder.onnx`` and ``decoder_with_past.onnx`` (torch's dynamo ONNX exporter, from
    :func:`export_programs`; the model must be in eval mode), the config, generation config and
    tokenizer into ``output_dir``, under a temporary name renamed into place when complete."""
    output_dir = Path(output_dir)
    refuse_to_replace(output_dir, overwrite)
    num_layers = model.config.decoder_layers
    encoder_program, decoder_program = export_programs(model)
    names = {
        ENCODER_FILE: (["input_ids", "attention_mask"], ["logits", *past_names(num_layers, "present")]),
        DECODER_FILE: (
            ["input_ids", "encoder_attention_mask", *past_names(num_layers, "past")],
            ["logits", *[name for name in past_names(num_layers, "present") if ".decoder." in name]],
        ),
    }
    with atomic_directory(output_dir) as staging:
        for (file_name, (input_names, output_names)), program in zip(
            names.items(), (encoder_program, decoder_program), strict=True
        ):
            onnx_program = torch.onnx.export(
                program, input_names=input_names, output_names=output_names, dynamo=True, verbose=False
            )
            onnx_program.save(str(staging / file_name))
        model.config.save_pretrained(staging)
        model.generation_config.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
    logger.info("Wrote %s and %s to %s", ENCODER_FILE, DECODER_FILE, output_dir)
    return output_dir


def load_onnx_sessions(folder: str | Path, intra_op_threads: int | None = None) -> tuple[Any, Any]:
    """ONNX Runtime sessions (CPU) of the folder's encoder and decoder graphs, each with
    ``intra_op_threads`` threads (ONNX Runtime's default, one per physical core, when ``None``)."""
    import onnxruntime

    folder = Path(folder)
    missing = [name for name in (ENCODER_FILE, DECODER_FILE) if not (folder / name).is_file()]
    if missing:
        raise OSError(
            f"{folder} holds no {' or '.join(missing)}: give a folder written by hf-vanilla-export-onnx "
            "(hf_vanilla.interop.export_onnx.export_onnx)."
        )
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # errors only
    if intra_op_threads is not None:
        options.intra_op_num_threads = intra_op_threads
    return tuple(
        onnxruntime.InferenceSession(
            str(folder / name), sess_options=options, providers=["CPUExecutionProvider"]
        )
        for name in (ENCODER_FILE, DECODER_FILE)
    )


def greedy_generate(
    sessions: Sequence[Any],
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    max_new_tokens: int,
    decoder_start_token_id: int,
    eos_token_id: int,
    pad_token_id: int,
) -> np.ndarray:
    """Greedy decoding with the two graphs: (B, 1 + n) ids starting with the decoder start token,
    ``pad_token_id`` after a row's end of sentence, as ``generate(num_beams=1)`` returns them (it
    stops when every row has ended or after ``max_new_tokens``)."""
    encoder, decoder = sessions
    input_ids, attention_mask = input_ids.astype(np.int64), attention_mask.astype(np.int64)
    logits, *cache = encoder.run(None, {"input_ids": input_ids, "attention_mask": attention_mask})
    num_layers = len(cache) // 4
    past_inputs = past_names(num_layers, "past")
    batch = input_ids.shape[0]
    tokens = [np.full(batch, decoder_start_token_id, dtype=np.int64)]
    finished = np.zeros(batch, dtype=bool)
    for step in range(max_new_tokens):
        token = np.where(finished, pad_token_id, logits.argmax(-1)).astype(np.int64)
        tokens.append(token)
        finished |= token == eos_token_id
        if finished.all() or step == max_new_tokens - 1:
            break
        feed = {"input_ids": token[:, None], "encoder_attention_mask": attention_mask}
        feed.update(zip(past_inputs, cache, strict=True))
        logits, *own = decoder.run(None, feed)
        for layer in range(num_layers):
            cache[4 * layer], cache[4 * layer + 1] = own[2 * layer], own[2 * layer + 1]
    return np.stack(tokens, axis=1)
