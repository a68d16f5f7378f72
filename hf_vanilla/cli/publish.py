r"""Write the folder that would be pushed to the Hugging Face Hub, and push it when asked.

    hf-vanilla-evaluate --model_name_or_path runs/base --validation_files DATA/val ...
    hf-vanilla-publish --model_name_or_path runs/base --output_dir runs/base/hub \
        --results_files runs/base/eval/validation.results.json
    # later, online and logged in (`hf auth login`):
    hf-vanilla-publish --push_only --output_dir runs/base/hub --push_to_hub --hub_model_id user/name

The folder holds model.safetensors, config.json (auto_map for AutoConfig, AutoModel and
AutoModelForSeq2SeqLM), the modeling code, generation_config.json, the tokenizer and README.md (the model
card rendered from hf_vanilla/hub/templates/model_card.md, with the scores, the decoding settings and the data's terms of use).
An existing --output_dir is kept unless --overwrite is given; then it is replaced whole.
The results files must have scored this model: hf-vanilla-evaluate records a sha256 of the weights it
loaded (model_sha256), which must match that of the weights publish loads from the model folder (older
results files: the same folder path).
--dataset (the data the card names) is required, unless the model folder is a training output that
recorded it (hf-vanilla-train --dataset ...: its training_args.json).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from hf_vanilla.cli import parse_arguments, run_cli
from hf_vanilla.hub.options import PublishArguments
from hf_vanilla.inference.options import InferenceModelArguments
from hf_vanilla.io.atomic import refuse_to_replace


@dataclass
class PublishModelArguments:
    """The model options publishing uses (not the batching, backend, precision or quantization of
    translation: the folder gets the weights as saved)."""

    model_name_or_path: str | None = field(
        default=None, metadata={"help": "The trained model folder (not needed with --push_only)."}
    )
    tokenizer_name_or_path: str | None = field(
        default=None, metadata={"help": "Tokenizer folder or Hub id; default: the model folder."}
    )
    device: str = field(default="cpu", metadata={"help": "Where to load the model while saving it."})
    trust_remote_code: bool = field(
        default=False,
        metadata={"help": "Allow code shipped with a Hub model (not needed with hf_vanilla installed)."},
    )


def _run(argv: list[str]) -> None:
    parser, (model_args, args) = parse_arguments(argv, (PublishModelArguments, PublishArguments), __doc__)
    from hf_vanilla.hub.card import card_data_recorded_in, load_results  # huggingface_hub and torch
    from hf_vanilla.hub.push import publish
    from hf_vanilla.inference.loading import load_model_and_tokenizer

    model = tokenizer = None
    if not args.push_only:
        if not model_args.model_name_or_path:
            parser.error("--model_name_or_path is required unless --push_only.")
        refuse_to_replace(  # before loading anything
            args.output_dir,
            args.overwrite,
            "--output_dir",
            inputs=[model_args.model_name_or_path, *(args.results_files or [])],
        )
        card_data_recorded_in(model_args.model_name_or_path, args)  # a training output, without --dataset
        load_results(
            args.results_files or [], model_args.model_name_or_path
        )  # this model's scores, read early
        model, tokenizer = load_model_and_tokenizer(InferenceModelArguments(**vars(model_args)))
    folder = publish(model, tokenizer, args, model_dir=model_args.model_name_or_path)
    print(folder)


def main(argv: list[str] | None = None) -> int:
    return run_cli(_run, argv)


if __name__ == "__main__":
    sys.exit(main())
