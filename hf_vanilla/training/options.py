"""The training command's own options: the model to build and the paper's training defaults, importable
without torch or transformers;
:mod:`hf_vanilla.training.arguments` adds them to transformers' ``Seq2SeqTrainingArguments``."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any

from hf_vanilla.io.numbers import Bounds, refuse_out_of_bounds

__all__ = [
    "MODEL_BOUNDS",
    "PAPER_MAX_TOKENS_PER_PROCESS",
    "PRESET_NAMES",
    "TRAINING_BOUNDS",
    "PaperRecipeArguments",
    "TrainingModelArguments",
]

#: A probability that leaves something: dropout and label smoothing of 1 keep or learn nothing.
_PROBABILITY = Bounds(0, 1, high_open=True)
#: Every ``log``, ``eval`` and ``save`` interval: a number of steps, or below 1 a fraction of the run.
_INTERVAL = Bounds(0, low_open=True, what="steps; below 1, a fraction of --max_steps")

#: The values :class:`TrainingModelArguments`' number options can honour.
MODEL_BOUNDS = {
    "d_model": Bounds(1),
    "layers": Bounds(1),
    "attention_heads": Bounds(1),
    "ffn_dim": Bounds(1),
    "dropout": _PROBABILITY,
    "label_smoothing": _PROBABILITY,
    "init_std": Bounds(0, low_open=True),
    "tokenizer_vocab_size": Bounds(1),
    "max_source_length": Bounds(1, what="tokens"),
    "max_target_length": Bounds(1, what="tokens"),
}

#: The values the training run's number options can honour, transformers' own included (which it
#: accepts, then fails on with a traceback, or silently reads as something else: a
#: ``--save_total_limit 0`` kept every checkpoint).
TRAINING_BOUNDS = {
    "per_device_train_batch_size": Bounds(1, what="sentences"),
    "per_device_eval_batch_size": Bounds(1, what="sentences"),
    "gradient_accumulation_steps": Bounds(1, what="micro-batches per optimizer step"),
    "eval_accumulation_steps": Bounds(1),
    "max_steps": Bounds(-1, what="optimizer steps; -1: --num_train_epochs decides"),
    "num_train_epochs": Bounds(0, low_open=True),
    "warmup_steps": Bounds(0, what="steps; below 1, a fraction of --max_steps"),
    "save_steps": _INTERVAL,
    "eval_steps": _INTERVAL,
    "logging_steps": _INTERVAL,
    "save_total_limit": Bounds(1, what="checkpoints kept; leave it out to keep all"),
    "dataloader_num_workers": Bounds(0),
    "dataloader_prefetch_factor": Bounds(1),
    "generation_max_length": Bounds(1, what="tokens"),
    "generation_num_beams": Bounds(1),
    "max_grad_norm": Bounds(0, what="0: no clipping"),
    "adam_beta1": _PROBABILITY,
    "adam_beta2": _PROBABILITY,
    "adam_epsilon": Bounds(0, low_open=True),
    "weight_decay": Bounds(0),
    "learning_rate": Bounds(0),
    "max_tokens": Bounds(0, what="tokens per batch; 0: --per_device_train_batch_size sentences"),
    "eval_delay": Bounds(0),
    "seed": Bounds(0, 2**32 - 1),
    "data_seed": Bounds(0, 2**32 - 1),
    "average_last_n_checkpoints": Bounds(0),
    "max_train_minutes": Bounds(0, what="minutes of training; 0: no time limit"),
    "lr_cooldown_fraction": Bounds(0, 1, what="a fraction of --max_train_minutes"),
}

#: The sizes of Table 3 (``--preset``), as ``PRESETS`` of the configuration file defines them.
PRESET_NAMES = ("base", "big")


@dataclass
class TrainingModelArguments:
    """The model and its tokenizer. Sizes default to a Table 3 preset; explicit values override it."""

    preset: str | None = field(
        default=None,
        metadata={
            "help": f"Table 3 model size: one of {sorted(PRESET_NAMES)} (default: base). Explicit sizes below "
            "override it."
        },
    )
    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Fine-tune a saved model folder instead of a fresh one. Its sizes are used: size flags that "
            "differ are refused; --dropout is applied."
        },
    )
    d_model: int | None = field(default=None, metadata={"help": "d_model (base 512, big 1024)."})
    layers: int | None = field(default=None, metadata={"help": "N, for encoder and decoder (paper: 6)."})
    attention_heads: int | None = field(default=None, metadata={"help": "h (base 8, big 16)."})
    ffn_dim: int | None = field(default=None, metadata={"help": "d_ff (base 2048, big 4096)."})
    dropout: float | None = field(default=None, metadata={"help": "P_drop, §5.4 (base 0.1, big 0.3)."})
    label_smoothing: float = field(
        default=0.1, metadata={"help": "ε_ls of §5.4, applied in the model's loss (paper: 0.1)."}
    )
    init_std: float | None = field(
        default=None,
        metadata={"help": "Standard deviation of the embedding initialisation (default: d_model^-0.5)."},
    )
    tokenizer_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "A saved tokenizer folder (e.g. from scripts/train_tokenizer.py); default: train one."
        },
    )
    tokenizer_vocab_size: int = field(
        default=37000,
        metadata={
            "help": "Size of the shared BPE vocabulary to train when no tokenizer is given (§5.1: ~37000)."
        },
    )
    max_source_length: int | None = field(
        default=None, metadata={"help": "Truncate source sentences to this many tokens (default: no limit)."}
    )
    max_target_length: int | None = field(
        default=None, metadata={"help": "Truncate target sentences to this many tokens (default: no limit)."}
    )

    def __post_init__(self) -> None:
        from hf_vanilla.models.vanilla_transformer.configuration_vanilla_transformer import PRESETS

        if self.preset is not None and self.preset not in PRESETS:
            raise ValueError(f"Unknown --preset {self.preset!r}: choose one of {sorted(PRESETS)}.")
        refuse_out_of_bounds(self, MODEL_BOUNDS)

    def requested_sizes(self) -> dict[str, tuple[str, Any]]:
        """Config field -> (flag, value) for the sizes asked for explicitly (``--preset`` and the size
        flags; an explicit size wins over the preset's), ``--init_std`` included: what a saved model
        must already have, since loading cannot change it."""
        from hf_vanilla.models.vanilla_transformer.configuration_vanilla_transformer import PRESETS

        requested: dict[str, tuple[str, Any]] = {}
        if self.preset is not None:
            for name, value in PRESETS[self.preset].items():
                if name != "dropout":
                    requested[name] = (f"--preset {self.preset}", value)
        for name, value in self.config_overrides().items():
            if name not in ("dropout", "label_smoothing"):
                flag = _SIZE_FLAGS.get(name, name)
                requested[name] = (f"--{flag} {value}", value)
        return requested

    def config_overrides(self) -> dict[str, Any]:
        """Config fields set explicitly by these arguments."""
        overrides: dict[str, Any] = {"label_smoothing": self.label_smoothing}
        if self.d_model is not None:
            overrides["d_model"] = self.d_model
        if self.layers is not None:
            overrides["encoder_layers"] = overrides["decoder_layers"] = self.layers
        if self.attention_heads is not None:
            overrides["encoder_attention_heads"] = overrides["decoder_attention_heads"] = self.attention_heads
        if self.ffn_dim is not None:
            overrides["encoder_ffn_dim"] = overrides["decoder_ffn_dim"] = self.ffn_dim
        if self.dropout is not None:
            overrides["dropout"] = self.dropout
        if self.init_std is not None:
            overrides["init_std"] = self.init_std
        return overrides


_SIZE_FLAGS = {
    "encoder_layers": "layers",
    "decoder_layers": "layers",
    "encoder_attention_heads": "attention_heads",
    "decoder_attention_heads": "attention_heads",
    "encoder_ffn_dim": "ffn_dim",
    "decoder_ffn_dim": "ffn_dim",
}

#: §5.1: "approximately 25000 source tokens and 25000 target tokens" per step, on 8 GPUs.
PAPER_MAX_TOKENS_PER_PROCESS = (25_000 + 25_000) // 8


def _tensorboard_available() -> bool:
    """transformers' ``is_tensorboard_available`` (without importing transformers)."""
    return any(importlib.util.find_spec(name) is not None for name in ("tensorboard", "tensorboardX"))


@dataclass
class PaperRecipeArguments:
    """The paper's recipe (§5.2–§5.4, §6.1) as defaults of ``Seq2SeqTrainingArguments``' options, and the
    recipe's own options (:class:`hf_vanilla.training.arguments.PaperTrainingArguments` combines them)."""

    learning_rate: float | None = field(
        default=None,
        metadata={
            "help": "Peak learning rate. Default: d_model^-0.5 · warmup_steps^-0.5, the maximum of Eq. (3) "
            "(7.0e-4 for base with 4000 warmup steps)."
        },
    )
    lr_scheduler_type: str = field(
        default="inverse_sqrt",
        metadata={
            "help": "'inverse_sqrt' is Eq. (3) of §5.3 exactly (see PaperLRLambda); any HF schedule works."
        },
    )
    warmup_steps: float = field(default=4000, metadata={"help": "warmup_steps of Eq. (3) (paper: 4000)."})
    adam_beta1: float = field(default=0.9, metadata={"help": "Adam β1 (§5.3: 0.9)."})
    adam_beta2: float = field(default=0.98, metadata={"help": "Adam β2 (§5.3: 0.98)."})
    adam_epsilon: float = field(default=1e-9, metadata={"help": "Adam ε (§5.3: 1e-9)."})
    weight_decay: float = field(default=0.0, metadata={"help": "0 makes AdamW the paper's Adam."})
    do_train: bool = field(default=True, metadata={"help": "Train (pass --do_train false to only evaluate)."})
    do_eval: bool = field(
        default=True, metadata={"help": "Evaluate on the validation and test splits after training."}
    )
    max_steps: int = field(default=100_000, metadata={"help": "Training steps (§5.2: base 100k, big 300k)."})
    max_train_minutes: float = field(
        default=0,
        metadata={
            "help": "Stop training after this many minutes of training (wall time, summed over resumed runs) at a "
            "step end, with a checkpoint, and end as at --max_steps; 0 = no time limit (the paper counts steps)."
        },
    )
    lr_cooldown_fraction: float = field(
        default=0,
        metadata={
            "help": "With --max_train_minutes: over this last fraction of the minutes the learning rate falls "
            "linearly in time to 0 (Eq. (3) times the remaining share; a deviation from the paper). 0 = off."
        },
    )
    label_smoothing_factor: float = field(
        default=0.0,
        metadata={"help": "Must stay 0: label smoothing is --label_smoothing (in the model's loss)."},
    )
    predict_with_generate: bool = field(
        default=True, metadata={"help": "Evaluate BLEU on generated translations (beam 4, α = 0.6, §6.1)."}
    )
    bleu_tokenize: str = field(
        default="13a",
        metadata={
            "help": "sacreBLEU's BLEU tokenizer for evaluation: 13a (WMT's), intl, char, zh, none, ..."
        },
    )
    eval_strategy: str = field(
        default="steps", metadata={"help": "When to evaluate: 'no', 'steps', 'epoch'."}
    )
    eval_steps: float | None = field(default=1000, metadata={"help": "Evaluate every N steps."})
    save_steps: float = field(
        default=1000, metadata={"help": "Checkpoint every N steps (the paper: every 10 minutes)."}
    )
    logging_steps: float = field(default=100, metadata={"help": "Log the loss every N steps."})
    report_to: None | str | list[str] = field(  # noqa: RUF036 (the order HfArgumentParser parses)
        default="tensorboard" if _tensorboard_available() else "none",
        metadata={"help": "Where to log: 'tensorboard' (default when installed), 'none', ..."},
    )
    ddp_find_unused_parameters: bool | None = field(
        default=False, metadata={"help": "Every parameter is used in every step, so DDP need not search."}
    )
    average_last_n_checkpoints: int = field(
        default=0,
        metadata={
            "help": "After training, average the last N checkpoints into <output_dir>/averaged and evaluate "
            "it (§6.1: 5 for base, 20 for big; 0 = off)."
        },
    )
    max_grad_norm: float = field(
        default=0.0,
        metadata={
            "help": "Gradient clipping norm; 0 = none, as the paper (tensor2tensor: clip_grad_norm = 0)."
        },
    )
    max_tokens: int | None = field(
        default=PAPER_MAX_TOKENS_PER_PROCESS,
        metadata={
            "help": "Token budget per batch, process and micro-step: batch size × (longest source + longest "
            "target), padding included; replaces per_device_train_batch_size. The default is the paper's "
            "~25000 source + 25000 target tokens per step over its 8 GPUs (§5.1); one step sees max_tokens × "
            "processes × gradient_accumulation_steps. 0 = batches of per_device_train_batch_size sentences."
        },
    )
    bf16: str = field(
        default="false",
        metadata={
            "help": "Train in bfloat16 autocast (float32 weights, gradients, optimizer state and checkpoints): "
            "'auto' where the device computes bfloat16 natively (a CPU with AVX512-BF16, AMX or Arm BF16; a GPU "
            "with bf16), 'true' (refused on a CPU without them), 'false' (float32). Logged when the run starts.",
            "nargs": "?",
            "const": "true",
        },
    )
    overwrite: bool = field(
        default=False,
        metadata={
            "help": "Start a run in an --output_dir that is not empty (its files of the same name are replaced). "
            "Without it such a folder is refused; a folder with checkpoints of another run always is."
        },
    )
