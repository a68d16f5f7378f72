"""Pictures of a trained model: its three attentions and masks, the positional encoding, training curves.

All figures are drawn with matplotlib's object-oriented API on an Agg canvas (no pyplot, no global
backend switch, no display needed) and saved as PNG files:

* :func:`plot_attention` — the three attentions of §3.2.3 for one sentence pair (encoder
  self-attention, masked decoder self-attention, encoder-decoder attention): one heatmap per
  layer × head plus the mean over heads, keys on the x axis, queries on the y axis (the style of the
  paper's Figures 3–5). The tick labels are the decoded text of each token (:func:`token_labels`),
  not the byte-level BPE symbols. :func:`attention_maps` returns the weights themselves.
* :func:`plot_attention_masks` — which keys each query may see in a padded batch (:func:`attention_masks`):
  the padding mask, and the causal mask combined with it in the decoder.
* :func:`head_distances` — how different the heads of a layer are (a number per layer, not a picture).
* :func:`plot_positional_encoding` — the sinusoidal encoding matrix of §3.5 and one frequency's sine
  and cosine.
* :func:`plot_training_curves` — training/validation loss (label-smoothed, and the unsmoothed
  validation NLL), validation perplexity, validation BLEU and the learning rate (§5.3, Eq. 3) from
  the ``log_history`` of a Trainer's ``trainer_state.json``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from tokenizers import decoders

from hf_vanilla.inference.decoding import paper_generation_kwargs
from hf_vanilla.inference.translation import check_input_length
from hf_vanilla.io.atomic import atomic_file
from hf_vanilla.io.checkpoints import TRAINER_STATE_NAME, checkpoint_folders
from hf_vanilla.io.errors import CheckpointDeletedError
from hf_vanilla.io.json_files import read_json
from hf_vanilla.models.vanilla_transformer.modeling_vanilla_transformer import sinusoidal_position_encoding

logger = logging.getLogger(__name__)

__all__ = [
    "ATTENTION_KINDS",
    "AttentionMaps",
    "attention_maps",
    "attention_masks",
    "attention_mean_figure",
    "cross_attention",
    "cross_attention_for_pair",
    "head_distances",
    "label_smoothing_floor",
    "load_log_history",
    "plot_attention",
    "plot_attention_grid",
    "plot_attention_masks",
    "plot_attention_mean",
    "plot_head_distances",
    "plot_positional_encoding",
    "plot_training_curves",
    "token_labels",
]


#: The most pixels a picture may have (100 million: 400 MB to draw); far more than any screen or print
#: needs, and a larger one is refused before drawing, which would exhaust the memory.
LARGEST_PICTURE = 100_000_000

#: The most values the positional-encoding picture draws (positions × d_model).
LARGEST_ENCODING = 1 << 24


def _save(fig: Figure, path: str | Path, dpi: int) -> Path:
    """Render ``fig`` on an Agg canvas and write it as a PNG file (creating parent folders; under a
    temporary name, renamed into place when written)."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"Pictures are written as PNG: give a path ending in .png, got {str(path)!r}.")
    if dpi < 1:
        raise ValueError(f"--dpi {dpi}: give a positive resolution, in dots per inch (e.g. 100).")
    width, height = (int(inches * dpi) for inches in fig.get_size_inches())
    if width * height > LARGEST_PICTURE:
        raise ValueError(
            f"--dpi {dpi}: the picture would be {width} × {height} pixels; give a lower resolution (a few hundred "
            f"at most; the picture may have at most {LARGEST_PICTURE:,} pixels)."
        )
    FigureCanvasAgg(fig)
    with atomic_file(path, binary=True) as handle:
        fig.savefig(handle, dpi=dpi, format="png")
    logger.info("Wrote %s", path)
    return path


# --------------------------------------------------------------------------------------------------
# Cross-attention (§3.2.3: "queries come from the previous decoder layer, and the memory keys and
# values come from the output of the encoder")
# --------------------------------------------------------------------------------------------------


def _byte_level_alphabet() -> dict[str, int]:
    """The byte-level BPE alphabet (GPT-2's ``bytes_to_unicode``, used by ``tokenizers``' ``ByteLevel``):
    each byte is written as one printable character (printable Latin-1 bytes as themselves, the others
    from U+0100 on, so the space byte is ``Ġ``). Returns character → byte."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    alphabet = {chr(byte): byte for byte in printable}
    shifted = 256
    for byte in range(256):
        if byte not in printable:
            alphabet[chr(shifted)] = byte
            shifted += 1
    return alphabet


def _utf8_length(lead: int) -> int:
    """Bytes of the UTF-8 sequence that starts with ``lead`` (1 for a byte that cannot start one)."""
    if lead >= 0xF0:
        return 4
    if lead >= 0xE0:
        return 3
    if lead >= 0xC0:
        return 2
    return 1


def _readable(text: str) -> str:
    return text.strip() or "␣"


def token_labels(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """The text of each token, for axis labels: ``Ġthousand`` → ``thousand``, ``fÃ¼nf`` → ``fünf``.

    For a byte-level BPE (a ``ByteLevel`` decoder, as :mod:`hf_vanilla.data.tokenization` trains) the
    tokens' bytes are decoded as UTF-8 together, and each token is labelled with the characters its
    bytes belong to: a character split over two tokens (``ü`` is two bytes) labels both, and bytes
    that are no valid UTF-8 show as U+FFFD (�). Other tokenizers decode each token alone. Special
    tokens keep their names (``</s>``); surrounding whitespace is dropped, and a token of only
    whitespace is shown as ``␣``.
    """
    ids = [int(token_id) for token_id in ids]
    special = set(tokenizer.all_special_ids)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not isinstance(backend.decoder, decoders.ByteLevel):
        return [
            tokenizer.convert_ids_to_tokens(token_id)
            if token_id in special
            else _readable(tokenizer.decode([token_id], clean_up_tokenization_spaces=False))
            for token_id in ids
        ]
    alphabet = _byte_level_alphabet()
    labels = [""] * len(ids)
    owners: list[int] = []  # the token index of each byte of the current run of non-special tokens
    data = bytearray()

    def label_run() -> None:
        start = 0
        while start < len(data):
            end = min(start + _utf8_length(data[start]), len(data))
            try:
                char = bytes(data[start:end]).decode("utf-8")
            except UnicodeDecodeError:
                char, end = "\ufffd", start + 1
            for owner in dict.fromkeys(owners[start:end]):
                labels[owner] += char
            start = end
        owners.clear()
        data.clear()

    for index, (token_id, piece) in enumerate(zip(ids, tokenizer.convert_ids_to_tokens(ids), strict=True)):
        if token_id in special:
            label_run()
            labels[index] = piece
            continue
        for char in piece:  # a character outside the alphabet (an added token) stands for its UTF-8 bytes
            encoded = bytes([alphabet[char]]) if char in alphabet else char.encode("utf-8")
            data.extend(encoded)
            owners.extend([index] * len(encoded))
    label_run()
    return [label if ids[index] in special else _readable(label) for index, label in enumerate(labels)]


def _check_attention(
    attentions: np.ndarray, source_tokens: Sequence[str], target_tokens: Sequence[str]
) -> None:
    if attentions.ndim != 4:
        raise ValueError(
            "`attentions` must have shape (layers, heads, target_len, source_len), "
            f"got an array with shape {attentions.shape}."
        )
    _, _, tgt_len, src_len = attentions.shape
    if (tgt_len, src_len) != (len(target_tokens), len(source_tokens)):
        raise ValueError(
            f"`attentions` covers {tgt_len} target × {src_len} source positions but {len(target_tokens)} target "
            f"and {len(source_tokens)} source tokens were given: pass one label per position."
        )


def _heatmap(ax: Any, weights: np.ndarray, source_tokens: Sequence[str], target_tokens: Sequence[str]) -> Any:
    image = ax.imshow(weights, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(len(source_tokens)))
    ax.set_xticklabels(source_tokens, rotation=90, fontsize=7)
    ax.set_yticks(range(len(target_tokens)))
    ax.set_yticklabels(target_tokens, fontsize=7)
    return image


@dataclass(frozen=True)
class AttentionKind:
    """How the pictures name one of the three attentions of §3.2.3."""

    title: str
    keys: str  # x-axis title
    queries: str  # y-axis title
    caption: str
    file_prefix: str


#: The three attentions of §3.2.3, by the names :func:`attention_maps` gives them.
ATTENTION_KINDS: dict[str, AttentionKind] = {
    "encoder": AttentionKind(
        "Encoder self-attention",
        "key: source token",
        "query: source token",
        "Row = one source token asking; columns = the source tokens it reads; each row sums to 1.",
        "encoder_self_attention",
    ),
    "decoder": AttentionKind(
        "Decoder masked self-attention",
        "key: decoder input token",
        "query: decoder input token",
        "Row = one decoder position (its input token); above the diagonal is masked: no peeking ahead.",
        "decoder_self_attention",
    ),
    "cross": AttentionKind(
        "Encoder-decoder attention",
        "key: source token (encoder output)",
        "query: target token predicted there",
        "Queries from the decoder, keys and values from the encoder; row t is where the model looked "
        "to write target token t.",
        "cross_attention",
    ),
}


def plot_attention_grid(
    attentions: np.ndarray,
    source_tokens: Sequence[str],
    target_tokens: Sequence[str],
    path: str | Path,
    title: str = ATTENTION_KINDS["cross"].title,
    dpi: int = 100,
    xlabel: str = ATTENTION_KINDS["cross"].keys,
    ylabel: str = ATTENTION_KINDS["cross"].queries,
    caption: str = ATTENTION_KINDS["cross"].caption,
) -> Path:
    """Draw one heatmap per (layer, head) and a last column with the mean over the heads.

    Args:
        attentions: weights of shape (layers, heads, queries, keys); each row sums to 1.
        source_tokens: x-axis labels (keys; for cross-attention the encoder positions).
        target_tokens: y-axis labels (queries; for cross-attention the decoder positions, labelled by
            the token predicted there).
        path: PNG file to write.
        xlabel, ylabel: the axis titles (of the bottom row and the first column).
        caption: a line under the pictures saying how to read them.
    """
    attentions = np.asarray(attentions, dtype=np.float32)
    _check_attention(attentions, source_tokens, target_tokens)
    n_layers, n_heads, tgt_len, src_len = attentions.shape
    cell_w = max(2.0, 0.22 * src_len + 0.8)
    cell_h = max(2.0, 0.22 * tgt_len + 0.8)
    fig = Figure(figsize=(cell_w * (n_heads + 1), cell_h * n_layers + 0.4), layout="constrained")
    axes = fig.subplots(n_layers, n_heads + 1, squeeze=False)
    image = None
    for layer in range(n_layers):
        for head in range(n_heads + 1):
            ax = axes[layer][head]
            if head < n_heads:
                weights, label = attentions[layer, head], f"layer {layer + 1}, head {head + 1}"
            else:
                weights, label = attentions[layer].mean(axis=0), f"layer {layer + 1}, mean of heads"
            image = _heatmap(ax, weights, source_tokens, target_tokens)
            ax.set_title(label, fontsize=8)
            if layer == n_layers - 1:
                ax.set_xlabel(xlabel, fontsize=7)
            if head == 0:
                ax.set_ylabel(ylabel, fontsize=7)
    fig.suptitle(title)
    fig.supxlabel(caption, fontsize=8)
    fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    return _save(fig, path, dpi)


def attention_mean_figure(
    attentions: np.ndarray,
    source_tokens: Sequence[str],
    target_tokens: Sequence[str],
    title: str = "Encoder-decoder attention, mean over layers and heads",
) -> Figure:
    """The attention averaged over all layers and heads as one heatmap (a soft alignment), as a
    matplotlib ``Figure`` (the web demo shows it; :func:`plot_attention_mean` writes it)."""
    attentions = np.asarray(attentions, dtype=np.float32)
    _check_attention(attentions, source_tokens, target_tokens)
    _, _, tgt_len, src_len = attentions.shape
    fig = Figure(figsize=(max(4.0, 0.35 * src_len + 2), max(3.0, 0.35 * tgt_len + 1.5)), layout="constrained")
    ax = fig.subplots()
    image = _heatmap(ax, attentions.mean(axis=(0, 1)), source_tokens, target_tokens)
    ax.set_xlabel("source")
    ax.set_ylabel("target")
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, label="attention weight")
    return fig


def plot_attention_mean(
    attentions: np.ndarray,
    source_tokens: Sequence[str],
    target_tokens: Sequence[str],
    path: str | Path,
    title: str = "Encoder-decoder attention, mean over layers and heads",
    dpi: int = 100,
) -> Path:
    """Write :func:`attention_mean_figure` as a PNG file."""
    return _save(attention_mean_figure(attentions, source_tokens, target_tokens, title), path, dpi)


@contextlib.contextmanager
def _eval_mode(model: Any) -> Iterator[None]:
    """The model in eval mode (no dropout) for the block, then back in the mode it was in."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _translation_ids(model: Any, tokenizer: Any, source: str, **generate_kwargs: Any) -> torch.Tensor:
    """The model's own translation of ``source`` as target ids (beam search with the paper's §6.1
    settings, overridable by ``generate_kwargs``), without the decoder start token and padding."""
    device = next(model.parameters()).device
    encoded = tokenizer(source, return_tensors="pt").to(device)
    check_input_length(model, tokenizer, encoded["input_ids"].shape[1], where="--sentence")
    kwargs = {**paper_generation_kwargs(), **generate_kwargs}
    with _eval_mode(model), torch.no_grad():
        generated = model.generate(**encoded, **kwargs)[0]
    target_ids = generated[1:] if int(generated[0]) == model.config.decoder_start_token_id else generated
    return target_ids[target_ids != model.config.pad_token_id]


def _target_ids(
    model: Any, tokenizer: Any, source: str, target: str | None, **generate_kwargs: Any
) -> torch.Tensor:
    if target is None:
        return _translation_ids(model, tokenizer, source, **generate_kwargs)
    device = next(model.parameters()).device
    return tokenizer(text_target=target, return_tensors="pt")["input_ids"][0].to(device)


def cross_attention_for_pair(
    model: Any,
    tokenizer: Any,
    source: str,
    target: str | None = None,
    **generate_kwargs: Any,
) -> tuple[np.ndarray, list[str], list[str]]:
    """Run the model on one sentence pair and return its cross-attention weights and token labels.

    If ``target`` is None the model's own translation (beam search with the paper's §6.1 settings
    from :mod:`hf_vanilla.inference.translation`, overridable by ``generate_kwargs``) is used, so the picture
    shows where the model looked while producing its output.

    Returns:
        ``(attentions, source_tokens, target_tokens)``; the tokens are readable labels
        (:func:`token_labels`), one per position; attentions has shape
        (layers, heads, target_len, source_len). Row *t* is the decoder position that predicts
        target token *t* (its input is the previous token, starting from the decoder start token).
    """
    return cross_attention(
        model, tokenizer, source, _target_ids(model, tokenizer, source, target, **generate_kwargs)
    )


@dataclass(frozen=True)
class AttentionMaps:
    """The attention weights of one sentence pair, as (layers, heads, queries, keys) arrays.

    ``source_tokens`` label the encoder positions, ``decoder_input_tokens`` the decoder's inputs (the
    start token, then the target shifted right) and ``target_tokens`` the tokens predicted at each decoder
    position.
    """

    encoder: np.ndarray  # (layers, heads, source_len, source_len)
    decoder: np.ndarray  # (layers, heads, target_len, target_len), zero above the diagonal
    cross: np.ndarray  # (layers, heads, target_len, source_len)
    source_tokens: list[str]
    decoder_input_tokens: list[str]
    target_tokens: list[str]


def attention_maps(
    model: Any, tokenizer: Any, source: str, target_ids: torch.Tensor | Sequence[int]
) -> AttentionMaps:
    """The weights of all three attentions of ``source`` → ``target_ids`` (a target as token ids, without
    the decoder start token), computed with teacher forcing: the decoder reads the start token and the
    target shifted right, as in training. A source longer than the model's longest input
    (:func:`hf_vanilla.inference.translation.check_input_length`, as for translation) raises
    :class:`hf_vanilla.inference.translation.InputTooLongError`."""
    device = next(model.parameters()).device
    encoded = tokenizer(source, return_tensors="pt").to(device)
    check_input_length(model, tokenizer, encoded["input_ids"].shape[1], where="--sentence")
    start = model.config.decoder_start_token_id
    target_ids = torch.as_tensor(target_ids, device=device).flatten()
    decoder_input_ids = torch.cat([torch.tensor([start], device=device), target_ids[:-1]]).unsqueeze(0)
    with _eval_mode(model), torch.no_grad():
        outputs = model(**encoded, decoder_input_ids=decoder_input_ids, output_attentions=True)
    if not outputs.cross_attentions or outputs.cross_attentions[0] is None:
        raise RuntimeError(
            f"{type(model).__name__} returned no attention weights for output_attentions=True; load it "
            "with attn_implementation='eager' (from_pretrained(..., attn_implementation='eager'))."
        )

    def stacked(layers: Sequence[torch.Tensor]) -> np.ndarray:
        return torch.stack([layer[0] for layer in layers]).float().cpu().numpy()

    return AttentionMaps(
        encoder=stacked(outputs.encoder_attentions),
        decoder=stacked(outputs.decoder_attentions),
        cross=stacked(outputs.cross_attentions),
        source_tokens=token_labels(tokenizer, encoded["input_ids"][0].tolist()),
        decoder_input_tokens=token_labels(tokenizer, decoder_input_ids[0].tolist()),
        target_tokens=token_labels(tokenizer, target_ids.tolist()),
    )


def cross_attention(
    model: Any, tokenizer: Any, source: str, target_ids: torch.Tensor | Sequence[int]
) -> tuple[np.ndarray, list[str], list[str]]:
    """The cross-attention weights of ``source`` → ``target_ids`` and the readable labels of both sides
    (:func:`attention_maps`' ``cross``, ``source_tokens`` and ``target_tokens``); see
    :func:`cross_attention_for_pair` for the shapes."""
    maps = attention_maps(model, tokenizer, source, target_ids)
    return maps.cross, maps.source_tokens, maps.target_tokens


def plot_attention(
    model: Any,
    tokenizer: Any,
    source: str,
    output_dir: str | Path,
    target: str | None = None,
    dpi: int = 100,
) -> list[Path]:
    """Write the three attentions of one sentence pair, one grid (layers × heads) each:
    ``encoder_self_attention_grid.png``, ``decoder_self_attention_grid.png``,
    ``cross_attention_grid.png``, and ``cross_attention_mean.png`` (the cross-attention averaged over
    layers and heads). See :func:`cross_attention_for_pair` for how the target side is chosen."""
    maps = attention_maps(model, tokenizer, source, _target_ids(model, tokenizer, source, target))
    output_dir = Path(output_dir)
    axes = {
        "encoder": (maps.source_tokens, maps.source_tokens),
        "decoder": (maps.decoder_input_tokens, maps.decoder_input_tokens),
        "cross": (maps.source_tokens, maps.target_tokens),
    }
    written = []
    for name, kind in ATTENTION_KINDS.items():
        keys, queries = axes[name]
        written.append(
            plot_attention_grid(
                getattr(maps, name),
                keys,
                queries,
                output_dir / f"{kind.file_prefix}_grid.png",
                title=kind.title,
                dpi=dpi,
                xlabel=kind.keys,
                ylabel=kind.queries,
                caption=kind.caption,
            )
        )
    written.append(
        plot_attention_mean(
            maps.cross,
            maps.source_tokens,
            maps.target_tokens,
            output_dir / "cross_attention_mean.png",
            dpi=dpi,
        )
    )
    return written


# --------------------------------------------------------------------------------------------------
# Masks (§3.2.3): padding keys are hidden from every attention, later positions from the decoder's
# --------------------------------------------------------------------------------------------------


def _may_attend(mask: torch.Tensor | None, shape: tuple[int, int, int]) -> np.ndarray:
    """A mask as an attention kernel receives it → booleans (batch, queries, keys), True = may attend.
    None attends everywhere; a boolean mask is True where attending; an additive one is 0 there."""
    if mask is None:
        return np.ones(shape, dtype=bool)
    allowed = mask if mask.dtype == torch.bool else mask == 0
    return allowed.expand(shape[0], 1, shape[1], shape[2])[:, 0].cpu().numpy()


def attention_masks(model: Any, tokenizer: Any, pairs: Sequence[tuple[str, str | None]]) -> dict[str, Any]:
    """The masks each attention of the first layers receives for a padded batch of (source, target)
    pairs, as the model builds them: booleans (batch, queries, keys), True = this query may read this key.
    A target None is the model's own translation.

    The decoder is given its padding (``decoder_attention_mask``), so its mask is the causal mask and
    the padding mask combined. Returns ``{"encoder", "decoder", "cross"}`` masks and
    ``{"source_tokens", "decoder_input_tokens"}``: one list of labels per row, ``<pad>`` included.
    """
    device = next(model.parameters()).device
    encoded = tokenizer([source for source, _ in pairs], padding=True, return_tensors="pt").to(device)
    check_input_length(model, tokenizer, encoded["input_ids"].shape[1], where="--sentence")
    pad, start = model.config.pad_token_id, model.config.decoder_start_token_id
    labels = torch.nn.utils.rnn.pad_sequence(
        [_target_ids(model, tokenizer, source, target) for source, target in pairs],
        batch_first=True,
        padding_value=pad,
    )
    decoder_input_ids = torch.cat([torch.full_like(labels[:, :1], start), labels[:, :-1]], dim=1)
    decoder_attention_mask = torch.cat([torch.ones_like(labels[:, :1]), labels[:, :-1] != pad], dim=1).long()
    encoder_layer, decoder_layer = model.get_encoder().layers[0], model.get_decoder().layers[0]
    modules = {
        "encoder": encoder_layer.self_attn,
        "decoder": decoder_layer.self_attn,
        "cross": decoder_layer.encoder_attn,
    }
    received: dict[str, torch.Tensor | None] = {}

    def recorder(name: str) -> Any:
        def record(_module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
            received.setdefault(name, kwargs.get("attention_mask"))

        return record

    hooks = [
        module.register_forward_pre_hook(recorder(name), with_kwargs=True) for name, module in modules.items()
    ]
    try:
        with _eval_mode(model), torch.no_grad():
            model(
                **encoded,
                decoder_input_ids=decoder_input_ids,
                decoder_attention_mask=decoder_attention_mask,
                output_attentions=True,
            )
    finally:
        for hook in hooks:
            hook.remove()
    batch, source_len = encoded["input_ids"].shape
    target_len = decoder_input_ids.shape[1]
    shapes = {
        "encoder": (batch, source_len, source_len),
        "decoder": (batch, target_len, target_len),
        "cross": (batch, target_len, source_len),
    }
    masks: dict[str, Any] = {name: _may_attend(received.get(name), shape) for name, shape in shapes.items()}
    masks["source_tokens"] = [token_labels(tokenizer, row.tolist()) for row in encoded["input_ids"]]
    masks["decoder_input_tokens"] = [token_labels(tokenizer, row.tolist()) for row in decoder_input_ids]
    return masks


def plot_attention_masks(
    model: Any, tokenizer: Any, pairs: Sequence[tuple[str, str | None]], path: str | Path, dpi: int = 100
) -> Path:
    """Draw :func:`attention_masks` for a batch of (source, target) pairs: one row per pair, one column
    per attention; light = the query may read the key, dark = masked."""
    masks = attention_masks(model, tokenizer, pairs)
    rows = len(pairs)
    source_len, target_len = len(masks["source_tokens"][0]), len(masks["decoder_input_tokens"][0])
    fig = Figure(
        figsize=(3 * (0.18 * source_len + 1.2) + 0.18 * target_len, rows * (0.18 * target_len + 1.6) + 0.5),
        layout="constrained",
    )
    axes = fig.subplots(rows, 3, squeeze=False, width_ratios=[source_len, target_len, source_len])
    titles = {
        "encoder": "encoder self: padding mask",
        "decoder": "decoder self: causal ∧ padding",
        "cross": "encoder-decoder: padding mask",
    }
    for row in range(rows):
        source, decoder_input = masks["source_tokens"][row], masks["decoder_input_tokens"][row]
        for ax, (name, (keys, queries)) in zip(
            axes[row],
            {
                "encoder": (source, source),
                "decoder": (decoder_input, decoder_input),
                "cross": (source, decoder_input),
            }.items(),
            strict=True,
        ):
            ax.imshow(
                masks[name][row], cmap="Greys_r", vmin=-0.3, vmax=1, aspect="equal", interpolation="nearest"
            )
            ax.set_xticks(range(len(keys)))
            ax.set_xticklabels(keys, rotation=90, fontsize=6)
            ax.set_yticks(range(len(queries)))
            ax.set_yticklabels(queries, fontsize=6)
            ax.set_title(f"row {row + 1}, {titles[name]}", fontsize=7)
            if row == rows - 1:
                ax.set_xlabel("key", fontsize=7)
            if name == "encoder":
                ax.set_ylabel("query", fontsize=7)
    fig.suptitle("Attention masks of a padded batch (light: may attend, dark: masked)", fontsize=9)
    return _save(fig, path, dpi)


# --------------------------------------------------------------------------------------------------
# How different the heads are
# --------------------------------------------------------------------------------------------------


def head_distances(
    model: Any, tokenizer: Any, pairs: Sequence[tuple[str, str | None]]
) -> dict[str, np.ndarray]:
    """How different the heads of each layer attend, averaged over (source, target) pairs (a target None
    is the model's own translation).

    For two heads, the distance is the total-variation distance of their attention rows (half the sum
    of absolute differences: 0 = the same weights, 1 = no key in common), averaged over the query
    positions; a layer's number is the mean over all pairs of its heads. Returns one (layers,) array per
    attention, ``{"encoder", "decoder", "cross"}``.
    """
    totals: dict[str, np.ndarray] = {}
    for source, target in pairs:
        maps = attention_maps(model, tokenizer, source, _target_ids(model, tokenizer, source, target))
        for name in ATTENTION_KINDS:
            weights = getattr(maps, name)  # (layers, heads, queries, keys)
            heads = weights.shape[1]
            if heads < 2:
                raise ValueError(
                    f"The model has {heads} head per layer: there is no pair of heads to compare."
                )
            first, second = np.triu_indices(heads, k=1)
            distance = 0.5 * np.abs(weights[:, first] - weights[:, second]).sum(
                -1
            )  # (layers, pairs, queries)
            totals[name] = totals.get(name, 0) + distance.mean(axis=(1, 2))
    if not totals:
        raise ValueError("Give at least one (source, target) pair to compare the heads on.")
    return {name: total / len(pairs) for name, total in totals.items()}


#: How :func:`plot_head_distances` names each attention.
_ATTENTION_TITLES = {
    "encoder": "encoder self-attention",
    "decoder": "decoder masked self-attention",
    "cross": "encoder-decoder attention",
}


def plot_head_distances(
    path: str | Path,
    initialisation: dict[str, Sequence[float]],
    trained: dict[str, Sequence[float]],
    dpi: int = 72,
) -> Path:
    """Draw :func:`head_distances` before and after training: one panel per attention, a pair of bars per
    layer (freshly initialised, trained) on the measure's whole scale, 0 (alike) to 1 (no key in common)."""
    names = [name for name in ATTENTION_KINDS if name in initialisation]
    fig = Figure(figsize=(3.2 * len(names), 3.0), layout="constrained")
    axes = fig.subplots(1, len(names), sharey=True, squeeze=False)[0]
    for ax, name in zip(axes, names, strict=True):
        layers = np.arange(1, len(initialisation[name]) + 1)
        ax.bar(layers - 0.2, initialisation[name], width=0.4, label="freshly initialised", color="#bbbbbb")
        ax.bar(layers + 0.2, trained[name], width=0.4, label="trained", color="#1f77b4")
        ax.set_title(_ATTENTION_TITLES.get(name, name), fontsize=9)
        ax.set_xticks(layers)
        ax.set_xlabel("layer")
        ax.set_ylim(0, 1)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("distance between heads\n(0 = alike, 1 = no key in common)")
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle("How differently the heads of a layer attend", fontsize=10)
    return _save(fig, path, dpi)


# --------------------------------------------------------------------------------------------------
# Positional encoding (§3.5)
# --------------------------------------------------------------------------------------------------


def plot_positional_encoding(
    path: str | Path,
    num_positions: int = 100,
    d_model: int = 512,
    encoding: np.ndarray | None = None,
    dpi: int = 100,
) -> Path:
    """Draw the positional-encoding matrix (positions on the y axis, dimensions on the x axis, ticked
    by the paper's pair index i) and, beside it, the sine and cosine of one frequency as smooth curves
    with the integer positions marked.

    Args:
        encoding: a (positions, d_model) matrix to draw in the paper's layout (sin in column 2i, cos in
            column 2i + 1); by default the model's own §3.5 encoding (``sinusoidal_position_encoding``)
            for ``num_positions`` × ``d_model``.
    """
    if encoding is None:
        if num_positions <= 0 or d_model <= 0 or d_model % 2:
            raise ValueError(
                f"--num_positions {num_positions}, --d_model {d_model}: give a positive number of positions and a "
                "positive, even d_model."
            )
        if num_positions * d_model > LARGEST_ENCODING:
            raise ValueError(
                f"--num_positions {num_positions} × d_model {d_model}: more values than the picture can show (at "
                f"most {LARGEST_ENCODING:,}); give fewer positions (or a smaller --d_model)."
            )
        encoding = sinusoidal_position_encoding(torch.arange(num_positions), d_model).numpy()
    encoding = np.asarray(encoding, dtype=np.float32)
    if encoding.ndim != 2 or encoding.shape[1] % 2:
        raise ValueError(
            f"`encoding` must be a (positions, d_model) matrix with even d_model, got shape {encoding.shape}."
        )
    n_pos, dim = encoding.shape
    fig = Figure(figsize=(10, 5), layout="constrained")
    ax_map, ax_curves = fig.subplots(1, 2, width_ratios=[3, 2])
    image = ax_map.imshow(encoding, cmap="RdBu", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    pairs = dim // 2
    ticks = sorted({0, *range(0, pairs, max(1, pairs // 8)), pairs - 1})
    ax_map.set_xticks([2 * i + 0.5 for i in ticks])
    ax_map.set_xticklabels([str(i) for i in ticks])
    ax_map.set_xlabel("pair index i (column 2i: sin, column 2i + 1: cos)")
    ax_map.set_ylabel("position pos")
    ax_map.set_title(f"Sinusoidal positional encoding (§3.5), {n_pos} positions × d_model {dim}")
    fig.colorbar(image, ax=ax_map)
    # one frequency whose wavelength is about a third of the positions drawn, so that it is seen to turn
    wavelengths = 2 * np.pi * 10000.0 ** (2 * np.arange(pairs) / dim)
    pair = int(np.argmin(np.abs(wavelengths - n_pos / 3)))
    smooth = np.linspace(0, n_pos - 1, 20 * n_pos)
    angle = 1.0 / 10000.0 ** (2 * pair / dim)
    ax_curves.plot(smooth, np.sin(smooth * angle), color="tab:blue", label=f"sin, column {2 * pair}")
    ax_curves.plot(smooth, np.cos(smooth * angle), color="tab:orange", label=f"cos, column {2 * pair + 1}")
    ax_curves.plot(np.arange(n_pos), encoding[:, 2 * pair], "o", color="tab:blue", markersize=2)
    ax_curves.plot(np.arange(n_pos), encoding[:, 2 * pair + 1], "o", color="tab:orange", markersize=2)
    ax_curves.set_xlabel("position pos (dots: integer positions)")
    ax_curves.set_title(f"Pair index i = {pair}: wavelength {wavelengths[pair]:.1f} positions", fontsize=10)
    ax_curves.legend(fontsize=7, loc="lower left")
    return _save(fig, path, dpi)


# --------------------------------------------------------------------------------------------------
# Training curves from a Trainer output folder
# --------------------------------------------------------------------------------------------------


def load_log_history(run: str | Path) -> list[dict[str, Any]]:
    """Read ``log_history`` from ``trainer_state.json``.

    ``run`` is the file itself, a Trainer ``output_dir`` (the file at its top level, written at the end of
    training) or a folder whose newest ``checkpoint-*`` subfolder holds it. A checkpoint deleted between
    listing and reading (a training run rotating its checkpoints) makes it list them again; raises
    :class:`~hf_vanilla.io.errors.CheckpointDeletedError` if that keeps happening.
    """
    run = Path(run)
    if run.is_file():
        return _log_history(run)
    for _ in range(_LISTINGS):  # a training run may rotate the newest checkpoint away while it is read
        newest_first = [c / TRAINER_STATE_NAME for c in reversed(checkpoint_folders(run))]
        for candidate in [run / TRAINER_STATE_NAME, *newest_first]:
            try:
                return _log_history(candidate)
            except FileNotFoundError:
                if candidate.parent != run and not candidate.parent.is_dir():
                    break  # deleted since it was listed: a newer checkpoint holds the log now
        else:
            raise FileNotFoundError(
                f"No trainer_state.json in {run} or its checkpoint-* folders: pass a Trainer output_dir, a "
                "checkpoint folder or the JSON file itself."
            )
    raise CheckpointDeletedError(candidate.parent)


#: How often :func:`load_log_history` lists a run's checkpoints again when the newest is deleted meanwhile.
_LISTINGS = 3


def _log_history(path: Path) -> list[dict[str, Any]]:
    state = read_json(path)
    if "log_history" not in state:
        raise ValueError(f"{path} has no `log_history`: is it a Trainer's trainer_state.json?")
    return list(state["log_history"])


def _series(history: Sequence[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    rows = [row for row in history if key in row and "step" in row]
    return [float(row["step"]) for row in rows], [float(row[key]) for row in rows]


def label_smoothing_floor(smoothing: float, vocab_size: int) -> float:
    """The lowest label-smoothed loss per token (§5.4, as ``smoothed_cross_entropy_sum`` spreads ε/V over
    the whole vocabulary): the entropy of the smoothed target q, with q = 1 − ε + ε/V on the reference
    token and ε/V on each other token. A model that is always right still pays it."""
    if not 0 <= smoothing < 1 or vocab_size < 2:
        raise ValueError(
            f"--label_smoothing {smoothing} with a vocabulary of {vocab_size}: give a label smoothing from 0 up "
            "to, not including, 1 (the paper's is 0.1) and a vocabulary of at least 2 tokens."
        )
    if smoothing == 0:
        return 0.0
    right, other = 1 - smoothing + smoothing / vocab_size, smoothing / vocab_size
    return float(-right * np.log(right) - (vocab_size - 1) * other * np.log(other))


def plot_training_curves(
    run: str | Path | Sequence[dict[str, Any]],
    path: str | Path,
    bleu_key: str = "eval_bleu",
    dpi: int = 100,
    bleu_name: str = "BLEU",
    loss_floor: float | None = None,
) -> Path:
    """Plot against the step: the label-smoothed training and validation loss with the unsmoothed
    validation NLL per target token (``eval_nll_loss``), the validation perplexity exp(NLL)
    (``eval_ppl``), validation BLEU on its whole 0–100 scale and the learning rate.

    Args:
        run: a Trainer output folder / ``trainer_state.json`` (see :func:`load_log_history`) or a
            ``log_history`` list itself.
        bleu_key: the logged key holding validation BLEU.
        bleu_name: what that BLEU is, for the panel's title (e.g. "character BLEU").
        loss_floor: the label-smoothing floor of the loss (:func:`label_smoothing_floor`), drawn as a line.
    """
    history = load_log_history(run) if isinstance(run, (str, Path)) else list(run)
    _, rates = _series(history, "learning_rate")
    schedule = "linear warmup, then ∝ 1/√step (Eq. 3's shape)"
    panels = {
        "loss per target token": [
            ("training loss (smoothed)", *_series(history, "loss")),
            ("validation loss (smoothed)", *_series(history, "eval_loss")),
            ("validation NLL", *_series(history, "eval_nll_loss")),
        ],
        "validation perplexity": [("exp(NLL)", *_series(history, "eval_ppl"))],
        f"validation {bleu_name} (0–100)": [(bleu_name, *_series(history, bleu_key))],
        f"learning rate, peak {max(rates):.3g}" if rates else "learning rate": [
            (schedule, *_series(history, "learning_rate"))
        ],
    }
    if not any(steps for series in panels.values() for _, steps, _ in series):
        raise ValueError(
            f"The log history has no 'loss', 'eval_loss', 'eval_nll_loss', 'eval_ppl', {bleu_key!r} or "
            "'learning_rate' entries with a 'step': train with logging enabled (e.g. logging_steps) before "
            "plotting."
        )
    fig = Figure(figsize=(20, 4), layout="constrained")
    for ax, (title, series) in zip(fig.subplots(1, len(panels)), panels.items(), strict=True):
        drawn = False
        for label, steps, values in series:
            if steps:
                ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=label)
                drawn = True
        if title.startswith("loss") and loss_floor is not None:
            ax.axhline(
                loss_floor, color="grey", linestyle="--", label=f"label-smoothing floor {loss_floor:.3f}"
            )
            drawn = True
        if title == "validation perplexity" and drawn:
            # from its least possible value, 1, and at least to 2: a small range is not magnified
            ax.set_ylim(1.0, max(2.0, ax.get_ylim()[1]))
        if title.startswith(f"validation {bleu_name}"):
            ax.set_ylim(0, 102)  # the whole scale: a tiny range is not magnified
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    return _save(fig, path, dpi)
