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
import json
import logging
import math
import queue
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import torch
from transformers.tokenization_utils_base import VERY_LARGE_INTEGER

from hf_vanilla.data import text_lines
from hf_vanilla.durability import atomic_file, refuse_to_replace
from hf_vanilla.quantization import check_route, from_pretrained_kwargs, quantize_loaded
from hf_vanilla.safe_loading import CheckpointError, load_pretrained_checked
from hf_vanilla.tokenization import check_tokenizer_matches_config, load_tokenizer

logger = logging.getLogger(__name__)

LENGTH_PENALTY_TYPES = ("hf", "gnmt")
#: ``--early_stopping`` values and what ``generate()`` receives for each.
EARLY_STOPPING = {"true": True, "false": False, "never": "never"}

#: ``--dtype`` values and the torch dtype of each (``auto``: as saved / as exported).
DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
BACKENDS = ("auto", "transformers", "ctranslate2")
#: Seconds without a new line after which the lines read so far from stdin are translated.
PAUSE_SECONDS = 0.1

__all__ = [
    "BACKENDS",
    "DTYPES",
    "EARLY_STOPPING",
    "LENGTH_PENALTY_TYPES",
    "PAUSE_SECONDS",
    "CTranslate2Model",
    "DecodingOptions",
    "Hypothesis",
    "InputTooLongError",
    "ModelArguments",
    "check_dtype",
    "check_input_file",
    "check_input_length",
    "check_nbest",
    "format_nbest",
    "generate_hypotheses",
    "generate_ids",
    "gnmt_length_penalty",
    "load_model",
    "load_model_and_tokenizer",
    "longest_input",
    "nbest_log_probs",
    "paper_generation_kwargs",
    "resolve_device",
    "translate",
    "translate_nbest",
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
        _refuse_non_finite({"length_penalty": self.length_penalty})
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


def _refuse_non_finite(options: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming the first decoding option that is a non-finite number (NaN or
    infinity decode into garbage without an error)."""
    for name, value in options.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"`{name}` is {value}, not a finite number: give an ordinary number.")


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


@dataclass
class Hypothesis:
    """One translation of a sentence; ``score`` is ``None`` unless an n-best list was asked for."""

    text: str
    score: float | None = None


def _greedy_scores(outputs: Any, eos_id: int, length_penalty: float) -> torch.Tensor:
    """log P(Y | X) / |Y|^α of greedy outputs, |Y| counting generated tokens up to ``</s>`` included (as
    ``sequences_scores`` does for beam search)."""
    steps = torch.stack(outputs.scores, dim=1).float().log_softmax(dim=-1)  # (B, steps, V)
    generated = outputs.sequences[:, -steps.shape[1] :]  # (B, steps)
    log_probs = steps.gather(2, generated.unsqueeze(-1)).squeeze(-1)
    ended_before = (generated == eos_id).int().cumsum(dim=1) - (generated == eos_id).int()
    counted = ended_before == 0  # tokens up to the first </s>, that one included
    lengths = counted.sum(dim=1).clamp(min=1).float()
    return log_probs.masked_fill(~counted, 0.0).sum(dim=1) / lengths**length_penalty


def check_nbest(nbest: int | None, num_beams: int) -> None:
    """Refuse an n-best list size below 1 or wider than the beam, naming the flag to change."""
    if nbest is None:
        return
    if nbest < 1:
        raise ValueError(
            f"--nbest {nbest}: give at least 1 (the number of translations per line), or leave it out."
        )
    if nbest > num_beams:
        raise ValueError(f"--nbest {nbest} needs --num_beams >= {nbest} (now {num_beams}).")


@torch.inference_mode()
def generate_hypotheses(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    options: DecodingOptions | None = None,
    nbest: int | None = None,
    **generate_kwargs: Any,
) -> list[list[tuple[list[int], float | None]]]:
    """Decode one padded batch; per sentence, ``(output ids, score)`` pairs (decoder start, ``</s>`` and
    padding removed). ``generate_kwargs`` go to ``model.generate``.

    Without ``nbest``: the one chosen hypothesis, score ``None``. With ``nbest`` = N (at most the beam
    size): the N best, best first, each with the score it was ranked by, log P(Y | X) / |Y|^α (HF's
    ``sequences_scores``; greedy decoding computes the same) or, with ``length_penalty_type="gnmt"``,
    log P(Y | X) / ((5 + |Y|) / 6)^α. See the module docstring for the length bound and both penalties.
    """
    options = options or DecodingOptions()
    check_nbest(nbest, options.num_beams)
    if generate_kwargs.get("num_return_sequences", 1) != 1:
        wanted = generate_kwargs["num_return_sequences"]
        raise ValueError(
            f"num_return_sequences={wanted}: translation keeps one hypothesis per sentence; for the "
            f"{wanted} best, pass nbest={wanted} (translate_nbest, hf-vanilla-translate --nbest {wanted})."
        )
    generate_kwargs.pop("num_return_sequences", None)
    _refuse_non_finite({**asdict(options), **generate_kwargs})
    eos_id = _eos_id(model)
    kwargs = {**paper_generation_kwargs(options), **generate_kwargs}
    gnmt = options.length_penalty_type == "gnmt"
    if nbest is None and not gnmt:
        sequences = model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        return [[(_strip(row.tolist(), model, eos_id), None)] for row in sequences]
    returned = options.num_beams if gnmt else nbest
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        num_return_sequences=returned,
        output_scores=True,
        return_dict_in_generate=True,
        **kwargs,
    )
    if options.num_beams == 1:
        scores = _greedy_scores(out, eos_id, options.length_penalty)
    elif gnmt:
        log_probs, lengths = nbest_log_probs(out, options.length_penalty)
        scores = log_probs / gnmt_length_penalty(lengths, options.length_penalty)
    else:
        scores = out.sequences_scores
    batch_size = input_ids.shape[0]
    scores = scores.view(batch_size, returned).float()
    results = []
    for sentence in range(batch_size):
        best_first = scores[sentence].argsort(descending=True, stable=True)[: nbest or 1].tolist()
        rows = [out.sequences[sentence * returned + k].tolist() for k in best_first]
        results.append(
            [
                (_strip(row, model, eos_id), float(scores[sentence, k]) if nbest else None)
                for row, k in zip(rows, best_first, strict=True)
            ]
        )
    return results


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
    hypotheses = generate_hypotheses(model, input_ids, attention_mask, options, **generate_kwargs)
    return [best[0][0] for best in hypotheses]


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
    backend: str = field(
        default="auto",
        metadata={
            "help": "'transformers' (generate()), 'ctranslate2' (a folder written by hf-vanilla-export-ct2), or "
            "'auto': ctranslate2 for a folder with a model.bin, else transformers."
        },
    )
    dtype: str = field(
        default="auto",
        metadata={
            "help": "Weights and computation: 'auto' (as saved or exported), 'float32', 'bfloat16', 'float16'; "
            "refused where the device cannot run it."
        },
    )
    batch_size: int = field(
        default=64, metadata={"help": "At most this many sentences per batch (sorted by length)."}
    )
    max_tokens: int = field(
        default=0,
        metadata={
            "help": "Also at most this many padded source tokens per batch (sentences × longest); 0 = no token "
            "budget. A longer sentence goes alone."
        },
    )
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
    """``AutoModelForSeq2SeqLM.from_pretrained(name, **kwargs)`` with errors that name the cause
    (:func:`hf_vanilla.safe_loading.load_pretrained_checked`: a truncated or damaged weights file, a
    missing config, NaN weights, a config that disagrees with the weights); a name that is neither a
    folder nor a loadable Hub model says so."""
    path = Path(name)
    if path.is_dir():
        return load_pretrained_checked(path, **kwargs)
    if path.exists():
        raise ValueError(
            f"--model_name_or_path {str(name)!r} is a file: give the model folder (config.json and model.safetensors)."
        )
    try:
        return load_pretrained_checked(str(name), **kwargs)
    except CheckpointError:
        raise
    except (OSError, ValueError) as err:
        detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise FileNotFoundError(
            f"--model_name_or_path {str(name)!r}: no such folder, and no model of that name could be loaded from "
            f"the Hugging Face Hub ({detail}). Check the path: a training run's --output_dir, one of its "
            "checkpoint-<step> folders, or an averaged model folder."
        ) from err


def load_model_and_tokenizer(
    args: ModelArguments, attn_implementation: str | None = None, allow_ctranslate2: bool = False
) -> tuple[Any, Any]:
    """Load the model and tokenizer (importing hf_vanilla has registered its Auto classes) and check that
    they belong together (:func:`hf_vanilla.tokenization.check_tokenizer_matches_config`);
    ``args.quantization`` names a route of :mod:`hf_vanilla.quantization`, ``args.dtype`` one of
    :data:`DTYPES`. With the ``ctranslate2`` backend (only where ``allow_ctranslate2``: commands that
    only translate) the model is a :class:`CTranslate2Model`."""
    device = resolve_device(args.device)
    if args.backend not in BACKENDS:
        raise ValueError(f"Unknown --backend {args.backend!r}: choose one of {', '.join(BACKENDS)}.")
    if args.dtype not in DTYPES:
        raise ValueError(f"Unknown --dtype {args.dtype!r}: choose one of {', '.join(DTYPES)}.")
    backend = args.backend
    if backend == "auto":
        folder = Path(args.model_name_or_path)
        is_ct2 = (folder / "model.bin").is_file() and not (folder / "model.safetensors").exists()
        backend = "ctranslate2" if is_ct2 else "transformers"
    tokenizer_source = args.tokenizer_name_or_path or args.model_name_or_path
    if backend == "ctranslate2":
        if not allow_ctranslate2:
            raise ValueError(
                f"--model_name_or_path {args.model_name_or_path!r} is a CTranslate2 export (or --backend "
                "ctranslate2 was given): this command needs the transformers model folder it was exported from."
            )
        if args.quantization != "none":
            raise ValueError(
                "--quantization is for the transformers backend; a CTranslate2 model is quantized when exported "
                "(hf-vanilla-export-ct2 --quantization int8)."
            )
        tokenizer = load_tokenizer(tokenizer_source, trust_remote_code=args.trust_remote_code)
        model = CTranslate2Model(args.model_name_or_path, device, args.dtype)
        check_tokenizer_matches_config(
            tokenizer, model.config, f"tokenizer {tokenizer_source}, model {args.model_name_or_path}"
        )
        return model, tokenizer
    check_route(args.quantization, device)
    kwargs: dict[str, Any] = {"trust_remote_code": args.trust_remote_code}
    kwargs.update(from_pretrained_kwargs(args.quantization))
    if args.dtype != "auto":
        if args.quantization != "none":
            raise ValueError(
                f"--dtype {args.dtype} and --quantization {args.quantization} both set the precision: give one."
            )
        check_dtype(DTYPES[args.dtype], device)
        kwargs["dtype"] = DTYPES[args.dtype]
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    model = load_model(args.model_name_or_path, **kwargs)
    tokenizer = load_tokenizer(tokenizer_source, trust_remote_code=args.trust_remote_code)
    check_tokenizer_matches_config(
        tokenizer, model.config, f"tokenizer {tokenizer_source}, model {args.model_name_or_path}"
    )
    model = quantize_loaded(model.to(device), args.quantization).eval()
    return model, tokenizer


def check_dtype(dtype: torch.dtype, device: torch.device) -> None:
    """Refuse a dtype ``device`` cannot compute in (bf16 on a GPU without it, or any failing kernel),
    with the choices that work, instead of a kernel error in the middle of decoding."""
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise ValueError(f"--dtype bfloat16: {device} does not support bfloat16; use float16 or float32.")
    try:  # the model's kernels: a matrix product and a softmax
        probe = torch.ones(2, 2, dtype=dtype, device=device)
        torch.nn.functional.linear(probe, probe).softmax(dim=-1)
    except RuntimeError as err:
        raise ValueError(
            f"--dtype {str(dtype).removeprefix('torch.')}: {device} cannot compute in it ({str(err).splitlines()[0]}); "
            "use float32."
        ) from None


class CTranslate2Model:
    """A CTranslate2 model folder (written by :func:`hf_vanilla.export_ctranslate2.export_ctranslate2`) run
    by ``ctranslate2.Translator``, decoded by :func:`translate` with the same tokenizer and output as the
    transformers backend.

    Decoding differs from ``generate()`` where CTranslate2 has no equivalent: beam search uses
    CTranslate2's own stopping rule (``early_stopping`` is not applied), ``length_penalty_type="gnmt"``
    is refused, and the per-sentence bound of input length + ``max_length_offset`` (50) tokens (``</s>``
    included) is applied by decoding the batch to its longest bound and cutting each output at its own
    (exact for greedy decoding). Scores (``nbest``) are CTranslate2's: the log-probability divided by |Y|^α in beam
    search, the plain log-probability in greedy decoding.
    """

    def __init__(self, folder: str | Path, device: torch.device, dtype: str = "auto") -> None:
        try:
            import ctranslate2
        except ImportError as err:
            raise ImportError(
                "--backend ctranslate2 needs CTranslate2: pip install 'hf_vanilla[ct2]' (or pip install ctranslate2)."
            ) from err
        folder = Path(folder)
        if not (folder / "model.bin").is_file():
            raise FileNotFoundError(
                f"--model_name_or_path {str(folder)!r} holds no CTranslate2 model (model.bin): write one with "
                "hf-vanilla-export-ct2, or use --backend transformers."
            )
        compute_type = "default" if dtype == "auto" else dtype
        supported = ctranslate2.get_supported_compute_types(device.type, device.index or 0)
        if compute_type != "default" and compute_type not in supported:
            raise ValueError(
                f"--dtype {dtype}: CTranslate2 cannot compute in it on {device.type} (it can: "
                f"{', '.join(sorted(supported))}); use --dtype auto or float32."
            )
        self.folder = folder
        generation = folder / "generation_config.json"
        defaults = json.loads(generation.read_text(encoding="utf-8")) if generation.is_file() else {}
        self.max_length_offset = int(defaults.get("max_length_offset", 50))
        self.config = self._vocabulary_config(folder, defaults)
        try:
            self.translator = ctranslate2.Translator(
                str(folder), device=device.type, device_index=device.index or 0, compute_type=compute_type
            )
        except RuntimeError as err:  # CTranslate2 names neither the file nor what to do
            raise ValueError(
                f"{folder / 'model.bin'}: CTranslate2 cannot load it ({str(err).splitlines()[0] if str(err) else err!r}); "
                "if it is damaged or incomplete, export it again with hf-vanilla-export-ct2."
            ) from err

    @staticmethod
    def _vocabulary_config(folder: Path, defaults: dict[str, Any]) -> SimpleNamespace:
        """What :func:`hf_vanilla.tokenization.check_tokenizer_matches_config` compares, read from the
        export: the vocabulary sizes (one row per token string) and the special-token ids of the model it
        was exported from (its generation config; without one, the positions of CTranslate2's own
        ``bos_token`` and ``eos_token``, and the pad id is not checked)."""
        shared = folder / "shared_vocabulary.json"
        if shared.is_file():
            source = target = json.loads(shared.read_text(encoding="utf-8"))
        else:
            source, target = (
                json.loads((folder / f"{side}_vocabulary.json").read_text(encoding="utf-8"))
                for side in ("source", "target")
            )
        ct2_config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        ids = {
            f"{name}_token_id": defaults.get(
                f"{name}_token_id", target.index(token) if token in target else None
            )
            for name, token in (("bos", ct2_config.get("bos_token")), ("eos", ct2_config.get("eos_token")))
        }
        if "pad_token_id" in defaults:
            ids["pad_token_id"] = defaults["pad_token_id"]
        sizes = {"vocab_size": len(source), "decoder_vocab_size": None if shared.is_file() else len(target)}
        return SimpleNamespace(**sizes, **ids)

    def generate_hypotheses(
        self,
        tokenizer: Any,
        input_ids: list[list[int]],
        options: DecodingOptions,
        nbest: int | None = None,
        max_new_tokens: int | None = None,
    ) -> list[list[tuple[list[int], float | None]]]:
        """What :func:`generate_hypotheses` returns, for unpadded ``input_ids``."""
        if options.length_penalty_type == "gnmt":
            raise ValueError("--length_penalty_type gnmt needs the transformers backend (n-best rescoring).")
        check_nbest(nbest, options.num_beams)
        # generate() ends each sentence with </s> at its input length + offset: that many tokens minus one
        bounds = [len(ids) + self.max_length_offset - 1 for ids in input_ids]
        longest = max(bounds) if max_new_tokens is None else min(max(bounds), max_new_tokens)
        results = self.translator.translate_batch(
            [tokenizer.convert_ids_to_tokens(ids) for ids in input_ids],
            beam_size=options.num_beams,
            length_penalty=options.length_penalty,
            num_hypotheses=nbest or 1,
            return_scores=nbest is not None,
            max_decoding_length=longest,
            min_decoding_length=0,  # CTranslate2's default 1 forbids the empty translation generate() allows
            max_input_length=0,  # lengths are checked before, with a message naming the line
        )
        return [
            [
                (tokenizer.convert_tokens_to_ids(tokens)[:bound], result.scores[k] if nbest else None)
                for k, tokens in enumerate(result.hypotheses)
            ]
            for result, bound in zip(results, bounds, strict=True)
        ]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None`` or ``"auto"`` → CUDA if available, else CPU; otherwise the named device."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("`device` is 'cuda' but no CUDA GPU is visible: use --device cpu.")
    return device


def longest_input(model: Any, tokenizer: Any) -> int | None:
    """The most source tokens the model takes: ``max_position_embeddings`` (the CTranslate2 export's
    position table; ``generate()`` computes positions for any length but is held to the same limit by
    :func:`translate`), or for a CTranslate2 model the tokenizer's ``model_max_length`` (set from the
    model when exported). ``None``: no limit known."""
    if isinstance(model, CTranslate2Model):
        limit = tokenizer.model_max_length
        return int(limit) if limit < VERY_LARGE_INTEGER else None
    return getattr(model.config, "max_position_embeddings", None)


class InputTooLongError(ValueError):
    """A sentence with more tokens than :func:`longest_input`; ``index`` is its place in the input."""

    def __init__(self, index: int, length: int, limit: int, where: str | None = None) -> None:
        self.index, self.length, self.limit = index, length, limit
        where = where or f"sentence {index + 1}"
        super().__init__(
            f"{where}: {length} tokens, more than the model's longest input of {limit} tokens "
            "(its max_position_embeddings, the tokenizer's model_max_length). Split the sentence."
        )


def check_input_length(
    model: Any, tokenizer: Any, length: int, index: int = 0, where: str | None = None
) -> None:
    """Raise :class:`InputTooLongError` (naming ``where``, default "sentence <index + 1>") when ``length``
    tokens exceed :func:`longest_input`: the one check of the model's length limit that translation,
    evaluation and the attention plots share."""
    limit = longest_input(model, tokenizer)
    if limit is not None and length > limit:
        raise InputTooLongError(index, length, limit, where)


def _batches(
    order: list[int], lengths: dict[int, int], batch_size: int, max_tokens: int
) -> Iterator[list[int]]:
    """Consecutive groups of ``order`` (longest first) of at most ``batch_size`` sentences and, with a
    ``max_tokens`` budget, at most that many padded tokens (sentences × the group's longest)."""
    batch: list[int] = []
    for i in order:
        if batch and (
            len(batch) == batch_size or (max_tokens and (len(batch) + 1) * lengths[batch[0]] > max_tokens)
        ):
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def translate_nbest(
    model: Any,
    tokenizer: Any,
    sentences: Sequence[str] | str,
    options: DecodingOptions | None = None,
    batch_size: int = 64,
    device: str | torch.device | None = None,
    generate_kwargs: dict[str, Any] | None = None,
    nbest: int | None = None,
    max_tokens: int = 0,
) -> list[list[Hypothesis]] | list[Hypothesis]:
    """Translate ``sentences`` in batches; per sentence, in input order, its hypotheses: one without
    ``nbest`` (score ``None``), else the ``nbest`` best with scores, best first (see
    :func:`generate_hypotheses`). A blank sentence gets no hypothesis (an empty list). A bare string is
    one sentence: its hypotheses are returned (a list of :class:`Hypothesis`, not a list of lists).

    ``model`` is a transformers model or a :class:`CTranslate2Model` (then ``generate_kwargs`` may only
    hold ``max_new_tokens``). Batches hold at most ``batch_size`` sentences and, with ``max_tokens``, at
    most that many padded source tokens. A sentence longer than :func:`longest_input` raises
    :class:`InputTooLongError` before anything is translated.
    """
    if isinstance(sentences, str):  # one sentence, not a sequence of one-character sentences
        return translate_nbest(
            model, tokenizer, [sentences], options, batch_size, device, generate_kwargs, nbest, max_tokens
        )[0]
    if batch_size < 1:
        raise ValueError(f"`batch_size` must be a positive integer, got {batch_size}.")
    if max_tokens < 0:
        raise ValueError(f"`max_tokens` must be 0 (no budget) or positive, got {max_tokens}.")
    if tokenizer.pad_token_id is None:
        raise ValueError(
            "The tokenizer has no pad token: set tokenizer.pad_token (e.g. '<pad>') before translating."
        )
    options = options or DecodingOptions()
    check_nbest(nbest, options.num_beams)
    generate_kwargs = dict(generate_kwargs or {})
    _refuse_non_finite({**asdict(options), **generate_kwargs})
    ct2 = isinstance(model, CTranslate2Model)
    check_tokenizer_matches_config(tokenizer, model.config)  # both backends: a CTranslate2Model has one too
    if ct2:
        unknown = sorted(set(generate_kwargs) - {"max_new_tokens"})
        if unknown:
            raise ValueError(
                f"The ctranslate2 backend takes no generate() argument other than max_new_tokens: {unknown}."
            )
    else:
        device = resolve_device(device)
        model.to(device)
        model.eval()

    results: list[list[Hypothesis]] = [[] for _ in sentences]
    todo = [i for i, sentence in enumerate(sentences) if sentence.strip()]
    if len(todo) < len(sentences):
        logger.info("%d blank input line(s) give blank output lines", len(sentences) - len(todo))
    if not todo:
        return results
    ids = dict(zip(todo, tokenizer([sentences[i] for i in todo])["input_ids"], strict=True))
    lengths = {i: len(row) for i, row in ids.items()}
    for i in todo:
        check_input_length(model, tokenizer, lengths[i], i)
    order = sorted(todo, key=lambda i: lengths[i], reverse=True)
    done = 0
    for indices in _batches(order, lengths, batch_size, max_tokens):
        if ct2:
            outputs = model.generate_hypotheses(
                tokenizer, [ids[i] for i in indices], options, nbest, generate_kwargs.get("max_new_tokens")
            )
        else:
            batch = tokenizer.pad({"input_ids": [ids[i] for i in indices]}, return_tensors="pt").to(device)
            outputs = generate_hypotheses(
                model, batch["input_ids"], batch["attention_mask"], options, nbest, **generate_kwargs
            )
        for i, hypotheses in zip(indices, outputs, strict=True):
            texts = tokenizer.batch_decode([row for row, _ in hypotheses], skip_special_tokens=True)
            results[i] = [
                Hypothesis(text.strip(), score) for text, (_, score) in zip(texts, hypotheses, strict=True)
            ]
        done += len(indices)
        logger.debug("translated %d/%d sentences", done, len(order))
    return results


def translate(
    model: Any,
    tokenizer: Any,
    sentences: Sequence[str] | str,
    options: DecodingOptions | None = None,
    batch_size: int = 64,
    device: str | torch.device | None = None,
    generate_kwargs: dict[str, Any] | None = None,
    max_tokens: int = 0,
) -> list[str] | str:
    """Translate ``sentences`` in batches and return the translations in input order; a bare string is one
    sentence and gives one string.

    Sentences are sorted by token length so each batch holds similar lengths (less padding), then the
    original order is restored. Empty or blank lines are not sent to the model and give empty lines.
    The model is moved to ``device`` (default: CUDA if available) and put in eval mode; a
    :class:`CTranslate2Model` runs where it was loaded.
    ``generate_kwargs`` go to ``model.generate`` (e.g. ``max_new_tokens``, which caps the output
    further than the per-sentence input length + 50 bound, or ``max_length_offset``, which changes
    the 50). A tokenizer that does not belong to the model (another size or special-token ids) raises
    ``ValueError`` before anything is translated, as does a sentence longer than the model's longest
    input (:class:`InputTooLongError`).
    """
    if isinstance(sentences, str):
        return translate(
            model, tokenizer, [sentences], options, batch_size, device, generate_kwargs, max_tokens
        )[0]
    hypotheses = translate_nbest(
        model, tokenizer, sentences, options, batch_size, device, generate_kwargs, max_tokens=max_tokens
    )
    return [best[0].text if best else "" for best in hypotheses]


def format_nbest(index: int, hypotheses: list[Hypothesis]) -> str:
    """The n-best lines of input line ``index`` (0-based), one per hypothesis, best first:
    ``index<TAB>score<TAB>translation`` (fairseq's H lines without the ``H-``); a blank input line gives
    one line ``index<TAB><TAB>`` (no score, no translation)."""
    if not hypotheses:
        return f"{index}\t\t\n"
    return "".join(f"{index}\t{hypothesis.score:.4f}\t{hypothesis.text}\n" for hypothesis in hypotheses)


def check_input_file(source: str | Path) -> bool:
    """Raise (one line) if the input file ``source`` is missing or a folder; return whether it is a
    regular file (``False``: a pipe, such as bash's ``<(...)``, which can be read only once)."""
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(
            f"--input_file {str(source)!r} does not exist. Check the path, or pass - for stdin."
        )
    if path.is_dir():
        raise IsADirectoryError(
            f"--input_file {str(source)!r} is a folder; give a text file, one sentence a line."
        )
    return path.is_file()


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
    nbest: int | None = None,
    max_tokens: int = 0,
    pause: float = PAUSE_SECONDS,
) -> int:
    """Translate a file (or stdin when ``source`` is None or ``"-"``) line by line to a file (or stdout).

    Lines are buffered and translated when ``chunk_lines`` of them are waiting (fairseq-interactive's
    ``--buffer-size``), at the end of the input, and, on stdin, when no new line has come for ``pause``
    seconds: typed or piped lines are translated as they arrive, and long files do not need to fit in
    memory. Output goes to stdout as each buffer is translated. Without ``nbest`` each input line gives
    one output line, blank lines blank lines; with ``nbest`` see :func:`format_nbest`.
    Input must be UTF-8 text: a file is checked whole before anything is translated (a pipe, such as
    bash's ``<(...)``, is read once, as it comes, like stdin), and a bad line (or one longer than the
    model's longest input) raises ``ValueError`` naming the file and line.
    An output file that exists is refused (``FileExistsError``) unless ``overwrite``; the output is
    written under a temporary name beside it and renamed into place when every line is translated,
    so it is complete or absent (an old one stays as it was) — never partial. Returns the number of
    lines translated.
    """
    if chunk_lines < 1:
        raise ValueError(f"--buffer_size must be at least 1 line, got {chunk_lines}.")
    from_stdin, to_stdout = source in (None, "-"), output in (None, "-")
    if not to_stdout:
        refuse_to_replace(output, overwrite, "--output_file", kind="file", inputs=[source])
    name = "<stdin>" if from_stdin else str(source)
    streamed = from_stdin or not check_input_file(source)  # read once, as it comes
    if not streamed:
        with open(source, "rb") as handle:
            for _ in text_lines(handle, name):  # fail before hours of translation, not after
                pass
    count = 0
    with contextlib.ExitStack() as stack:
        in_stream = (
            getattr(sys.stdin, "buffer", sys.stdin) if from_stdin else stack.enter_context(open(source, "rb"))
        )
        out_stream = sys.stdout if to_stdout else stack.enter_context(atomic_file(output))
        lines = text_lines(in_stream, name)
        buffers = _buffers(lines, chunk_lines, pause) if streamed else _chunks(lines, chunk_lines)
        for chunk in buffers:
            try:
                translated = translate_nbest(
                    model, tokenizer, chunk, options, batch_size, device, generate_kwargs, nbest, max_tokens
                )
            except InputTooLongError as err:
                raise InputTooLongError(
                    count + err.index, err.length, err.limit, f"{name}, line {count + err.index + 1}"
                ) from None
            for index, hypotheses in enumerate(translated, start=count):
                if nbest is None:
                    out_stream.write((hypotheses[0].text if hypotheses else "") + "\n")
                else:
                    out_stream.write(format_nbest(index, hypotheses))
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


_END = object()


def _buffers(items: Iterator[str], size: int, pause: float) -> Iterator[list[str]]:
    """Like :func:`_chunks`, and also yield what has arrived when no item comes for ``pause`` seconds.

    A daemon thread reads ``items`` (it blocks on a terminal or pipe) into a bounded queue; an error
    while reading (bad UTF-8) is raised here, after the lines before it.
    """
    arrived: queue.Queue[tuple[object, BaseException | None]] = queue.Queue(maxsize=2 * size)

    def read() -> None:
        try:
            for item in items:
                arrived.put((item, None))
        except Exception as err:  # handed to the consumer, which raises it
            arrived.put((_END, err))
            return
        arrived.put((_END, None))

    threading.Thread(target=read, name="hf_vanilla-stdin", daemon=True).start()
    buffer: list[str] = []
    while True:
        try:
            item, error = arrived.get(timeout=pause if buffer else None)
        except queue.Empty:  # the input paused: translate what is there
            yield buffer
            buffer = []
            continue
        if item is _END:
            if buffer:
                yield buffer
            if error is not None:
                raise error
            return
        buffer.append(item)
        if len(buffer) == size:
            yield buffer
            buffer = []
