"""What the model card says about the data, and the publish command's options, importable without
huggingface_hub or torch so that a command's ``--help`` needs no torch; :mod:`hf_vanilla.hub.card` and
:mod:`hf_vanilla.hub.push` use them."""

from __future__ import annotations

from dataclasses import dataclass, field

from hf_vanilla.io.atomic import OVERWRITE_HELP

__all__ = ["KNOWN_DATASETS", "MULTI30K", "DatasetCard", "DatasetCardArguments", "PublishArguments"]


@dataclass
class DatasetCard:
    """What the model card says about the training/evaluation data."""

    dataset_id: str
    name: str
    url: str | None = None
    terms: str = ""
    citation: str | None = None
    #: Hub license of the weights: "other" when the data's terms restrict their use.
    license: str = "other"
    license_name: str | None = None
    license_link: str | None = None


#: Multi30k Task 1, as described in /work/shared/data/multi30k/README.md (no LICENSE upstream; the
#: authors provide it for non-commercial research and education only).
MULTI30K = DatasetCard(
    dataset_id="multi30k",
    name="Multi30k (Task 1)",
    url="https://github.com/multi30k/dataset",
    terms=(
        'Multi30K has no license file. Its authors provide the resources "solely [...] for researchers and '
        'educators who wish to use the dataset for non-commercial research and/or educational purposes"; '
        "it is partly derived from Flickr30K, whose images fall under the Flickr Terms of Use (only the text "
        "was used here). The data is not openly licensed, so these weights inherit the restriction: "
        "**non-commercial research and education use only**."
    ),
    citation=(
        "@inproceedings{elliott-etal-2016-multi30k,\n"
        "  title     = {Multi30K: Multilingual English-German Image Descriptions},\n"
        "  author    = {Elliott, Desmond and Frank, Stella and Sima'an, Khalil and Specia, Lucia},\n"
        "  booktitle = {Proceedings of the 5th Workshop on Vision and Language},\n"
        "  pages     = {70--74},\n"
        "  year      = {2016},\n"
        "  doi       = {10.18653/v1/W16-3210},\n"
        "}"
    ),
    license="other",
    license_name="multi30k-non-commercial-research",
    license_link="https://github.com/multi30k/dataset",
)

KNOWN_DATASETS = {"multi30k": MULTI30K}


@dataclass(kw_only=True)
class DatasetCardArguments:
    """The training data as the model card names it, with its terms and the weights' license. There is no
    default: ``hf-vanilla-publish`` requires it, and ``hf-vanilla-train --push_to_hub`` requires it before
    training and records it in ``training_args.json``."""

    dataset: str | None = field(
        default=None,
        metadata={
            "help": f"For the model card: the training data, one of {sorted(KNOWN_DATASETS)} or 'custom' (then "
            "give --dataset_id, --data_terms and --weights_license). Required to publish, unless the training "
            "run recorded it."
        },
    )
    dataset_id: str | None = field(
        default=None, metadata={"help": "custom data: Hub dataset id or short name."}
    )
    dataset_display_name: str | None = field(
        default=None, metadata={"help": "custom data: name on the card."}
    )
    data_terms: str | None = field(
        default=None, metadata={"help": "custom data: its license / terms of use."}
    )
    weights_license: str | None = field(
        default=None,
        metadata={"help": "custom data: Hub license id of the weights (e.g. 'apache-2.0', 'other')."},
    )


@dataclass
class PublishArguments(DatasetCardArguments):
    """What to publish and where (and, from :class:`DatasetCardArguments`, the data the card names:
    required unless ``--push_only``)."""

    output_dir: str = field(
        metadata={
            "help": "The folder to write: exactly what would be pushed to the Hub (an existing one needs "
            "--overwrite, and is then replaced whole)."
        }
    )
    results_files: list[str] | None = field(
        default=None,
        metadata={
            "help": "One or more <split>.results.json written by hf-vanilla-evaluate (scores for the card)."
        },
    )
    push_to_hub: bool = field(
        default=False, metadata={"help": "Upload the folder (needs --hub_model_id, network, login)."}
    )
    hub_model_id: str | None = field(
        default=None, metadata={"help": "Hub repo id, e.g. 'user/transformer-base-en-de'."}
    )
    private: bool = field(
        default=False,
        metadata={"help": "Create the Hub repo as private (without it: the owner's default visibility)."},
    )
    hub_revision: str | None = field(
        default=None,
        metadata={"help": "Push to this branch of the repo (created if needed) instead of main."},
    )
    push_only: bool = field(
        default=False, metadata={"help": "Push an already written --output_dir without rebuilding it."}
    )
    overwrite: bool = field(default=False, metadata={"help": OVERWRITE_HELP})
    model_name: str | None = field(
        default=None,
        metadata={
            "help": "Title of the card; default: the title the model folder records (the demo's), else the "
            "Hub repo's name."
        },
    )
    training_summary: str | None = field(
        default=None,
        metadata={
            "help": "Training paragraph; default: what the model folder records (training_record.json, "
            "trainer_state.json), 'unknown' where it records nothing."
        },
    )
    code_url: str | None = field(default=None, metadata={"help": "Link to the hf_vanilla code on the card."})
    model_card_template: str | None = field(
        default=None,
        metadata={"help": "Jinja template of the card; default: hf_vanilla/hub/templates/model_card.md."},
    )
