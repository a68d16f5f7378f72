"""Batched translation with the paper's decoding settings (Vaswani et al., 2017, §6.1).

§6.1: "We used beam search with a beam size of 4 and length penalty α = 0.6 [...]. We set the maximum
output length during inference to input length + 50, but terminate early when possible."

* **Beam size 4**: ``num_beams=4``.
* **Maximum output length = input length + 50**, per sentence: the model's ``generate()`` applies
  it on every call (the 50 is the generation config's ``max_length_offset``), so nothing is passed
  here; a ``max_new_tokens``/``max_length`` in ``generate_kwargs`` caps it further. "Input length"
  counts the unpadded source tokens (subwords, with any special token the tokenizer appends); the
  bound counts generated tokens including ``</s>``.
* **"Terminate early when possible"**: beam search stops when no running hypothesis can still beat
  the finished ones: transformers' ``early_stopping="never"``, the default of ``early_stopping``
  here. ``"true"`` stops as soon as ``num_beams`` hypotheses have finished, ``"false"`` uses HF's
  heuristic (``benchmarks/early_stopping.py`` compares them).
* **Length penalty α = 0.6**. The paper's α refers to the GNMT penalty (Wu et al., 2016, Eq. 14)
  lp(Y) = ((5 + |Y|) / 6)^α, score(Y) = log P(Y | X) / lp(Y). Hugging Face beam search has one fixed
  formula, score(Y) = log P(Y | X) / |Y|^α, applied inside the search when a hypothesis finishes. Two
  choices are offered (``length_penalty_type``):

  - ``"hf"`` (default): HF's |Y|^α inside the search. Exact beam search, not the paper's formula.
  - ``"gnmt"``: the paper's formula as **n-best rescoring**. The search runs with HF's |Y|^α; all
    ``num_beams`` finished hypotheses are returned, their summed log-probabilities are recovered
    (``sequences_scores × |Y|^α``, HF's own definition), divided by ((5 + |Y|) / 6)^α, and the best
    one is kept. It re-ranks the final beam; it does not change which hypotheses the search pruned.

  |Y| counts generated tokens including end-of-sentence (not the decoder start token) in both, as
  HF and tensor2tensor do.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal, TextIO

import torch
from transformers import AutoModelForSeq2SeqLM

from hf_vanilla.durability import atomic_file, refuse_to_replace
from hf_vanilla.quantization import check_route, from_pretrained_kwargs, quantize_loaded
from hf_vanilla.safe_loading import load_pretrained_checked
from hf_vanilla.tokenization import check_tokenizer_matches_config, load_tokenizer

logger = logging.getLogger(__name__)

LENGTH_PENALTY_TYPES = ("hf", "gnmt")
#: ``--early_stopping`` values and what ``generate()`` receives for each.
EARLY_STOPPING = {"true": True, "false": False, "never": "never"}

__all__ = [
    "EARLY_STOPPING",
    "LENGTH_PENALTY_TYPES",
    "DecodingOptions",
    "ModelArguments",
    "generate_ids",
    "gnmt_length_penalty",
    "load_model",
    "load_model_and_tokenizer",
    "nbest_log_probs",
    "paper_generation_kwargs",
    "resolve_device",
    "translate",
    "translate_stream",
]


@dataclass
class DecodingOptions:
    """Decoding settings; the defaults are the paper's (§6.1)."""

    num_beams: int = field(default=4, metadata={"help": "Beam size (§6.1: 4)."})
    length_penalty: float = field(default=0.6, metadata={"help": "Length penalty α (§6.1: 0.6)."})
    length_penalty_type: Literal["hf", "gnmt"] = field(
        default="hf",
        metadata={
            "help": "'hf': log P / |Y|^α inside HF beam search. 'gnmt': the paper's log P / ((5+|Y|)/6)^α "
            "(Wu et al., 2016), applied by rescoring the final num_beams-best list."
        },
    )
    early_stopping: Literal["never", "true", "false"] = field(
        default="never",
        metadata={
            "help": "When beam search stops. 'never': when no running hypothesis can beat the finished ones "
            "(§6.1's rule); 'true': as soon as num_beams hypotheses have finished; 'false': HF's heuristic."
        },
    )

    def __post_init__(self) -> None:
        if self.early_stopping not in EARLY_STOPPING:
            raise ValueError(
                f"`early_stopping` must be one of {sorted(EARLY_STOPPING)}, got {self.early_stopping!r}."
            )
        if self.length_penalty_type not in LENGTH_PENALTY_TYPES:
            raise ValueError(
                f"`length_penalty_type` must be one of {LENGTH_PENALTY_TYPES}, got {self.length_penalty_type!r}: "
                "'hf' = log P / |Y|^α inside beam search, 'gnmt' = log P / ((5 + |Y|) / 6)^α as n-best rescoring."
            )
        if not isinstance(self.num_beams, int) or self.num_beams < 1:
            raise ValueError(f"`num_beams` must be a positive integer, got {self.num_beams!r}.")
        if self.length_penalty_type == "gnmt" and self.num_beams < 2:
            raise ValueError("GNMT length-penalty rescoring needs an n-best list: use num_beams >= 2.")

    def describe(self) -> str:
        """One line naming the decoding settings, for logs, result files and the model card."""
        if self.length_penalty_type == "gnmt":
            penalty = (
                f"GNMT length penalty ((5+|Y|)/6)^{self.length_penalty} applied by rescoring the "
                f"{self.num_beams}-best list of a search run with HF's |Y|^{self.length_penalty}"
            )
        else:
            penalty = f"HF length penalty |Y|^{self.length_penalty} inside beam search"
        return (
            f"beam {self.num_beams}, {penalty}, max output length = input length + 50, "
            f"early_stopping={self.early_stopping}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "description": self.describe()}


def gnmt_length_penalty(length: torch.Tensor | float, alpha: float) -> torch.Tensor | float:
    """lp(Y) = ((5 + |Y|) / 6)^α (Wu et al., 2016, Eq. 14), the penalty the paper's α = 0.6 refers to."""
    return ((5.0 + length) / 6.0) ** alpha


def paper_generation_kwargs(options: DecodingOptions | None = None) -> dict[str, Any]:
    """``generate()`` keyword arguments for §6.1 decoding (beam size, α and the stopping rule; the
    length bound is the model's own)."""
    options = options or DecodingOptions()
    return {
        "num_beams": options.num_beams,
        "length_penalty": options.length_penalty,
        "early_stopping": EARLY_STOPPING[options.early_stopping],
    }


def _eos_id(model: Any) -> int:
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = model.config.eos_token_id
    if isinstance(eos, (list, tuple)):
        if len(eos) != 1:
            raise ValueError(f"Expected one end-of-sentence id, the generation config has {eos}.")
        eos = eos[0]
    if eos is None:
        raise ValueError("The model has no eos_token_id: set it in the config or the generation config.")
    return int(eos)


def nbest_log_probs(outputs: Any, length_penalty: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed log-probabilities log P(Y | X) and lengths |Y| of beam-search hypotheses.

    ``outputs`` is a ``generate(..., output_scores=True, return_dict_in_generate=True)`` beam result.
    HF defines ``sequences_scores = Σ log p / |Y|^length_penalty`` with |Y| the generated tokens
    including ``</s>`` (``transformers.generation.utils``, ``_update_finished_beams``); |Y| is read
    from ``beam_indices``, which is -1 after a hypothesis ended.
    """
    if getattr(outputs, "beam_indices", None) is None or getattr(outputs, "sequences_scores", None) is None:
        raise ValueError(
            "Need a beam-search result with scores: call generate(num_beams>1, output_scores=True, "
            "return_dict_in_generate=True)."
        )
    lengths = (outputs.beam_indices >= 0).sum(dim=1).clamp(min=1).to(outputs.sequences_scores.dtype)
    return outputs.sequences_scores * lengths**length_penalty, lengths


@torch.inference_mode()
def generate_ids(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    options: DecodingOptions | None = None,
    **generate_kwargs: Any,
) -> list[list[int]]:
    """Decode one padded batch; return the chosen output ids per sentence (decoder start, ``</s>`` and
    padding removed). ``generate_kwargs`` go to ``model.generate``.

    See the module docstring for the length bound and the two length penalties.
    """
    options = options or DecodingOptions()
    eos_id = _eos_id(model)
    kwargs = {**paper_generation_kwargs(options), **generate_kwargs}
    batch_size = input_ids.shape[0]
    if options.length_penalty_type == "gnmt":
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            num_return_sequences=options.num_beams,
            output_scores=True,
            return_dict_in_generate=True,
            **kwargs,
        )
        log_probs, lengths = nbest_log_probs(out, options.length_penalty)
        rescored = log_probs / gnmt_length_penalty(lengths, options.length_penalty)
        best = rescored.view(batch_size, options.num_beams).argmax(dim=1)
        rows = torch.arange(batch_size, device=best.device) * options.num_beams + best
        sequences = out.sequences[rows]
    else:
        sequences = model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    return [_strip(row.tolist(), model, eos_id) for row in sequences]


def _strip(ids: list[int], model: Any, eos_id: int) -> list[int]:
    """Drop the decoder start token, and everything from end-of-sentence on (padding included)."""
    if ids and ids[0] == model.config.decoder_start_token_id:
        ids = ids[1:]
    if eos_id in ids:
        ids = ids[: ids.index(eos_id)]
    return ids


@dataclass
class ModelArguments:
    """Which model to run and where."""

    model_name_or_path: str = field(
        metadata={"help": "A saved model folder (e.g. a Trainer output_dir or checkpoint) or a Hub id."}
    )
    tokenizer_name_or_path: str | None = field(
        default=None, metadata={"help": "Tokenizer folder or Hub id; default: the model folder."}
    )
    device: str = field(
        default="auto", metadata={"help": "'auto' (CUDA if available), 'cpu', 'cuda', 'cuda:1', ..."}
    )
    batch_size: int = field(default=64, metadata={"help": "Sentences per batch (sorted by length)."})
    quantization: str = field(
        default="none",
        metadata={
            "help": "Run the model reduced: 'dynamic-int8' (torch quantize_dynamic, CPU), 'torchao-int8-weight', "
            "'torchao-int8-dynamic' (transformers' TorchAoConfig), 'bf16'; see hf_vanilla.quantization."
        },
    )
    trust_remote_code: bool = field(
        default=False,
        metadata={"help": "Allow code shipped with a Hub model (not needed with hf_vanilla installed)."},
    )


def load_model(name: str | Path, **kwargs: Any) -> Any:
    """``AutoModelForSeq2SeqLM.from_pretrained(name, **kwargs)`` with errors that name the cause: a local
    folder is checked first (:func:`hf_vanilla.safe_loading.verify_model_folder`: a truncated or damaged
    weights file, a missing config); a name that is neither a folder nor a loadable Hub model says so."""
    path = Path(name)
    if path.is_dir():
        return load_pretrained_checked(path, **kwargs)
    if path.exists():
        raise ValueError(
            f"--model_name_or_path {str(name)!r} is a file: give the model folder (config.json and model.safetensors)."
        )
    try:
        return AutoModelForSeq2SeqLM.from_pretrained(str(name), **kwargs)
    except (OSError, ValueError) as err:
        detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise FileNotFoundError(
            f"--model_name_or_path {str(name)!r}: no such folder, and no model of that name could be loaded from "
            f"the Hugging Face Hub ({detail}). Check the path: a training run's --output_dir, one of its "
            "checkpoint-<step> folders, or an averaged model folder."
        ) from err


def load_model_and_tokenizer(args: ModelArguments, attn_implementation: str | None = None) -> tuple[Any, Any]:
    """Load the seq2seq model and tokenizer (importing hf_vanilla has registered its Auto classes) and
    check that they belong together (:func:`hf_vanilla.tokenization.check_tokenizer_matches_config`);
    ``args.quantization`` names a route of :mod:`hf_vanilla.quantization`."""
    device = resolve_device(args.device)
    check_route(args.quantization, device)
    kwargs: dict[str, Any] = {"trust_remote_code": args.trust_remote_code}
    kwargs.update(from_pretrained_kwargs(args.quantization))
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    model = load_model(args.model_name_or_path, **kwargs)
    tokenizer_source = args.tokenizer_name_or_path or args.model_name_or_path
    tokenizer = load_tokenizer(tokenizer_source, trust_remote_code=args.trust_remote_code)
    check_tokenizer_matches_config(
        tokenizer, model.config, f"tokenizer {tokenizer_source}, model {args.model_name_or_path}"
    )
    model = quantize_loaded(model.to(device), args.quantization).eval()
    return model, tokenizer


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None`` or ``"auto"`` → CUDA if available, else CPU; otherwise the named device."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("`device` is 'cuda' but no CUDA GPU is visible: use --device cpu.")
    return device


def translate(
    model: Any,
    tokenizer: Any,
    sentences: Sequence[str],
    options: DecodingOptions | None = None,
    batch_size: int = 64,
    device: str | torch.device | None = None,
    generate_kwargs: dict[str, Any] | None = None,
) -> list[str]:
    """Translate ``sentences`` in batches and return the translations in input order.

    Sentences are sorted by token length so each batch holds similar lengths (less padding), then the
    original order is restored. Empty or blank lines are not sent to the model and give empty lines.
    The model is moved to ``device`` (default: CUDA if available) and put in eval mode.
    ``generate_kwargs`` go to ``model.generate`` (e.g. ``max_new_tokens``, which caps the output
    further than the per-sentence input length + 50 bound, or ``max_length_offset``, which changes
    the 50). A tokenizer that does not belong to the model (another size or special-token ids) raises
    ``ValueError`` before anything is translated.
    """
    if batch_size < 1:
        raise ValueError(f"`batch_size` must be a positive integer, got {batch_size}.")
    if tokenizer.pad_token_id is None:
        raise ValueError(
            "The tokenizer has no pad token: set tokenizer.pad_token (e.g. '<pad>') before translating."
        )
    check_tokenizer_matches_config(tokenizer, model.config)
    options = options or DecodingOptions()
    device = resolve_device(device)
    model.to(device)
    model.eval()

    results = [""] * len(sentences)
    todo = [i for i, sentence in enumerate(sentences) if sentence.strip()]
    if len(todo) < len(sentences):
        logger.info("%d blank input line(s) give blank output lines", len(sentences) - len(todo))
    if not todo:
        return results
    lengths = {
        i: len(ids) for i, ids in zip(todo, tokenizer([sentences[i] for i in todo])["input_ids"], strict=True)
    }
    order = sorted(todo, key=lambda i: lengths[i], reverse=True)
    for start in range(0, len(order), batch_size):
        indices = order[start : start + batch_size]
        batch = tokenizer([sentences[i] for i in indices], padding=True, return_tensors="pt").to(device)
        outputs = generate_ids(
            model, batch["input_ids"], batch["attention_mask"], options, **(generate_kwargs or {})
        )
        texts = tokenizer.batch_decode(outputs, skip_special_tokens=True)
        for i, text in zip(indices, texts, strict=True):
            results[i] = text.strip()
        logger.debug("translated %d/%d sentences", min(start + batch_size, len(order)), len(order))
    return results


def _decoded_lines(stream: BinaryIO | TextIO, name: str) -> Iterator[str]:
    """The lines of ``stream`` without their line ends; a line that is not UTF-8 text raises
    ``ValueError`` naming ``name`` and the line number."""
    for number, raw in enumerate(stream, start=1):
        if isinstance(raw, bytes):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(
                    f"{name}, line {number}: not UTF-8 text (byte 0x{raw[err.start]:02x} at byte {err.start + 1} "
                    "of the line). Give plain UTF-8 text, one sentence per line (convert other encodings with "
                    "e.g. `iconv -f latin1 -t utf-8`)."
                ) from None
        else:
            line = raw
        if "\x00" in line:
            raise ValueError(
                f"{name}, line {number}: a NUL byte, so this is binary data, not text. Give plain UTF-8 text, "
                "one sentence per line."
            )
        yield line.rstrip("\n").rstrip("\r")


def translate_stream(
    model: Any,
    tokenizer: Any,
    source: str | Path | None,
    output: str | Path | None,
    options: DecodingOptions | None = None,
    batch_size: int = 64,
    device: str | torch.device | None = None,
    chunk_lines: int = 10_000,
    generate_kwargs: dict[str, Any] | None = None,
    overwrite: bool = False,
) -> int:
    """Translate a file (or stdin when ``source`` is None or ``"-"``) line by line to a file (or stdout).

    Input is read in chunks of ``chunk_lines`` lines, so long files do not need to fit in memory.
    Blank lines anywhere give blank output lines. Input must be UTF-8 text: a file is checked whole
    before anything is translated, and a bad line raises ``ValueError`` naming the file and line.
    An output file that exists is refused (``FileExistsError``) unless ``overwrite``; the output is
    written under a temporary name beside it and renamed into place when every line is translated,
    so it is complete or absent (an old one stays as it was) — never partial. On stdout, output
    appears as each chunk finishes. Returns the number of lines translated.
    """
    from_stdin, to_stdout = source in (None, "-"), output in (None, "-")
    if not to_stdout:
        refuse_to_replace(output, overwrite, "--output_file")
    name = "<stdin>" if from_stdin else str(source)
    if not from_stdin:
        if not Path(source).is_file():
            raise FileNotFoundError(f"--input_file {name!r} does not exist (or is not a file).")
        with open(source, "rb") as handle:
            for _ in _decoded_lines(handle, name):  # fail before hours of translation, not after
                pass
    count = 0
    with contextlib.ExitStack() as stack:
        in_stream = (
            getattr(sys.stdin, "buffer", sys.stdin) if from_stdin else stack.enter_context(open(source, "rb"))
        )
        out_stream = sys.stdout if to_stdout else stack.enter_context(atomic_file(output))
        for chunk in _chunks(_decoded_lines(in_stream, name), chunk_lines):
            for line in translate(model, tokenizer, chunk, options, batch_size, device, generate_kwargs):
                out_stream.write(line + "\n")
            out_stream.flush()
            count += len(chunk)
    return count


def _chunks(items: Iterable[str], size: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
