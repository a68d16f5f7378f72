"""The model card: the dataset it was trained on, the results, the training summary."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import transformers
from huggingface_hub import EvalResult, ModelCard, ModelCardData

from hf_vanilla.hub.folder import TRAINING_ARGS_JSON
from hf_vanilla.hub.options import KNOWN_DATASETS, DatasetCard, DatasetCardArguments
from hf_vanilla.hub.record import read_training_record
from hf_vanilla.io.checkpoints import TRAINER_STATE_NAME
from hf_vanilla.io.checksums import weights_fingerprint
from hf_vanilla.io.json_files import read_json
from hf_vanilla.models.vanilla_transformer.configuration_vanilla_transformer import TRANSFORMERS_REQUIREMENT

logger = logging.getLogger(__name__)


__all__ = [
    "card_data_recorded_in",
    "card_title",
    "check_results_model",
    "dataset_card_from_args",
    "default_template_path",
    "load_results",
    "recorded_dataset",
    "render_model_card",
    "summarize_training",
    "without_local_paths",
]

_LANGUAGE_NAMES = {"de": "German", "en": "English", "fr": "French", "cs": "Czech"}

#: The title of a card whose folder records none and that has no Hub id.
GENERIC_TITLE = "Transformer (Attention Is All You Need), {source} → {target}"


def default_template_path() -> Path:
    """The Jinja model-card template shipped in the package, ``hf_vanilla/hub/templates/model_card.md``."""
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
    training_examples: Sequence[str] = (),
    extra_tags: Sequence[str] = (),
    code_url: str | None = None,
    template_path: str | Path | None = None,
) -> ModelCard:
    """Render the model card (YAML metadata + Markdown) from the Jinja template.

    Args:
        config: the model config (architecture table).
        results: one dict per evaluated split, as returned by
            :func:`hf_vanilla.analysis.evaluation.evaluate_translations` plus ``"dataset_name"`` and ``"split"``
            (e.g. ``{"split": "validation", "bleu": ..., "chrf": ..., "bleu_signature": ...,
            "chrf_signature": ..., "num_segments": ...}``).
        decoding: the decoding settings used for the scores (``DecodingOptions.to_dict()``).
        source_lang / target_lang: ISO 639-1 codes.
        dataset: the data's name, link, terms and the resulting license of the weights (no default:
            the card must name the data the model was trained on).
        code_url: where the hf_vanilla code lives (linked from the card when given).
        example_source: the sentence of the usage example (default: a placeholder, never another
            model's sentence); training_examples: sources the model was trained on, listed on the card.
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
        example_source=example_source or f"<a sentence in {_LANGUAGE_NAMES.get(source_lang, source_lang)}>",
        training_examples=list(training_examples),
        transformers_requirement=TRANSFORMERS_REQUIREMENT,
        transformers_version=transformers.__version__,
    )


# --------------------------------------------------------------------------------------------------
# The publish command (hf-vanilla-publish, scripts/publish.py)
# --------------------------------------------------------------------------------------------------


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
    values = read_json(recorded)
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


def check_results_model(
    path: str | Path, result: dict[str, Any], model_dir: str | Path, weights_sha256: str | None = None
) -> None:
    """Refuse results that scored another model than ``model_dir``: the weights fingerprint
    (``model_sha256``, :func:`hf_vanilla.io.checksums.weights_fingerprint`) must match ``weights_sha256``
    (the fingerprint of the weights loaded for publishing; default: the folder's weights now); a file
    written before fingerprints were recorded must name the same folder (``model``). Results that record
    no fingerprint for a folder with weights (a model that was not loaded from a folder) are refused."""
    recorded, named = result.get("model_sha256"), result.get("model")
    redo = f"evaluate it (hf-vanilla-evaluate --model_name_or_path {model_dir} ...) and pass those results."
    current = weights_sha256 or weights_fingerprint(model_dir)
    if recorded is not None:
        if recorded != current:
            raise ValueError(
                f"--results_files {path} scored other weights (model {named}) than --model_name_or_path "
                f"{model_dir} holds: the card must show this model's scores; {redo}"
            )
        return
    if "model_sha256" in result and current is not None:
        raise ValueError(
            f"--results_files {path} does not record which weights it scored (model_sha256 is null: the model "
            f"was not loaded from a folder), so it cannot be published with {model_dir}; {redo}"
        )
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


def load_results(
    paths: Sequence[str | Path], model_dir: str | Path | None = None, weights_sha256: str | None = None
) -> list[dict[str, Any]]:
    """Read evaluation results; all must share languages and decoding settings and, with ``model_dir``,
    have scored that model (:func:`check_results_model`; ``weights_sha256``: the fingerprint of the
    weights loaded from it)."""
    if not paths:
        raise ValueError(
            "The model card needs measured scores: run hf-vanilla-evaluate first and pass its "
            "<split>.results.json with --results_files."
        )
    results = [_read_result(Path(path)) for path in paths]
    if model_dir is not None:
        for path, result in zip(paths, results, strict=True):
            check_results_model(path, result, model_dir, weights_sha256)
    for key in ("source_lang", "target_lang", "decoding"):
        values = {json.dumps(result.get(key), sort_keys=True) for result in results}
        if len(values) > 1:
            raise ValueError(
                f"The results files disagree on {key!r} ({sorted(values)}): publish one setting at a time."
            )
        if results[0].get(key) is None:
            raise ValueError(f"{paths[0]} has no {key!r}: write it with hf-vanilla-evaluate.")
    if results[0]["decoding"].get("do_sample"):
        raise ValueError(
            f"{paths[0]} scored sampled translations (--do_sample): a card's scores, and the generation config "
            "published with them, are those of beam or greedy search. Evaluate again without --do_sample, and "
            "publish those results."
        )
    return results


def summarize_training(model_dir: str | Path) -> str:
    """The card's training paragraph: the folder's record (:mod:`hf_vanilla.hub.record`) says how the weights
    were produced, ``trainer_state.json`` how long; what the folder does not record is "unknown"."""
    record = read_training_record(model_dir)
    if record is not None and record.get("summary"):
        return record["summary"]
    state_file = Path(model_dir) / TRAINER_STATE_NAME
    state = read_json(state_file) if state_file.is_file() else None
    how = (
        f"with {record['trained_with']}"
        if record is not None
        else "by a recipe the folder does not record (unknown)"
    )
    if state is None:
        if record is None:
            return "Unknown: the model folder does not record how these weights were trained."
        return f"Trained {how}."
    parts = [f"Trained for {state.get('global_step', '?')} optimizer steps"]
    if state.get("epoch") is not None:
        parts.append(f"({float(state['epoch']):.1f} epochs)")
    text = " ".join(parts) + f" {how}."
    if record is None:  # a stock script's run may have fine-tuned weights trained elsewhere before
        text += (
            " These are the steps of the run that wrote the folder; training before that run is not recorded."
        )
    if state.get("best_metric") is not None and state.get("best_model_checkpoint"):
        text += f" Best validation metric during training: {float(state['best_metric']):.2f}."
    return text


def card_title(
    args_title: str | None,
    record: dict[str, Any] | None,
    repo_id: str | None,
    source_lang: str,
    target_lang: str,
) -> str:
    """The card's title: the one given, else the one the folder's ``record``
    (:func:`~hf_vanilla.hub.record.read_training_record`) names, else the Hub repo's name, else a
    description of the model (never the name of a local folder)."""
    if args_title:
        return args_title
    if record is not None and record.get("title"):
        return record["title"]
    if repo_id:
        return repo_id.split("/")[-1]
    return GENERIC_TITLE.format(
        source=_LANGUAGE_NAMES.get(source_lang, source_lang),
        target=_LANGUAGE_NAMES.get(target_lang, target_lang),
    )


def recorded_dataset(record: dict[str, Any] | None) -> DatasetCard | None:
    """The data card a folder's training ``record`` names, if any."""
    if record is None or not isinstance(record.get("dataset"), dict):
        return None
    names = {card_field.name for card_field in fields(DatasetCard)}
    return DatasetCard(**{key: value for key, value in record["dataset"].items() if key in names})


def without_local_paths(value: Any) -> Any:
    """``value`` (JSON-like) with every absolute path replaced by its last part: what leaves the machine
    names no local folder."""
    if isinstance(value, dict):
        return {key: without_local_paths(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [without_local_paths(item) for item in value]
    if isinstance(value, str) and (Path(value).is_absolute() or value.startswith("~")):
        return Path(value).name
    return value
