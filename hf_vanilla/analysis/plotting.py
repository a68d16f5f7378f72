"""Pictures of a trained model: cross-attention maps, the positional encoding, training curves.

All figures are drawn with matplotlib's object-oriented API on an Agg canvas (no pyplot, no global
backend switch, no display needed) and saved as PNG files:

* :func:`plot_cross_attention` — encoder-decoder attention (§3.2.3) of one sentence pair: one
  heatmap per layer × head plus the mean over heads, source tokens on the x axis, target tokens on
  the y axis (the style of the paper's Figures 3–5, which show self-attention). The tick labels are
  the decoded text of each token (:func:`token_labels`), not the byte-level BPE symbols.
* :func:`plot_positional_encoding` — the sinusoidal encoding matrix of §3.5, positions × dimensions.
* :func:`plot_training_curves` — training/validation loss (label-smoothed, and the unsmoothed
  validation NLL), validation perplexity, validation BLEU and the learning rate (§5.3, Eq. 3) from
  the ``log_history`` of a Trainer's ``trainer_state.json``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
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
from hf_vanilla.io.errors import CheckpointDeletedError
from hf_vanilla.io.json_files import read_json
from hf_vanilla.io.safe_loading import checkpoint_folders
from hf_vanilla.models.vanilla_transformer.modeling_vanilla_transformer import sinusoidal_position_encoding

logger = logging.getLogger(__name__)

__all__ = [
    "attention_mean_figure",
    "cross_attention",
    "cross_attention_for_pair",
    "load_log_history",
    "plot_attention_grid",
    "plot_attention_mean",
    "plot_cross_attention",
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


def plot_attention_grid(
    attentions: np.ndarray,
    source_tokens: Sequence[str],
    target_tokens: Sequence[str],
    path: str | Path,
    title: str = "Encoder-decoder attention",
    dpi: int = 100,
) -> Path:
    """Draw one heatmap per (layer, head) and a last column with the mean over the heads.

    Args:
        attentions: weights of shape (layers, heads, target_len, source_len); each row sums to 1.
        source_tokens: x-axis labels (keys: encoder positions).
        target_tokens: y-axis labels (queries: decoder positions, labelled by the token predicted there).
        path: PNG file to write.
    """
    attentions = np.asarray(attentions, dtype=np.float32)
    _check_attention(attentions, source_tokens, target_tokens)
    n_layers, n_heads, tgt_len, src_len = attentions.shape
    cell_w = max(2.0, 0.22 * src_len + 0.8)
    cell_h = max(2.0, 0.22 * tgt_len + 0.8)
    fig = Figure(figsize=(cell_w * (n_heads + 1), cell_h * n_layers), layout="constrained")
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
    fig.suptitle(title)
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
    device = next(model.parameters()).device
    encoded = tokenizer(source, return_tensors="pt").to(device)
    check_input_length(model, tokenizer, encoded["input_ids"].shape[1], where="--sentence")
    start = model.config.decoder_start_token_id
    if target is None:
        kwargs = {**paper_generation_kwargs(), **generate_kwargs}
        with _eval_mode(model), torch.no_grad():
            generated = model.generate(**encoded, **kwargs)[0]
        target_ids = generated[1:] if int(generated[0]) == start else generated
        target_ids = target_ids[target_ids != model.config.pad_token_id]
    else:
        target_ids = tokenizer(text_target=target, return_tensors="pt")["input_ids"][0].to(device)
    return cross_attention(model, tokenizer, source, target_ids)


def cross_attention(
    model: Any, tokenizer: Any, source: str, target_ids: torch.Tensor | Sequence[int]
) -> tuple[np.ndarray, list[str], list[str]]:
    """The cross-attention weights of ``source`` → ``target_ids`` (a target as token ids, without the
    decoder start token, e.g. a translation ``generate()`` made) and the readable labels of both
    sides; see :func:`cross_attention_for_pair` for the shapes. A source longer than the
    model's longest input (:func:`hf_vanilla.inference.translation.check_input_length`, as for translation) raises
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
            f"{type(model).__name__} returned no cross-attention weights for output_attentions=True; load it "
            "with attn_implementation='eager' (from_pretrained(..., attn_implementation='eager'))."
        )
    attentions = torch.stack([layer[0] for layer in outputs.cross_attentions]).float().cpu().numpy()
    source_tokens = token_labels(tokenizer, encoded["input_ids"][0].tolist())
    target_tokens = token_labels(tokenizer, target_ids.tolist())
    return attentions, source_tokens, target_tokens


def plot_cross_attention(
    model: Any,
    tokenizer: Any,
    source: str,
    output_dir: str | Path,
    target: str | None = None,
    prefix: str = "cross_attention",
    dpi: int = 100,
) -> tuple[Path, Path]:
    """Write ``<prefix>_grid.png`` (layers × heads) and ``<prefix>_mean.png`` for one sentence.

    See :func:`cross_attention_for_pair` for how the target side is chosen.
    """
    attentions, source_tokens, target_tokens = cross_attention_for_pair(model, tokenizer, source, target)
    output_dir = Path(output_dir)
    grid = plot_attention_grid(
        attentions, source_tokens, target_tokens, output_dir / f"{prefix}_grid.png", dpi=dpi
    )
    mean = plot_attention_mean(
        attentions, source_tokens, target_tokens, output_dir / f"{prefix}_mean.png", dpi=dpi
    )
    return grid, mean


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
    """Draw the positional-encoding matrix (positions on the y axis, dimensions on the x axis).

    Args:
        encoding: a (positions, d_model) matrix to draw; by default the model's own §3.5 encoding
            (``sinusoidal_position_encoding``: sin on even, cos on odd dimensions) for
            ``num_positions`` × ``d_model``.
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
    if encoding.ndim != 2:
        raise ValueError(f"`encoding` must be a (positions, d_model) matrix, got shape {encoding.shape}.")
    n_pos, dim = encoding.shape
    fig = Figure(figsize=(10, 5), layout="constrained")
    ax_map, ax_curves = fig.subplots(1, 2, width_ratios=[3, 2])
    image = ax_map.imshow(encoding, cmap="RdBu", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    ax_map.set_xlabel("dimension i")
    ax_map.set_ylabel("position pos")
    ax_map.set_title(f"Sinusoidal positional encoding (§3.5), {n_pos} × {dim}")
    fig.colorbar(image, ax=ax_map)
    # even (sine) dimensions at falling frequencies: wavelengths grow geometrically from 2π (§3.5)
    for column in sorted({0, 2 * (dim // 16), 2 * (dim // 8), 2 * (dim // 4)}):
        ax_curves.plot(np.arange(n_pos), encoding[:, column], label=f"dimension {column}")
    ax_curves.set_xlabel("position pos")
    ax_curves.set_title("A few sine dimensions")
    ax_curves.legend(fontsize=7)
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
        newest_first = [c / "trainer_state.json" for c in reversed(checkpoint_folders(run))]
        for candidate in [run / "trainer_state.json", *newest_first]:
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


def plot_training_curves(
    run: str | Path | Sequence[dict[str, Any]],
    path: str | Path,
    bleu_key: str = "eval_bleu",
    dpi: int = 100,
) -> Path:
    """Plot against the step: the label-smoothed training and validation loss with the unsmoothed
    validation NLL per target token (``eval_nll_loss``), the validation perplexity exp(NLL)
    (``eval_ppl``), validation BLEU and the learning rate.

    Args:
        run: a Trainer output folder / ``trainer_state.json`` (see :func:`load_log_history`) or a
            ``log_history`` list itself.
        bleu_key: the logged key holding validation BLEU.
    """
    history = load_log_history(run) if isinstance(run, (str, Path)) else list(run)
    panels = {
        "loss per target token": [
            ("training loss (smoothed)", *_series(history, "loss")),
            ("validation loss (smoothed)", *_series(history, "eval_loss")),
            ("validation NLL", *_series(history, "eval_nll_loss")),
        ],
        "validation perplexity": [("exp(NLL)", *_series(history, "eval_ppl"))],
        "validation BLEU": [("BLEU", *_series(history, bleu_key))],
        "learning rate (§5.3, Eq. 3)": [("learning rate", *_series(history, "learning_rate"))],
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
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    return _save(fig, path, dpi)
