"""The inference commands' options (which model, where, how to decode), importable without torch so
that a command's ``--help`` needs no torch; :mod:`hf_vanilla.inference.decoding` and
:mod:`hf_vanilla.inference.loading` use them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from hf_vanilla.io.numbers import non_finite_names
from hf_vanilla.models import paper_decoding

__all__ = [
    "BACKENDS",
    "DTYPE_NAMES",
    "EARLY_STOPPING",
    "LARGEST_LENGTH_PENALTY",
    "LENGTH_PENALTY_TYPES",
    "DecodingOptions",
    "Hypothesis",
    "InferenceModelArguments",
    "ShardingArguments",
    "check_nbest",
    "refuse_non_finite",
]

LENGTH_PENALTY_TYPES = ("hf", "gnmt")

#: The largest length penalty α either way: |Y|^α fits a float for any output length |Y| (beyond it, a
#: long output's |Y|^α overflows in beam search; usual values are 0.6 to 2).
LARGEST_LENGTH_PENALTY = 10.0

#: ``--early_stopping`` values and what ``generate()`` receives for each.
EARLY_STOPPING = {"true": True, "false": False, "never": "never"}

#: The paper's decoding defaults (§6.1), as the model's generation file defines them.
_PAPER = paper_decoding()
_EARLY_STOPPING_NAMES = {value: name for name, value in EARLY_STOPPING.items()}


@dataclass
class DecodingOptions:
    """Decoding settings; the defaults are the paper's (§6.1)."""

    num_beams: int = field(
        default=_PAPER["num_beams"], metadata={"help": f"Beam size (§6.1: {_PAPER['num_beams']})."}
    )
    length_penalty: float = field(
        default=_PAPER["length_penalty"],
        metadata={"help": f"Length penalty α (§6.1: {_PAPER['length_penalty']})."},
    )
    length_penalty_type: Literal["hf", "gnmt"] = field(
        default="hf",
        metadata={
            "help": "'hf': log P / |Y|^α inside HF beam search. 'gnmt': the paper's log P / ((5+|Y|)/6)^α "
            "(Wu et al., 2016), applied by rescoring the final num_beams-best list."
        },
    )
    early_stopping: Literal["never", "true", "false"] = field(
        default=_EARLY_STOPPING_NAMES[_PAPER["early_stopping"]],
        metadata={
            "help": "When beam search stops. 'never': when no running hypothesis can beat the finished ones "
            "(§6.1's rule); 'true': as soon as num_beams hypotheses have finished; 'false': HF's heuristic."
        },
    )

    do_sample: bool = field(
        default=False,
        metadata={
            "help": "Sample each token from the model's distribution instead of searching (back-translation, "
            "Edunov et al., 2018); the beam options do not apply. --nbest N: N samples per line."
        },
    )
    top_k: int = field(
        default=0, metadata={"help": "With --do_sample: draw from the k most likely tokens (0: all of them)."}
    )
    top_p: float = field(
        default=1.0,
        metadata={"help": "With --do_sample: draw from the smallest set of tokens holding this probability."},
    )
    temperature: float = field(
        default=1.0, metadata={"help": "With --do_sample: divide the logits by this (below 1: sharper)."}
    )
    seed: int | None = field(
        default=None,
        metadata={"help": "With --do_sample: the random seed (same seed, input and batching: same samples)."},
    )

    def __post_init__(self) -> None:
        self._check_sampling()
        if self.early_stopping not in EARLY_STOPPING:
            raise ValueError(
                f"`early_stopping` must be one of {sorted(EARLY_STOPPING)}, got {self.early_stopping!r}."
            )
        if self.length_penalty_type not in LENGTH_PENALTY_TYPES:
            raise ValueError(
                f"`length_penalty_type` must be one of {LENGTH_PENALTY_TYPES}, got {self.length_penalty_type!r}: "
                "'hf' = log P / |Y|^α inside beam search, 'gnmt' = log P / ((5 + |Y|) / 6)^α as n-best rescoring."
            )
        refuse_non_finite({"length_penalty": self.length_penalty})
        if abs(self.length_penalty) > LARGEST_LENGTH_PENALTY:
            raise ValueError(
                f"--length_penalty {self.length_penalty}: at most {LARGEST_LENGTH_PENALTY} either way; beyond it "
                f"|Y|^α overflows for long outputs (§6.1 uses {_PAPER['length_penalty']}, Hugging Face's default is 1.0)."
            )
        if not isinstance(self.num_beams, int) or self.num_beams < 1:
            raise ValueError(
                f"--num_beams {self.num_beams!r}: give a positive beam size (1: greedy decoding)."
            )
        if self.length_penalty_type == "gnmt" and self.num_beams < 2:
            raise ValueError("GNMT length-penalty rescoring needs an n-best list: use num_beams >= 2.")

    def _check_sampling(self) -> None:
        """Refuse sampling options without ``do_sample``, values outside their range, and beam-search
        options given with ``do_sample``, naming the flags."""
        refuse_non_finite({"top_p": self.top_p, "temperature": self.temperature})
        shaping = {"top_k": 0, "top_p": 1.0, "temperature": 1.0, "seed": None}
        given = [f"--{name}" for name, default in shaping.items() if getattr(self, name) != default]
        if given and not self.do_sample:
            raise ValueError(f"{', '.join(given)} shape(s) sampling: add --do_sample, or leave them out.")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"--top_k {self.top_k!r}: give 0 (all tokens) or a positive number of tokens.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(
                f"--top_p {self.top_p}: give a probability above 0 and at most 1 (1: all tokens)."
            )
        if self.temperature <= 0.0:
            raise ValueError(
                f"--temperature {self.temperature}: give a positive number (1: the model's own)."
            )
        if not self.do_sample:
            return
        beam = {
            "num_beams": (1, _PAPER["num_beams"]),
            "length_penalty": (_PAPER["length_penalty"],),
            "length_penalty_type": ("hf",),
            "early_stopping": (_EARLY_STOPPING_NAMES[_PAPER["early_stopping"]],),
        }
        given = [f"--{name}" for name, allowed in beam.items() if getattr(self, name) not in allowed]
        if given:
            raise ValueError(
                f"--do_sample draws one token at a time, without beam search: leave out {', '.join(given)} "
                "(for several samples per line, use --nbest N)."
            )

    def describe(self) -> str:
        """One line naming the decoding settings, for logs, result files and the model card: greedy
        decoding (``num_beams=1``) is named as such, without the beam-only length penalty and stopping rule."""
        length = f"max output length = input length + {_PAPER['max_length_offset']}"
        if self.do_sample:
            return (
                f"sampling (top-k {self.top_k or 'all'}, top-p {self.top_p}, temperature {self.temperature}, "
                f"seed {self.seed}), {length}"
            )
        if self.num_beams == 1:
            return f"greedy (beam 1), {length}"
        if self.length_penalty_type == "gnmt":
            penalty = (
                f"GNMT length penalty ((5+|Y|)/6)^{self.length_penalty} applied by rescoring the "
                f"{self.num_beams}-best list of a search run with HF's |Y|^{self.length_penalty}"
            )
        else:
            penalty = f"HF length penalty |Y|^{self.length_penalty} inside beam search"
        return f"beam {self.num_beams}, {penalty}, {length}, early_stopping={self.early_stopping}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "description": self.describe()}


@dataclass
class Hypothesis:
    """One translation of a sentence; ``score`` is ``None`` unless an n-best list was asked for;
    ``alignment``: ``(source token, target token)`` index pairs where alignments were asked for."""

    text: str
    score: float | None = None
    alignment: list[tuple[int, int]] | None = None


def refuse_non_finite(options: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming the first decoding option that is a non-finite number (NaN or
    infinity decode into garbage without an error)."""
    bad = non_finite_names(options.items())
    if bad:
        raise ValueError(f"`{bad[0]}` is {options[bad[0]]}, not a finite number: give an ordinary number.")


def check_nbest(nbest: int | None, num_beams: int, sampling: bool = False) -> None:
    """Refuse an n-best list size below 1 or, unless ``sampling`` (N samples), wider than the beam,
    naming the flag to change."""
    if nbest is None:
        return
    if nbest < 1:
        raise ValueError(
            f"--nbest {nbest}: give at least 1 (the number of translations per line), or leave it out."
        )
    if nbest > num_beams and not sampling:
        raise ValueError(f"--nbest {nbest} needs --num_beams >= {nbest} (now {num_beams}).")


BACKENDS = ("auto", "transformers", "ctranslate2")

#: ``--dtype`` values (``auto``: as saved / as exported); :data:`hf_vanilla.inference.loading.DTYPES` maps
#: them to torch dtypes.
DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class InferenceModelArguments:
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
            "'torchao-int8-dynamic' (transformers' TorchAoConfig), 'bf16'; see hf_vanilla.inference.quantization."
        },
    )
    trust_remote_code: bool = field(
        default=False,
        metadata={"help": "Allow code shipped with a Hub model (not needed with hf_vanilla installed)."},
    )
    ensemble: str | None = field(
        default=None,
        metadata={
            "help": "More model folders, separated by commas (e.g. runs/b,runs/c): translate with the ensemble of "
            "--model_name_or_path and these, their next-token distributions averaged at every step of the search. "
            "Same vocabulary; transformers backend."
        },
    )


@dataclass
class ShardingArguments:
    """How a corpus is split between processes (``torchrun`` and ``accelerate launch`` split it by themselves)."""

    num_shards: int | None = field(
        default=None,
        metadata={
            "help": "Split the input into this many contiguous shards, and translate the one --shard_id names "
            "(a job array: one task per shard); the parts go to OUTPUT.parts/, and --merge writes --output_file."
        },
    )
    shard_id: int | None = field(
        default=None, metadata={"help": "With --num_shards: the shard this process translates, from 0."}
    )
    merge: bool = field(
        default=False,
        metadata={
            "help": "Join the finished parts in OUTPUT.parts/ into --output_file (the same command as the shards', "
            "with --merge for --shard_id); refused while a part is missing or unfinished."
        },
    )
