"""Write the exact folder that is pushed to the Hugging Face Hub, and push it when asked.

:func:`save_for_hub` writes:

* ``model.safetensors``, ``config.json`` and ``generation_config.json`` (the paper's §6.1 decoding:
  beam 4, α = 0.6; the input length + 50 bound is the model's ``generate()`` default);
* the modeling code, copied by ``register_for_auto_class`` (``modeling_vanilla_transformer.py``,
  ``configuration_vanilla_transformer.py`` and their relative imports ``fast_paths.py``,
  ``generation_vanilla_transformer.py`` and ``saving_vanilla_transformer.py``), with an ``auto_map`` for ``AutoConfig``, ``AutoModel`` and
  ``AutoModelForSeq2SeqLM`` so ``from_pretrained(..., trust_remote_code=True)`` works where hf_vanilla
  is not installed (transformers alone maps only the saved class and ``AutoConfig``; the model's
  ``save_pretrained`` adds ``AutoModel``, and the folder is checked for all three);
* the tokenizer files;
* ``README.md``: the model card rendered from the Jinja template ``hf_vanilla/templates/model_card.md`` with YAML metadata
  (languages, license, tags, datasets, metrics and a ``model-index`` with the measured scores) and the
  data's terms of use.

:func:`push_to_hub` uploads that folder with ``huggingface_hub.HfApi`` (``create_repo`` +
``upload_folder``). When the Hub cannot be reached (``HF_HUB_OFFLINE=1``, no network, no token) it
raises :class:`HubPushError`, whose message says that the local folder is kept and how to push it later.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import huggingface_hub
from huggingface_hub import EvalResult, HfApi, ModelCard, ModelCardData
from huggingface_hub.errors import HfHubHTTPError, LocalTokenNotFoundError
from transformers.dynamic_module_utils import custom_object_save, get_relative_imports

from hf_vanilla.cli import OVERWRITE_HELP
from hf_vanilla.configuration_vanilla_transformer import VanillaTransformerConfig
from hf_vanilla.durability import atomic_directory, refuse_to_replace
from hf_vanilla.modeling_vanilla_transformer import (
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerModel,
)
from hf_vanilla.pipeline_vanilla_transformer import TASK as PIPELINE_TASK
from hf_vanilla.pipeline_vanilla_transformer import VanillaTranslationPipeline
from hf_vanilla.safe_loading import PICKLE_SUFFIXES, weights_fingerprint
from hf_vanilla.saving_vanilla_transformer import restored_auto_class_registration
from hf_vanilla.translate import EARLY_STOPPING

logger = logging.getLogger(__name__)

#: The training arguments, as JSON, in every model folder the Trainer writes (instead of a pickle); they
#: include the model card's data (:class:`DatasetCardArguments`).
TRAINING_ARGS_JSON = "training_args.json"

__all__ = [
    "KNOWN_DATASETS",
    "MULTI30K",
    "TRAINING_ARGS_JSON",
    "DatasetCard",
    "DatasetCardArguments",
    "HubPushError",
    "PublishArguments",
    "card_data_recorded_in",
    "check_results_model",
    "dataset_card_from_args",
    "default_template_path",
    "finish_model_folder",
    "limit_tokenizer_length",
    "load_results",
    "publish",
    "push_to_hub",
    "registered_for_remote_code",
    "render_model_card",
    "save_for_hub",
    "save_model_folder",
    "summarize_training",
]

_LANGUAGE_NAMES = {"de": "German", "en": "English", "fr": "French", "cs": "Czech"}
_EXAMPLES = {"en": "A man rides a bike.", "de": "Ein Mann fährt Fahrrad.", "fr": "Un homme fait du vélo."}


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


class HubPushError(OSError):
    """The upload did not happen; the local folder is kept."""


def default_template_path() -> Path:
    """The Jinja model-card template shipped in the package, ``hf_vanilla/templates/model_card.md``."""
    return Path(__file__).resolve().parent / "templates" / "model_card.md"


def render_model_card(
    config: Any,
    results: Sequence[dict[str, Any]],
    decoding: dict[str, Any],
    source_lang: str,
    target_lang: str,
    dataset: DatasetCard,
    repo_id: str = "path/to/this/folder",
    model_name: str | None = None,
    num_parameters: int | None = None,
    training_summary: str | None = None,
    example_source: str | None = None,
    extra_tags: Sequence[str] = (),
    code_url: str | None = None,
    template_path: str | Path | None = None,
) -> ModelCard:
    """Render the model card (YAML metadata + Markdown) from the Jinja template.

    Args:
        config: the model config (architecture table).
        results: one dict per evaluated split, as returned by
            :func:`hf_vanilla.evaluation.evaluate_translations` plus ``"dataset_name"`` and ``"split"``
            (e.g. ``{"split": "validation", "bleu": ..., "chrf": ..., "bleu_signature": ...,
            "chrf_signature": ..., "num_segments": ...}``).
        decoding: the decoding settings used for the scores (``DecodingOptions.to_dict()``).
        source_lang / target_lang: ISO 639-1 codes.
        dataset: the data's name, link, terms and the resulting license of the weights (no default:
            the card must name the data the model was trained on).
        code_url: where the hf_vanilla code lives (linked from the card when given).
    """
    required = ("split", "bleu", "chrf", "bleu_signature", "chrf_signature", "num_segments")
    for result in results:
        missing = [key for key in required if key not in result]
        if missing:
            raise ValueError(
                f"A result lacks {missing}: pass the output of evaluate_translations plus 'split'."
            )
    model_name = model_name or repo_id.split("/")[-1]
    eval_results = []
    for result in results:
        for metric, name in (("bleu", "BLEU"), ("chrf", "chrF")):
            eval_results.append(
                EvalResult(
                    task_type="translation",
                    task_name=f"Translation {source_lang}-{target_lang}",
                    dataset_type=dataset.dataset_id,
                    dataset_name=result.get("dataset_name", dataset.name),
                    dataset_config=f"{source_lang}-{target_lang}",
                    dataset_split=result["split"],
                    metric_type=metric,
                    metric_name=name,
                    metric_value=round(float(result[metric]), 2),
                    metric_config=result[f"{metric}_signature"],
                )
            )
    card_data = ModelCardData(
        language=[source_lang, target_lang],
        license=dataset.license,
        license_name=dataset.license_name if dataset.license == "other" else None,
        license_link=dataset.license_link if dataset.license == "other" else None,
        library_name="transformers",
        pipeline_tag="translation",
        tags=["translation", "transformer", "vanilla-transformer", "attention-is-all-you-need", *extra_tags],
        datasets=[dataset.dataset_id],
        metrics=["bleu", "chrf"],
        model_name=model_name,
        eval_results=eval_results or None,
    )
    template = Path(template_path) if template_path is not None else default_template_path()
    license_summary = (
        f"`{dataset.license_name}`, see the terms above"
        if dataset.license == "other"
        else f"`{dataset.license}`"
    )
    return ModelCard.from_template(
        card_data,
        template_path=str(template),
        model_name=model_name,
        repo_id=repo_id,
        code_url=code_url,
        source_language=_LANGUAGE_NAMES.get(source_lang, source_lang),
        target_language=_LANGUAGE_NAMES.get(target_lang, target_lang),
        dataset_name=dataset.name,
        dataset_url=dataset.url,
        dataset_citation=dataset.citation,
        data_terms=dataset.terms,
        license_summary=license_summary,
        vocab_size=config.vocab_size,
        encoder_layers=config.encoder_layers,
        decoder_layers=config.decoder_layers,
        d_model=config.d_model,
        heads=config.encoder_attention_heads,
        ffn_dim=config.encoder_ffn_dim,
        dropout=config.dropout,
        num_parameters=f"{num_parameters:,}" if num_parameters is not None else "n/a",
        results=[{"dataset_name": dataset.name, **r} for r in results],
        decoding=decoding.get("description", str(decoding)),
        length_penalty_type=decoding.get("length_penalty_type", "hf"),
        training_summary=training_summary,
        example_source=example_source or _EXAMPLES.get(source_lang, "..."),
    )


def _code_name(cls: type) -> str:
    """``<code file>.<class>``, how ``config.json`` names a class whose code is in the model folder."""
    return f"{cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}"


#: ``config.json``'s ``auto_map`` in every folder hf_vanilla writes: each Auto class → the hf_vanilla
#: class it loads, whose code file is in the folder.
AUTO_MAP = {
    "AutoConfig": _code_name(VanillaTransformerConfig),
    "AutoModel": _code_name(VanillaTransformerModel),
    "AutoModelForSeq2SeqLM": _code_name(VanillaTransformerForConditionalGeneration),
}

#: ``config.json``'s entry that lets ``pipeline(TASK, model=folder, trust_remote_code=True)`` find the
#: pipeline class in the folder (what ``Pipeline.save_pretrained`` writes for a registered pipeline).
CUSTOM_PIPELINES = {
    PIPELINE_TASK: {
        "impl": _code_name(VanillaTranslationPipeline),
        "pt": ["AutoModelForSeq2SeqLM"],
        "type": "text",
    }
}


@contextlib.contextmanager
def registered_for_remote_code(model: Any) -> Iterator[None]:
    """While inside, ``model.save_pretrained`` writes the modeling code (and its relative imports,
    ``fast_paths.py``, ``generation_vanilla_transformer.py``, ``saving_vanilla_transformer.py``), an ``auto_map`` for ``AutoConfig``,
    ``AutoModel`` and ``AutoModelForSeq2SeqLM``, and the pipeline entry. The classes' registration and the config are restored afterwards."""
    with restored_auto_class_registration(model, "auto_map", "custom_pipelines"):
        # The model's save_pretrained maps AutoConfig, AutoModel and AutoModelForSeq2SeqLM once registered
        # (transformers alone would map only the saved class and AutoConfig); _check_folder verifies it.
        model.config.register_for_auto_class("AutoConfig")
        model.register_for_auto_class("AutoModelForSeq2SeqLM")
        model.config.custom_pipelines = CUSTOM_PIPELINES
        yield


def limit_tokenizer_length(tokenizer: Any, config: Any) -> None:
    """Set ``tokenizer.model_max_length`` (unset: 1e30) to the model's ``max_position_embeddings``, the
    longest input the model is meant for, so that ``truncation=True`` and the length warning use it."""
    if tokenizer.model_max_length > config.max_position_embeddings:
        tokenizer.model_max_length = config.max_position_embeddings


def finish_model_folder(folder: str | Path) -> None:
    """Copy the pipeline code into a folder saved inside :func:`registered_for_remote_code`, then check it:
    weights in safetensors, ``auto_map`` with its code files, no pickle."""
    folder = Path(folder)
    custom_object_save(VanillaTranslationPipeline, folder)
    _check_folder(folder)


def save_model_folder(model: Any, tokenizer: Any | None, folder: str | Path) -> Path:
    """The one writer of hf_vanilla model folders (demo, training output, averaged and converted models,
    the Hub folder): ``model.safetensors``, ``config.json`` with ``auto_map`` and ``custom_pipelines``,
    the modeling, configuration, fast-path and pipeline code, ``generation_config.json`` and the tokenizer
    (its ``model_max_length`` set by :func:`limit_tokenizer_length`). It loads with
    ``AutoModelForSeq2SeqLM`` / ``AutoTokenizer`` ``.from_pretrained(folder, trust_remote_code=True)``
    and ``pipeline("vanilla-translation", model=folder, trust_remote_code=True)`` where hf_vanilla is
    not installed; with hf_vanilla imported, its own classes are used instead.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with registered_for_remote_code(model):
        model.save_pretrained(folder)
    if tokenizer is not None:
        limit_tokenizer_length(tokenizer, model.config)
        tokenizer.save_pretrained(folder)
    finish_model_folder(folder)
    return folder


def save_for_hub(
    model: Any,
    tokenizer: Any,
    folder: str | Path,
    card: ModelCard,
    metadata: dict[str, Any] | None = None,
) -> Path:
    """Write everything that would be pushed into ``folder`` and return it: the model folder of
    :func:`save_model_folder`, the card as ``README.md`` and ``metadata`` (e.g. scores and decoding
    settings) as ``hub_metadata.json``.

    The model's classes are registered for the Auto classes only while saving, so later checkpoints
    written by the same process are not changed by it.
    """
    folder = save_model_folder(model, tokenizer, folder)
    card.save(folder / "README.md")
    if metadata is not None:
        (folder / "hub_metadata.json").write_text(
            json.dumps(metadata, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )
    _check_folder(folder, needed=("README.md", "tokenizer_config.json"))
    logger.info("Wrote the Hub folder %s", folder)
    return folder


def _check_folder(folder: Path, needed: Sequence[str] = ()) -> None:
    """Fail loudly if the folder lacks a piece a user of the model needs, holds a pickle, or maps an Auto
    class to anything but hf_vanilla's class (:data:`AUTO_MAP`) defined in a code file of the folder whose
    relative imports are there too."""
    needed = ["model.safetensors", "config.json", "generation_config.json", *needed]
    missing = [name for name in needed if not (folder / name).is_file()]
    pickles = sorted(path.name for path in folder.iterdir() if path.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise RuntimeError(
            f"The model folder {folder} holds pickled files {pickles}: write them as safetensors/JSON."
        )
    auto_map = json.loads((folder / "config.json").read_text()).get("auto_map", {})
    missing += [f"auto_map[{key}]" for key in AUTO_MAP if key not in auto_map]
    foreign = [f"{key} -> {value!r}" for key, value in auto_map.items() if AUTO_MAP.get(key) != value]
    if foreign:
        raise RuntimeError(
            f"The model folder {folder} maps Auto classes to code that is not hf_vanilla's "
            f"({', '.join(foreign)}; expected {AUTO_MAP}): it would not load where hf_vanilla is not installed."
        )
    undefined = []
    for entry in [*auto_map.values(), *(task["impl"] for task in CUSTOM_PIPELINES.values())]:
        module, name = entry.rsplit(".", 1)
        code = folder / f"{module}.py"
        if not code.is_file():
            missing.append(code.name)
            continue
        missing += [
            f"{imported}.py"
            for imported in get_relative_imports(code)
            if not (folder / f"{imported}.py").is_file()
        ]
        if name not in _defined_classes(code):
            undefined.append(f"{name} in {code.name}")
    if missing:
        raise RuntimeError(
            f"The model folder {folder} is incomplete, missing: {list(dict.fromkeys(missing))}."
        )
    if undefined:
        raise RuntimeError(
            f"The model folder {folder}'s code does not define the classes config.json names: {undefined}."
        )


def _defined_classes(code: Path) -> set[str]:
    """The names of the classes a Python file defines at its top level."""
    tree = ast.parse(code.read_text(encoding="utf-8"), filename=str(code))
    return {node.name for node in tree.body if isinstance(node, ast.ClassDef)}


def _network_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean "the Hub could not be reached or refused us", as raised by huggingface_hub's
    HTTP client (httpx2 in huggingface_hub 2.x, httpx in 1.x) — ConnectionError covers offline mode."""
    errors: list[type[BaseException]] = [OSError, HfHubHTTPError, LocalTokenNotFoundError]
    for name in ("httpx2", "httpx"):
        try:
            errors.append(importlib.import_module(name).TransportError)
        except ImportError:
            continue
    return tuple(errors)


def push_to_hub(
    folder: str | Path,
    repo_id: str,
    private: bool | None = None,
    token: str | None = None,
    commit_message: str = "Upload hf_vanilla Transformer",
    revision: str | None = None,
) -> str:
    """Create ``repo_id`` (if needed; ``private=None``: the owner's default visibility) and upload
    ``folder`` to its main branch, or to the branch ``revision`` (created from main if needed; a pull
    request's ``refs/pr/N`` is used as it is); return the commit URL.

    Raises:
        HubPushError: the Hub is unreachable (offline mode, no network), the token is missing or the
            Hub refused the upload. The message, one line, names the kept local folder and the command
            to retry.
    """
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} is not a saved model folder: write it first with save_for_hub.")
    options = f" --hub_revision {revision}" if revision else ""
    upload_options = f" --revision {revision}" if revision else ""
    if private:
        options, upload_options = options + " --private", upload_options + " --private"
    later = (
        f"The local folder {folder} is kept. Push it later, when online and logged in (`hf auth login`), with "
        f"`hf-vanilla-publish --push_only --output_dir {folder} --push_to_hub --hub_model_id {repo_id}{options}` "
        f"(or `hf upload {repo_id} {folder} .{upload_options}`)."
    )
    if huggingface_hub.constants.HF_HUB_OFFLINE:
        raise HubPushError(f"Not pushing to the Hub: offline mode is on (HF_HUB_OFFLINE=1). {later}")
    api = HfApi(token=token)
    try:
        # The full id: a bare name is created under the logged-in user.
        full_id = api.create_repo(repo_id=repo_id, repo_type="model", private=private, exist_ok=True).repo_id
        if revision and not revision.startswith("refs/pr/"):
            api.create_branch(repo_id=full_id, branch=revision, repo_type="model", exist_ok=True)
        commit = api.upload_folder(
            repo_id=full_id,
            folder_path=str(folder),
            repo_type="model",
            commit_message=commit_message,
            revision=revision,
        )
    except _network_errors() as err:
        reason = " ".join(str(err).split())  # one line: HTTP errors carry the server's reply on more lines
        raise HubPushError(f"Pushing {folder} to the Hub repo {repo_id!r} failed: {reason}. {later}") from err
    url = str(getattr(commit, "commit_url", commit))
    logger.info("Pushed %s to %s", folder, url)
    return url


# --------------------------------------------------------------------------------------------------
# The publish command (hf-vanilla-publish, scripts/publish.py)
# --------------------------------------------------------------------------------------------------

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
        default=None, metadata={"help": "Title of the card; default: the repo name."}
    )
    training_summary: str | None = field(
        default=None,
        metadata={"help": "Training paragraph; default: built from the model folder's trainer_state.json."},
    )
    code_url: str | None = field(default=None, metadata={"help": "Link to the hf_vanilla code on the card."})
    model_card_template: str | None = field(
        default=None,
        metadata={"help": "Jinja template of the card; default: hf_vanilla/templates/model_card.md."},
    )


def dataset_card_from_args(args: DatasetCardArguments) -> DatasetCard:
    """The data card named by ``--dataset``, or a custom one from ``--dataset_id`` etc."""
    if args.dataset is None:
        raise ValueError(
            f"--dataset is required: name the training data ({', '.join(sorted(KNOWN_DATASETS))}, or 'custom' with "
            "--dataset_id, --data_terms and --weights_license); the card states its terms and the weights' license."
        )
    if args.dataset in KNOWN_DATASETS:
        return KNOWN_DATASETS[args.dataset]
    if args.dataset != "custom":
        raise ValueError(
            f"Unknown --dataset {args.dataset!r}: choose one of {sorted(KNOWN_DATASETS)} or 'custom'."
        )
    missing = [name for name in ("dataset_id", "data_terms", "weights_license") if not getattr(args, name)]
    if missing:
        raise ValueError(
            f"--dataset custom needs {', '.join('--' + m for m in missing)}: the card must state the data's terms "
            "and the license of the weights."
        )
    return DatasetCard(
        dataset_id=args.dataset_id,
        name=args.dataset_display_name or args.dataset_id,
        terms=args.data_terms,
        license=args.weights_license,
        license_name="custom-data-terms" if args.weights_license == "other" else None,
    )


def card_data_recorded_in(folder: str | Path, args: DatasetCardArguments) -> None:
    """Without ``--dataset`` in ``args``, take the card's data fields recorded by the training run in
    ``folder`` (its ``training_args.json``, as a checkpoint or the training output holds it), each
    unless given in ``args``; ``args`` is left alone when it names a dataset or nothing is recorded."""
    recorded = Path(folder) / TRAINING_ARGS_JSON
    if args.dataset is not None or not recorded.is_file():
        return
    values = json.loads(recorded.read_text(encoding="utf-8"))
    if values.get("dataset") is None:
        return
    for card_field in fields(DatasetCardArguments):
        if getattr(args, card_field.name) is None:
            setattr(args, card_field.name, values.get(card_field.name))
    logger.info(
        "The model card's data, as the training run recorded it in %s: --dataset %s", recorded, args.dataset
    )


def _read_result(path: Path) -> dict[str, Any]:
    """One ``<split>.results.json``: a JSON object whose ``decoding`` names the beam size and α."""
    try:
        result = json.loads(path.read_text(encoding="utf-8-sig"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(
            f"--results_files {path}: not a JSON results file ({err}); write it with hf-vanilla-evaluate."
        ) from None
    if not isinstance(result, dict):
        raise ValueError(
            f"--results_files {path}: a JSON {type(result).__name__}, not the object hf-vanilla-evaluate writes; "
            "pass the <split>.results.json it wrote."
        )
    decoding = result.get("decoding")
    if not isinstance(decoding, dict) or not {"num_beams", "length_penalty"} <= set(decoding):
        raise ValueError(
            f"--results_files {path}: its 'decoding' ({decoding!r}) does not name num_beams and length_penalty; "
            "write the file with hf-vanilla-evaluate."
        )
    return result


def check_results_model(path: str | Path, result: dict[str, Any], model_dir: str | Path) -> None:
    """Refuse results that scored another model than ``model_dir``: the weights fingerprint
    (``model_sha256``, :func:`hf_vanilla.safe_loading.weights_fingerprint`) must match; a file written
    before fingerprints were recorded must name the same folder (``model``)."""
    recorded, named = result.get("model_sha256"), result.get("model")
    redo = f"evaluate it (hf-vanilla-evaluate --model_name_or_path {model_dir} ...) and pass those results."
    if recorded is not None:
        if recorded != weights_fingerprint(model_dir):
            raise ValueError(
                f"--results_files {path} scored other weights (model {named}) than --model_name_or_path "
                f"{model_dir}: the card must show this model's scores; {redo}"
            )
        return
    if named is None:
        raise ValueError(f"--results_files {path} names no model, so its scores cannot be checked: {redo}")
    same = (
        Path(named).resolve() == Path(model_dir).resolve()
        if Path(named).exists()
        else named == str(model_dir)
    )
    if not same:
        raise ValueError(
            f"--results_files {path} scored model {named}, not --model_name_or_path {model_dir}: the card must "
            f"show this model's scores; {redo}"
        )
    logger.warning(
        "%s records no weights fingerprint (an older hf-vanilla-evaluate): checked by path only.", path
    )


def load_results(paths: Sequence[str | Path], model_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """Read evaluation results; all must share languages and decoding settings and, with ``model_dir``,
    have scored that model (:func:`check_results_model`)."""
    if not paths:
        raise ValueError(
            "The model card needs measured scores: run hf-vanilla-evaluate first and pass its "
            "<split>.results.json with --results_files."
        )
    results = [_read_result(Path(path)) for path in paths]
    if model_dir is not None:
        for path, result in zip(paths, results, strict=True):
            check_results_model(path, result, model_dir)
    for key in ("source_lang", "target_lang", "decoding"):
        values = {json.dumps(result.get(key), sort_keys=True) for result in results}
        if len(values) > 1:
            raise ValueError(
                f"The results files disagree on {key!r} ({sorted(values)}): publish one setting at a time."
            )
        if results[0].get(key) is None:
            raise ValueError(f"{paths[0]} has no {key!r}: write it with hf-vanilla-evaluate.")
    return results


def summarize_training(model_dir: str | Path) -> str | None:
    """A sentence from ``trainer_state.json`` in the model folder, if there is one."""
    state_file = Path(model_dir) / "trainer_state.json"
    if not state_file.is_file():
        return None
    state = json.loads(state_file.read_text())
    parts = [f"Trained for {state.get('global_step', '?')} optimizer steps"]
    if state.get("epoch") is not None:
        parts.append(f"({float(state['epoch']):.1f} epochs)")
    text = " ".join(parts) + " with hf_vanilla's Trainer recipe (§5)."
    if state.get("best_metric") is not None and state.get("best_model_checkpoint"):
        text += f" Best validation metric during training: {float(state['best_metric']):.2f}."
    return text


def publish(model: Any, tokenizer: Any, args: PublishArguments, model_dir: str | Path | None = None) -> Path:
    """Write the Hub folder for ``model`` (see :func:`save_for_hub`) and push it if ``args.push_to_hub``.

    The generation config in the folder is set to the beam size, α and stopping rule that produced the
    card's scores. With ``model_dir`` (the folder ``model`` was loaded from) every results file must have
    scored that model (:func:`check_results_model`); without it nothing can be compared, so the caller
    vouches for the scores. An existing ``output_dir`` is refused (``FileExistsError``) unless ``args.overwrite``;
    the folder is written under a temporary name and then replaces the old one whole, so it holds exactly
    what would be pushed (no stale files, no hand-written README.md kept by accident) and a failure leaves
    the old one as it was. Raises :class:`HubPushError` (folder kept) when the push fails.
    """
    if args.push_to_hub and not args.hub_model_id:
        raise ValueError("--push_to_hub needs --hub_model_id (e.g. 'user/transformer-base-en-de').")
    folder = Path(args.output_dir)
    if not args.push_only:
        refuse_to_replace(
            folder, args.overwrite, "--output_dir", inputs=[model_dir, *(args.results_files or [])]
        )
        results = load_results(args.results_files or [], model_dir)
        decoding = results[0]["decoding"]
        model.generation_config.num_beams = decoding["num_beams"]
        model.generation_config.length_penalty = decoding["length_penalty"]
        if "early_stopping" in decoding:  # results written before issue 12 do not name it
            model.generation_config.early_stopping = EARLY_STOPPING[decoding["early_stopping"]]
        card = render_model_card(
            model.config,
            results,
            decoding,
            results[0]["source_lang"],
            results[0]["target_lang"],
            dataset=dataset_card_from_args(args),
            repo_id=args.hub_model_id or str(folder),
            model_name=args.model_name,
            num_parameters=model.num_parameters(),
            training_summary=args.training_summary or (summarize_training(model_dir) if model_dir else None),
            code_url=args.code_url,
            template_path=args.model_card_template,
        )
        metadata = {
            "results": results,
            "decoding": decoding,
            "source_model": str(model_dir) if model_dir else None,
        }
        with atomic_directory(folder) as staged:
            save_for_hub(model, tokenizer, staged, card, metadata)
    elif not folder.is_dir():
        raise FileNotFoundError(
            f"--push_only: {folder} does not exist; write it first (run without --push_only)."
        )
    if args.push_to_hub:
        push_to_hub(folder, args.hub_model_id, private=args.private or None, revision=args.hub_revision)
    return folder
