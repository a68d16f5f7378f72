"""The demo's options, importable without torch so that ``hf-vanilla-demo --help`` needs no torch;
:mod:`hf_vanilla.demo.run` uses them."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from hf_vanilla.io.atomic import OVERWRITE_HELP

__all__ = ["QUICK_CAPS", "QUICK_SETTINGS", "DemoArguments"]


#: What ``--quick`` runs with; a size flag set to another value is refused with it. The ones in
#: :data:`QUICK_CAPS` are upper bounds: a smaller value given with ``--quick`` is kept.
QUICK_SETTINGS = {
    "max_steps": 20,
    "warmup_steps": 5,
    "train_size": 300,
    "validation_size": 20,
    "test_size": 40,
    "d_model": 32,
    "ffn_dim": 64,
    "layers": 1,
    "eval_times": 1,
}

QUICK_CAPS = frozenset({"max_steps", "warmup_steps"})


@dataclass
class DemoArguments:
    """The demo's settings; the defaults reach ≥ 99 % exact match in a few minutes on 2 CPU cores."""

    output_dir: str = field(
        default="demo_output", metadata={"help": "Where to write the model and pictures."}
    )
    seed: int = field(
        default=0, metadata={"help": "Seed for the data split, initialisation and batch order."}
    )
    max_steps: int = field(default=1000, metadata={"help": "Training steps."})
    overwrite: bool = field(default=False, metadata={"help": OVERWRITE_HELP})
    quick: bool = field(
        default=False,
        metadata={
            "help": "A tiny run (seconds) that checks the plumbing; accuracy will be low. It sets the sizes "
            "itself: other size flags are refused with it (smaller --max_steps and --warmup_steps are kept)."
        },
    )
    max_number: int = field(default=9999, metadata={"help": "Numbers are drawn from 0..max_number."})
    train_size: int = field(default=6000, metadata={"help": "Training pairs."})
    validation_size: int = field(default=200, metadata={"help": "Validation pairs (BLEU during training)."})
    test_size: int = field(default=1000, metadata={"help": "Held-out test pairs (final scores)."})
    vocab_size: int = field(default=400, metadata={"help": "Shared byte-level BPE vocabulary (≥ 260)."})
    d_model: int = field(default=64, metadata={"help": "d_model."})
    layers: int = field(default=2, metadata={"help": "N, for encoder and decoder."})
    attention_heads: int = field(default=4, metadata={"help": "h."})
    ffn_dim: int = field(default=256, metadata={"help": "d_ff."})
    dropout: float = field(default=0.1, metadata={"help": "P_drop (§5.4)."})
    label_smoothing: float = field(default=0.1, metadata={"help": "ε_ls (§5.4)."})
    max_tokens: int = field(
        default=2048, metadata={"help": "Token budget per batch, source + target with padding (§5.1)."}
    )
    warmup_steps: int = field(default=100, metadata={"help": "warmup_steps of Eq. (3)."})
    learning_rate: float | None = field(
        default=3e-3,
        metadata={
            "help": "Peak learning rate of the Eq. (3) schedule; None = d_model^-0.5 · warmup_steps^-0.5, which "
            "for this small model and short warmup (0.0125) is too high."
        },
    )
    eval_times: int = field(
        default=4, metadata={"help": "How many times to compute validation BLEU during training (greedy)."}
    )
    num_samples: int = field(default=8, metadata={"help": "Held-out translations to show at the end."})
    threads: int = field(
        default=1,
        metadata={
            "help": "torch CPU threads. The model is tiny: its matrices are too small to gain much from "
            "several threads, and on a busy 2-core machine 2 threads were 5-30x slower per step than 1 "
            "(threads waiting on each other)."
        },
    )

    def __post_init__(self) -> None:
        if self.quick:
            defaults = {f.name: f.default for f in fields(self)}
            changed = [
                f"--{name} {getattr(self, name)}"
                for name, value in QUICK_SETTINGS.items()
                if getattr(self, name) != defaults[name]
                and not (name in QUICK_CAPS and getattr(self, name) <= value)
            ]
            if changed:
                raise ValueError(
                    f"--quick sets its own sizes and would ignore {', '.join(changed)}: drop --quick to use them, "
                    "or drop them for the quick run (--max_steps and --warmup_steps up to its own are kept)."
                )
            for name, value in QUICK_SETTINGS.items():
                setattr(self, name, min(getattr(self, name), value) if name in QUICK_CAPS else value)
        for name in ("train_size", "test_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be at least 1 pair, got {getattr(self, name)}.")
        if self.validation_size < 0:
            raise ValueError(f"--validation_size must be 0 or more pairs, got {self.validation_size}.")
        if self.threads < 1:
            raise ValueError(f"--threads must be at least 1, got {self.threads}.")
        if self.max_steps < 1:
            raise ValueError(f"--max_steps must be at least 1, got {self.max_steps}.")
