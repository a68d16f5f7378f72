"""Options of benchmarks/marian/run.py (``python -m benchmarks.marian.run --help``), read by every part of it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class BenchArguments:
    """Options of the side-by-side benchmark (defaults: the issue's cases at transformer-base size)."""

    size: str = field(default="base", metadata={"help": "Model size: tiny, small or base (Table 3 base)."})
    quick: bool = field(
        default=False,
        metadata={"help": "Fewer repeats and shorter outputs: about two minutes on two cores at base size."},
    )
    cases: str = field(
        default="train,generate,linear,memory",
        metadata={
            "help": "Comma-separated subset of: train, generate, linear, memory, multi30k, compiled "
            "(hf_vanilla with a static cache and torch.compile against itself eager; off by default), peers "
            "(CTranslate2 fp32/int8 and the quantized routes, benchmarks/ct2/run.py; off by default)."
        },
    )
    repeats: int | None = field(
        default=None, metadata={"help": "Timed repeats per model and case (default 5, 3 with --quick)."}
    )
    warmup: int = field(default=1, metadata={"help": "Untimed warm-up calls per model and case."})
    batch_size: int = field(
        default=32, metadata={"help": "Sentences per training step / large-batch decoding."}
    )
    source_length: int = field(default=32, metadata={"help": "Source tokens per sentence."})
    target_length: int = field(default=32, metadata={"help": "Target tokens per sentence (training)."})
    new_tokens: int | None = field(
        default=None, metadata={"help": "Tokens generated per sentence (default 64, 16 with --quick)."}
    )
    linear_lengths: str | None = field(
        default=None,
        metadata={
            "help": "Output lengths of the linear-growth check (default 16,64,256; 16,64 with --quick)."
        },
    )
    multi30k: str | None = field(
        default=None,
        metadata={
            "help": "Folder with Multi30k train.{de,en}.gz: adds the real-data epoch case (off by default)."
        },
    )
    multi30k_sentences: int | None = field(
        default=None,
        metadata={"help": "Use only this many (shuffled) training pairs; default the whole epoch."},
    )
    multi30k_source: str = field(default="de", metadata={"help": "Source language of the real-data case."})
    multi30k_target: str = field(default="en", metadata={"help": "Target language of the real-data case."})
    threads: int | None = field(
        default=None, metadata={"help": "torch threads (default: torch's choice, one per core)."}
    )
    clock: str = field(
        default="wall",
        metadata={
            "help": "wall (elapsed time) or cpu (this process's CPU time: robust to other processes on a shared "
            "machine when used with --threads 1)."
        },
    )
    seed: int = field(default=0, metadata={"help": "Seed of the weights, the inputs and the shuffle."})
    folder_code: bool = field(
        default=False,
        metadata={
            "help": "Time hf_vanilla as a model folder loaded without hf_vanilla runs it: the folder's class, "
            "stock operators and transformers' own search (fast paths off)."
        },
    )
    json_out: str | None = field(
        default=None, metadata={"help": "Also write all measurements to this JSON file."}
    )
    memory_child: str | None = field(
        default=None, metadata={"help": "Internal: measure the peak training memory of one model and exit."}
    )
