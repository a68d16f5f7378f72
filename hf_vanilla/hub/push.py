"""Write the exact folder that is pushed to the Hugging Face Hub, and push it when asked.

:func:`save_for_hub` writes:

* ``model.safetensors``, ``config.json`` and ``generation_config.json`` (the paper's §6.1 decoding:
  beam 4, α = 0.6; the input length + 50 bound is the model's ``generate()`` default);
* the modeling code, copied by ``register_for_auto_class`` (``modeling_vanilla_transformer.py``,
  ``configuration_vanilla_transformer.py`` and their relative imports
  ``generation_vanilla_transformer.py`` and ``saving_vanilla_transformer.py``), with an ``auto_map`` for ``AutoConfig``, ``AutoModel`` and
  ``AutoModelForSeq2SeqLM`` so ``from_pretrained(..., trust_remote_code=True)`` works where hf_vanilla
  is not installed (transformers alone maps only the saved class and ``AutoConfig``; the model's
  ``save_pretrained`` adds ``AutoModel``, and the folder is checked for all three);
* the tokenizer files;
* ``README.md``: the model card rendered from the Jinja template ``hf_vanilla/hub/templates/model_card.md`` with YAML metadata
  (languages, license, tags, datasets, metrics and a ``model-index`` with the measured scores) and the
  data's terms of use.

:func:`push_to_hub` uploads that folder with ``huggingface_hub.HfApi`` (``create_repo`` +
``upload_folder``). When the Hub cannot be reached (``HF_HUB_OFFLINE=1``, no network, no token) it
raises :class:`HubPushError`, whose message says that the local folder is kept and how to push it later.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Any

import huggingface_hub
from huggingface_hub import HfApi
from huggingface_hub.errors import HfHubHTTPError, LocalTokenNotFoundError

from hf_vanilla.hub.card import (
    card_title,
    dataset_card_from_args,
    load_results,
    recorded_dataset,
    render_model_card,
    summarize_training,
    without_local_paths,
)
from hf_vanilla.hub.folder import save_for_hub
from hf_vanilla.hub.options import PublishArguments
from hf_vanilla.hub.record import read_training_record
from hf_vanilla.inference.options import EARLY_STOPPING
from hf_vanilla.io.atomic import atomic_directory, refuse_to_replace
from hf_vanilla.io.checked_loading import loaded_weights_fingerprint
from hf_vanilla.io.checksums import weights_fingerprint

logger = logging.getLogger(__name__)


__all__ = ["HubPushError", "publish", "push_to_hub"]


class HubPushError(OSError):
    """The upload did not happen; the local folder is kept."""


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


def publish(model: Any, tokenizer: Any, args: PublishArguments, model_dir: str | Path | None = None) -> Path:
    """Write the Hub folder for ``model`` (see :func:`save_for_hub`) and push it if ``args.push_to_hub``.

    The generation config in the folder is set to the beam size, α and stopping rule that produced the
    card's scores. With ``model_dir`` (the folder ``model`` was loaded from) every results file must have
    scored the weights ``model`` was built from (:func:`check_results_model` with
    :func:`~hf_vanilla.io.checked_loading.loaded_weights_fingerprint`); without it nothing can be compared, so the caller
    vouches for the scores. The card's title, data, training paragraph and examples come from ``args``,
    else from what ``model_dir`` records (``training_record.json``, ``training_args.json``,
    ``trainer_state.json``), else they say "unknown"; no local path is written into the folder. An existing ``output_dir`` is refused (``FileExistsError``) unless ``args.overwrite``;
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
        loaded = loaded_weights_fingerprint(model)  # the weights going into the folder, not the folder's now
        results = load_results(args.results_files or [], model_dir, loaded)
        decoding = results[0]["decoding"]
        model.generation_config.num_beams = decoding["num_beams"]
        model.generation_config.length_penalty = decoding["length_penalty"]
        if "early_stopping" in decoding:  # results written by older versions do not name it
            model.generation_config.early_stopping = EARLY_STOPPING[decoding["early_stopping"]]
        source_lang, target_lang = results[0]["source_lang"], results[0]["target_lang"]
        record = read_training_record(model_dir) if model_dir else None
        examples = list(record.get("example_sources") or []) if record else []
        dataset = (recorded_dataset(record) if args.dataset is None else None) or dataset_card_from_args(args)
        portable_results = without_local_paths(results)
        card = render_model_card(
            model.config,
            portable_results,
            decoding,
            source_lang,
            target_lang,
            dataset=dataset,
            # never a local path: the card's usage example names the Hub repo, or says where to put it
            repo_id=args.hub_model_id or "path/to/this/folder",
            model_name=card_title(args.model_name, record, args.hub_model_id, source_lang, target_lang),
            num_parameters=model.num_parameters(),
            training_summary=args.training_summary
            or (summarize_training(model_dir) if model_dir else "Unknown: no model folder was given."),
            example_source=examples[0] if examples else None,
            training_examples=examples,
            code_url=args.code_url,
            template_path=args.model_card_template,
        )
        metadata = {
            "results": portable_results,
            "decoding": decoding,
            "source_model": Path(model_dir).name if model_dir else None,
            "source_model_sha256": loaded or (weights_fingerprint(model_dir) if model_dir else None),
        }
        with atomic_directory(folder) as staged:
            save_for_hub(model, tokenizer, staged, card, metadata)
        logger.info("Wrote the Hub folder %s", folder)
    elif not folder.is_dir():
        raise FileNotFoundError(
            f"--push_only: {folder} does not exist; write it first (run without --push_only)."
        )
    if args.push_to_hub:
        push_to_hub(folder, args.hub_model_id, private=args.private or None, revision=args.hub_revision)
    return folder
