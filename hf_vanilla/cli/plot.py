"""Draw the model's pictures as PNG files (matplotlib, Agg canvas).

# training curves (loss, validation BLEU, learning rate) of a Trainer run
hf-vanilla-plot --training_run runs/base --output_dir runs/base/plots
# the three attentions of one sentence (encoder self, decoder masked self, encoder-decoder: layers × heads),
# using the model's own translation; --masks adds the masks of a padded batch (the sentence and its first word)
hf-vanilla-plot --model_name_or_path runs/base --sentence "A man rides a bike." --masks --output_dir plots
# the sinusoidal positional encoding of §3.5 (d_model from the model, or --d_model)
hf-vanilla-plot --positional_encoding --d_model 512 --output_dir plots
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from hf_vanilla.cli import parse_arguments, run_cli
from hf_vanilla.inference.options import InferenceModelArguments
from hf_vanilla.io.atomic import OVERWRITE_HELP, refuse_to_replace


@dataclass
class PlotArguments:
    output_dir: str = field(default="plots", metadata={"help": "Folder for the PNG files."})
    training_run: str | None = field(
        default=None, metadata={"help": "Trainer output_dir (or trainer_state.json) → training_curves.png."}
    )
    sentence: str | None = field(
        default=None,
        metadata={
            "help": "Source sentence → encoder_self_attention_grid.png, decoder_self_attention_grid.png, "
            "cross_attention_grid.png and cross_attention_mean.png."
        },
    )
    masks: bool = field(
        default=False,
        metadata={
            "help": "With --sentence: attention_masks.png, the masks of a padded batch of two rows: the sentence "
            "(with --target or its translation) and its first word (with its translation)."
        },
    )
    target: str | None = field(
        default=None, metadata={"help": "Target sentence to force; default: the model's own translation."}
    )
    positional_encoding: bool = field(
        default=False, metadata={"help": "Draw positional_encoding.png (§3.5)."}
    )
    num_positions: int = field(
        default=100, metadata={"help": "Positions in the positional-encoding picture."}
    )
    d_model: int = field(
        default=512, metadata={"help": "d_model of the positional-encoding picture without a model."}
    )
    bleu_key: str = field(default="eval_bleu", metadata={"help": "Logged key of validation BLEU."})
    bleu_name: str = field(default="BLEU", metadata={"help": "What that BLEU is, e.g. 'character BLEU'."})
    label_smoothing: float | None = field(
        default=None,
        metadata={
            "help": "The run's label smoothing: the loss panel draws its floor (with the model's vocabulary)."
        },
    )
    dpi: int = field(default=100, metadata={"help": "Resolution of the PNG files."})
    overwrite: bool = field(default=False, metadata={"help": OVERWRITE_HELP})


@dataclass
class PlotModelArguments:
    """The model options a picture uses (not the batching, backend or quantization of translation)."""

    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Model folder or Hub id (needed for --sentence)."}
    )
    tokenizer_name_or_path: str | None = field(
        default=None, metadata={"help": "Tokenizer folder or Hub id; default: the model folder."}
    )
    device: str = field(
        default="auto", metadata={"help": "'auto' (CUDA if available), 'cpu', 'cuda', 'cuda:1', ..."}
    )
    trust_remote_code: bool = field(
        default=False,
        metadata={"help": "Allow code shipped with a Hub model (not needed with hf_vanilla installed)."},
    )


def _run(argv: list[str]) -> None:
    parser, (args, model_args) = parse_arguments(argv, (PlotArguments, PlotModelArguments), __doc__)
    if not (args.training_run or args.sentence or args.positional_encoding):
        parser.error(
            "Nothing to draw: pass --training_run, --sentence (with --model_name_or_path) or --positional_encoding."
        )
    if args.sentence and not model_args.model_name_or_path:
        parser.error("--sentence needs --model_name_or_path.")
    if args.masks and not args.sentence:
        parser.error("--masks needs --sentence (with --model_name_or_path).")
    if args.label_smoothing is not None and not (args.training_run and model_args.model_name_or_path):
        parser.error(
            "--label_smoothing needs --training_run and --model_name_or_path (for the vocabulary size)."
        )
    from hf_vanilla.analysis.plotting import (  # matplotlib and torch, after --help
        label_smoothing_floor,
        plot_attention,
        plot_attention_masks,
        plot_positional_encoding,
        plot_training_curves,
    )
    from hf_vanilla.inference.loading import load_model_and_tokenizer

    out = Path(args.output_dir)
    names = (["training_curves.png"] if args.training_run else []) + (
        [
            "encoder_self_attention_grid.png",
            "decoder_self_attention_grid.png",
            "cross_attention_grid.png",
            "cross_attention_mean.png",
        ]
        if args.sentence
        else []
    )
    names += ["attention_masks.png"] if args.masks else []
    for name in names + (["positional_encoding.png"] if args.positional_encoding else []):
        refuse_to_replace(  # before any work
            out / name, args.overwrite, "The picture", kind="file", inputs=[args.training_run]
        )
    written: list[Path] = []
    model = None
    if model_args.model_name_or_path:
        model, tokenizer = load_model_and_tokenizer(InferenceModelArguments(**vars(model_args)))
    if args.training_run:
        floor = None
        if args.label_smoothing is not None:
            floor = label_smoothing_floor(args.label_smoothing, model.config.vocab_size)
        written.append(
            plot_training_curves(
                args.training_run,
                out / "training_curves.png",
                args.bleu_key,
                args.dpi,
                bleu_name=args.bleu_name,
                loss_floor=floor,
            )
        )
    if args.sentence:
        written += plot_attention(model, tokenizer, args.sentence, out, target=args.target, dpi=args.dpi)
    if args.masks:
        pairs = [(args.sentence, args.target), (args.sentence.split()[0], None)]
        written.append(
            plot_attention_masks(model, tokenizer, pairs, out / "attention_masks.png", dpi=args.dpi)
        )
    if args.positional_encoding:
        d_model = model.config.d_model if model is not None else args.d_model
        written.append(
            plot_positional_encoding(
                out / "positional_encoding.png", args.num_positions, d_model, dpi=args.dpi
            )
        )
    for path in written:
        print(path)


def main(argv: list[str] | None = None) -> int:
    return run_cli(_run, argv)


if __name__ == "__main__":
    sys.exit(main())
