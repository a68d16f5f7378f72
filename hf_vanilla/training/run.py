"""The paper's training recipe (Vaswani et al., 2017, §5) on the Hugging Face ``Seq2SeqTrainer``.

Defaults are the paper's, all overridable on the command line (``scripts/train.py --help``):

* §5.3 optimizer: Adam with β1 = 0.9, β2 = 0.98, ε = 1e-9 (``AdamW`` with ``weight_decay=0`` is Adam).
* §5.3 Eq. (3) learning rate: lrate = d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5), with
  warmup_steps = 4000. This is HF's ``inverse_sqrt`` schedule with peak learning rate
  d_model^-0.5 · warmup_steps^-0.5, evaluated one step later (see :class:`PaperLRLambda`).
* §5.4 regularisation: dropout P_drop = 0.1 (the model config's ``dropout``; 0.3 for the big model)
  and label smoothing ε_ls = 0.1. Smoothing lives in the model's loss (``config.label_smoothing``),
  not in ``TrainingArguments.label_smoothing_factor``: HF's ``LabelSmoother`` averages per batch
  and so weighs micro-batches wrongly under gradient accumulation; the model divides the summed
  loss by the Trainer's ``num_items_in_batch`` instead.
* §5.3 no gradient clipping (tensor2tensor's ``clip_grad_norm = 0``): ``max_grad_norm = 0``
  (HF's default is 1.0).
* §5.1 batching: token-budget batches (``--max_tokens``, :mod:`hf_vanilla.data.batching`) of at most
  6,250 padded source + target tokens per process and micro-step: the paper's ≈ 25,000 source +
  25,000 target tokens per step were spread over 8 GPUs. One optimizer step sees
  ``max_tokens × processes × gradient_accumulation_steps`` tokens, so on one device
  ``--gradient_accumulation_steps 8`` gives the paper's step. ``--max_tokens 0`` goes back to
  sentence-count batches (``--per_device_train_batch_size``).
* §5.2 length: 100,000 steps for the base model (300,000 for big).
* §6.1: BLEU on the validation set during training, decoded with the model's generation config
  (beam 4; length penalty α = 0.6 applied as HF's log P / |Y|^α, not the GNMT formula
  ((5 + |Y|) / 6)^α the paper cites, which ``scripts/evaluate_bleu.py --length_penalty_type gnmt``
  applies; max output length = source length + 50; stop when no better hypothesis can appear);
  averaging of the last checkpoints at the end (``--average_last_n_checkpoints``; the paper: 5 for
  base, 20 for big).
* Evaluation logs ``eval_loss`` (label-smoothed, what is trained) and beside it ``eval_nll_loss``,
  the unsmoothed negative log-likelihood per target token, and ``eval_ppl`` = exp(eval_nll_loss).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
import transformers
from transformers import (
    AutoConfig,
    DataCollatorForSeq2Seq,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Seq2SeqTrainingArguments,
)
from transformers.trainer_utils import HubStrategy

from hf_vanilla.analysis.evaluation import evaluate_split_into, parallel_columns
from hf_vanilla.data.batching import sequence_lengths
from hf_vanilla.data.cache import cached_tokenization, data_fingerprint, default_cache_root
from hf_vanilla.data.loading import load_from_args, pair_location
from hf_vanilla.data.options import DataArguments
from hf_vanilla.data.tokenization import (
    check_tokenizer_matches_config,
    load_or_train_tokenizer,
    load_tokenizer,
    tokenize_translations,
)
from hf_vanilla.hub.card import card_data_recorded_in, dataset_card_from_args, summarize_training
from hf_vanilla.hub.options import DatasetCardArguments, PublishArguments
from hf_vanilla.hub.push import publish, push_to_hub
from hf_vanilla.inference.options import DecodingOptions
from hf_vanilla.inference.translation import InputTooLongError, longest_input
from hf_vanilla.io.atomic import refuse_to_replace
from hf_vanilla.io.checked_loading import load_pretrained_checked
from hf_vanilla.io.checkpoints import checkpoint_step, find_complete_checkpoints
from hf_vanilla.io.safe_loading import verify_model_folder
from hf_vanilla.models.vanilla_transformer.configuration_vanilla_transformer import VanillaTransformerConfig
from hf_vanilla.speed.modeling import VanillaTransformerForConditionalGeneration
from hf_vanilla.training.arguments import PaperTrainingArguments
from hf_vanilla.training.averaging import average_last_checkpoints
from hf_vanilla.training.checkpoints import hold_run_dir, resolve_resume_checkpoint
from hf_vanilla.training.launch_checks import check_process_group, exit_with_launcher
from hf_vanilla.training.options import TrainingModelArguments
from hf_vanilla.training.precision import describe_precision
from hf_vanilla.training.resilience import SaveOnSignalCallback
from hf_vanilla.training.trainer import PaperSeq2SeqTrainer, build_compute_metrics

logger = logging.getLogger(__name__)


__all__ = [
    "HUB_FOLDER",
    "average_run",
    "build_model",
    "card_data",
    "check_averaging_is_possible",
    "evaluate_model",
    "planned_checkpoints",
    "publish_run",
    "refuse_too_long_pairs",
    "run_folder",
    "run_training",
    "setup_logging",
    "take_hub_push",
]

#: ``--push_to_hub``: the folder in ``output_dir`` that is written with :func:`hf_vanilla.hub.push.publish` and pushed.
HUB_FOLDER = "hub"


# --------------------------------------------------------------------------------------------------
# Setup
# --------------------------------------------------------------------------------------------------
def setup_logging(training_args: Seq2SeqTrainingArguments) -> None:
    """INFO-level logs on the main process (``--log_level`` overrides), ``--log_level_replica``
    (warnings by default) on the others, for Python, transformers and datasets."""
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    if training_args.should_log and training_args.log_level == "passive":
        level = logging.INFO
    else:
        level = training_args.get_process_log_level()
    logging.getLogger("hf_vanilla").setLevel(level)
    transformers.utils.logging.set_verbosity(
        level if training_args.log_level != "passive" else logging.WARNING
    )
    datasets.utils.logging.set_verbosity(logging.WARNING)


def planned_checkpoints(
    training_args: PaperTrainingArguments, resume_checkpoint: str | None = None
) -> int | None:
    """How many checkpoints the run will have when it ends: those it keeps from before the resumed step
    plus those it saves (``save_strategy="steps"``: every ``save_steps`` and at ``max_steps``).
    ``None`` when that is not known before training (epochs, ``"best"``, no ``max_steps``)."""
    strategy = str(getattr(training_args.save_strategy, "value", training_args.save_strategy))
    if strategy == "no":
        return 0
    if strategy != "steps" or training_args.max_steps <= 0 or not training_args.save_steps:
        return None
    max_steps, every = training_args.max_steps, training_args.save_steps
    every = math.ceil(max_steps * every) if every < 1 else int(every)
    start, kept = 0, 0
    if resume_checkpoint is not None:
        start = checkpoint_step(resume_checkpoint) or 0
        run_dir = Path(training_args.output_dir)
        kept = sum(1 for p in find_complete_checkpoints(run_dir) if (checkpoint_step(p) or 0) <= start)
    saved = max_steps // every - start // every + (1 if max_steps % every and max_steps > start else 0)
    return kept + max(saved, 0)


def check_averaging_is_possible(
    training_args: PaperTrainingArguments, resume_checkpoint: str | None = None
) -> None:
    """Refuse ``--average_last_n_checkpoints N`` before training when the run cannot have N checkpoints."""
    wanted = training_args.average_last_n_checkpoints
    if not wanted or not training_args.do_train:
        return
    planned = planned_checkpoints(training_args, resume_checkpoint)
    if planned is not None and planned < wanted:
        raise ValueError(
            f"--average_last_n_checkpoints {wanted} cannot be met: with --max_steps {training_args.max_steps}, "
            f"--save_strategy {getattr(training_args.save_strategy, 'value', training_args.save_strategy)} and "
            f"--save_steps {training_args.save_steps} the run will have {planned} checkpoint(s). Save more often "
            "(lower --save_steps), train longer, or average fewer."
        )


def _saved_model(model_args: TrainingModelArguments, saved: str, resumed: bool) -> PreTrainedModel:
    """Load ``saved`` after checking the flags against its config: sizes (and ``--init_std``) that differ
    are refused, since loading cannot change them; ``--dropout`` is applied when fine-tuning and refused
    when resuming (a resumed run continues the one it was). Half-precision weights are upcast to float32
    (:func:`_float32_master_weights`)."""
    verify_model_folder(saved)  # a damaged or unsafe file: an error naming it
    config = AutoConfig.from_pretrained(saved)
    what = f"the resumed checkpoint {saved}" if resumed else f"the model {saved}"
    differs: dict[str, list[str]] = {}
    for name, (flag, value) in model_args.requested_sizes().items():
        if getattr(config, name, None) != value:
            differs.setdefault(flag, []).append(f"{name} {getattr(config, name, None)}")
    dropout = model_args.dropout
    if dropout is not None and dropout != config.dropout and resumed:
        differs.setdefault(f"--dropout {dropout}", []).append(f"dropout {config.dropout}")
    if differs:
        found = "; ".join(f"{flag} (it has {', '.join(have)})" for flag, have in differs.items())
        hint = (
            "A resumed run continues with the settings it was started with: drop these flags, or fine-tune "
            "from the checkpoint with --model_name_or_path (where --dropout applies) into a new --output_dir."
            if resumed
            else "A loaded model keeps its sizes: drop these flags, or train a new model without "
            "--model_name_or_path."
        )
        raise ValueError(f"Flags that disagree with {what}: {found}. {hint}")
    kwargs: dict[str, Any] = {}
    if dropout is not None and dropout != config.dropout:
        logger.warning(
            "Fine-tuning %s with --dropout %g instead of its dropout %g.", saved, dropout, config.dropout
        )
        kwargs["dropout"] = dropout
    model = load_pretrained_checked(saved, **kwargs)  # NaN weights or a config that disagrees: refused
    return _float32_master_weights(model, saved)


#: Weights that train badly in place: Adam's ε = 1e-9 and small updates underflow in them.
_HALF_PRECISION = (torch.float16, torch.bfloat16)


def _float32_master_weights(model: PreTrainedModel, saved: str) -> PreTrainedModel:
    """``model`` with float32 weights: half-precision ones (a folder saved after ``model.half()``) are
    upcast, with one info line, since training them in place underflows Adam's ε and the small updates
    (the loss climbs, translations come out blank). ``--fp16`` / ``--bf16`` then train in mixed
    precision on top of these master weights, as for a fresh model."""
    half = sorted(
        {str(p.dtype).removeprefix("torch.") for p in model.parameters() if p.dtype in _HALF_PRECISION}
    )
    if half:
        logger.info(
            "%s holds %s weights: training upcasts them to float32 master weights (--fp16 or --bf16 train in "
            "mixed precision on top of them).",
            saved,
            " and ".join(half),
        )
        model.float()
        model.config.dtype = torch.float32  # what the saved config.json will say
    return model


def build_model(
    model_args: TrainingModelArguments,
    tokenizer: PreTrainedTokenizerBase,
    resume_checkpoint: str | None = None,
) -> VanillaTransformerForConditionalGeneration:
    """A fresh model of the chosen size (vocabulary and special tokens from the tokenizer), or a saved
    one (see :func:`_saved_model` for the flags); ``config.label_smoothing`` is set to
    ``--label_smoothing`` either way. The tokenizer must match the model's vocabulary and special
    tokens exactly (:func:`hf_vanilla.data.tokenization.check_tokenizer_matches_config`)."""
    saved = resume_checkpoint or model_args.model_name_or_path
    if saved is not None:
        model = _saved_model(model_args, saved, resumed=resume_checkpoint is not None)
        model.config.label_smoothing = model_args.label_smoothing
    else:
        config = VanillaTransformerConfig.from_preset(
            model_args.preset or "base",
            vocab_size=len(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            **model_args.config_overrides(),
        )
        model = VanillaTransformerForConditionalGeneration(config)
    sources = f"tokenizer {model_args.tokenizer_name_or_path}, model {saved}" if saved else None
    check_tokenizer_matches_config(tokenizer, model.config, sources)
    return model


def refuse_too_long_pairs(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    tokenized: datasets.DatasetDict,
    data_args: DataArguments,
) -> None:
    """Refuse the data when a pair of any split has more source or target tokens (after
    ``--max_source_length`` / ``--max_target_length``) than the model's longest input
    (:func:`~hf_vanilla.inference.translation.longest_input`, as translation refuses such a sentence):
    :class:`~hf_vanilla.inference.translation.InputTooLongError` names the file and line of the first,
    and how many there are. Such a pair (a 2 MB line of a crawled corpus) would otherwise reach the
    attention of a batch as a matrix of its length squared and fail in the allocator, or train on
    positions the model is not meant for."""
    limit = longest_input(model, tokenizer)
    if limit is None:
        return
    files = data_args.local_files()
    for split, dataset in tokenized.items():
        for column, side in (("input_ids", "source"), ("labels", "target")):
            lengths = sequence_lengths(dataset, column)
            over = np.flatnonzero(lengths > limit)
            if not over.size:
                continue
            index = int(over[0])
            where = (
                pair_location(files[split], data_args.source_lang, data_args.target_lang, index)
                if split in files
                else f"pair {index + 1} of the {split} split"
            )
            raise InputTooLongError(
                index,
                int(lengths[index]),
                limit,
                f"{where}, its {side} side ({over.size} pair(s) of the {split} split are too long)",
                fix=f"Truncate with --max_{side}_length {limit} (or less), or remove those lines; nothing was "
                "trained.",
            )


def _describe(model: torch.nn.Module, training_args: PaperTrainingArguments, train_size: int) -> None:
    c = model.config
    n_params = sum(p.numel() for p in model.parameters())
    logger.info(
        "Model: d_model=%d, N=%d+%d layers, h=%d, d_ff=%d, P_drop=%.2f, ε_ls=%.2f, vocab=%d — %.2fM parameters",
        c.d_model,
        c.encoder_layers,
        c.decoder_layers,
        c.encoder_attention_heads,
        c.encoder_ffn_dim,
        c.dropout,
        c.label_smoothing,
        c.vocab_size,
        n_params / 1e6,
    )
    batch = (
        f"{training_args.max_tokens} tokens"
        if training_args.max_tokens
        else f"{training_args.per_device_train_batch_size} pairs"
    )
    logger.info(
        "Training on %d pairs: batches of %s per device × %d accumulation steps × %d processes, %d steps; "
        "Adam(β=(%g, %g), ε=%g), schedule %s with %s warmup steps, %s",
        train_size,
        batch,
        training_args.gradient_accumulation_steps,
        training_args.world_size,
        training_args.max_steps,
        training_args.adam_beta1,
        training_args.adam_beta2,
        training_args.adam_epsilon,
        training_args.lr_scheduler_type,
        training_args.warmup_steps,
        f"gradients clipped at norm {training_args.max_grad_norm:g}"
        if training_args.max_grad_norm
        else "no gradient clipping",
    )
    if training_args.max_train_minutes:
        cooldown = training_args.lr_cooldown_fraction
        logger.info(
            "Time budget: %g minutes of training, then a checkpoint and the end of the run; %s",
            training_args.max_train_minutes,
            f"the learning rate falls linearly to 0 over the last {cooldown:.0%} of them"
            if cooldown
            else "no learning-rate cool-down",
        )
    logger.info(
        "Precision: %s",
        describe_precision(training_args.bf16, training_args.fp16, training_args.device),
    )


def _evaluate_splits(
    trainer: PaperSeq2SeqTrainer, splits: dict[str, datasets.Dataset], prefix: str = ""
) -> dict[str, float]:
    results: dict[str, float] = {}
    for name, dataset in splits.items():
        key = f"{prefix}{'eval' if name == 'validation' else name}"
        metrics = trainer.evaluate(dataset, metric_key_prefix=key)
        trainer.log_metrics(key, metrics)
        trainer.save_metrics(key, metrics)
        results.update(metrics)
    return results


def _paper_trainer(
    model: PreTrainedModel,
    training_args: PaperTrainingArguments,
    tokenizer: PreTrainedTokenizerBase,
    train_set: datasets.Dataset | None,
    eval_set: datasets.Dataset | None,
    recorded: dict[str, Any] | None = None,
) -> PaperSeq2SeqTrainer:
    """The trainer of ``run_training``: labels padded with -100 by the collator, BLEU/chrF from
    generation when ``--predict_with_generate``, ``recorded`` written beside the arguments in
    ``training_args.json``."""
    return PaperSeq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=train_set,
        eval_dataset=eval_set,
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
        compute_metrics=build_compute_metrics(tokenizer, training_args.bleu_tokenize)
        if training_args.predict_with_generate
        else None,
        recorded=recorded,
    )


def _has_validation_split(data_args: DataArguments) -> bool:
    """Whether the data arguments give a validation split (a Hub dataset's is known once loaded)."""
    if data_args.max_eval_samples == 0:
        return False
    if data_args.demo:
        return data_args.demo_validation_size > 0
    return bool(data_args.validation_files) or not data_args.local_files()


_NO_VALIDATION_TO_PUBLISH = (
    "--push_to_hub puts the trained model's validation BLEU on the model card, and this run has no validation "
    "split: give --validation_files (or a dataset with a validation split), and no --max_eval_samples 0."
)


def card_data(card_args: DatasetCardArguments) -> dict[str, Any]:
    """The card's data fields of ``card_args``, as ``training_args.json`` records them."""
    return {f.name: getattr(card_args, f.name) for f in fields(DatasetCardArguments)}


def take_hub_push(
    training_args: PaperTrainingArguments, data_args: DataArguments, card_args: DatasetCardArguments
) -> str | None:
    """The Hub repo that ``--push_to_hub`` asks for, checked before any work, or ``None``.

    The run then pushes through :func:`publish_run` (the folder and card of ``hf-vanilla-publish``), so the
    Trainer's own push, which would upload ``output_dir`` without the code files and card (and create the
    repo when the Trainer is built), is turned off here. Refused in one line: no ``--hub_model_id``, no or
    incomplete card data (``--dataset``, as ``hf-vanilla-publish`` refuses it), a ``--hub_strategy`` that
    asks for checkpoint pushes, no training, no validation split to score, and an existing
    ``<output_dir>/hub`` without ``--overwrite``. ``--hub_revision`` names the branch pushed to.
    """
    if not training_args.push_to_hub:
        return None
    if not training_args.hub_model_id:
        raise ValueError("--push_to_hub needs --hub_model_id (e.g. 'user/transformer-base-en-de').")
    dataset_card_from_args(card_args)
    if training_args.hub_strategy in (HubStrategy.CHECKPOINT, HubStrategy.ALL_CHECKPOINTS):
        raise ValueError(
            f"--hub_strategy {training_args.hub_strategy.value}: hf-vanilla-train pushes once, when training ends "
            "(the scored model with its card), never checkpoints; leave --hub_strategy out, and to share a "
            "checkpoint upload its folder with `hf upload`."
        )
    if not training_args.do_train:
        raise ValueError(
            "--push_to_hub publishes the model this run trains, and --do_train is false: publish a saved model "
            "with hf-vanilla-evaluate and hf-vanilla-publish."
        )
    if not _has_validation_split(data_args):
        raise ValueError(_NO_VALIDATION_TO_PUBLISH)
    refuse_to_replace(Path(training_args.output_dir) / HUB_FOLDER, training_args.overwrite, "The Hub folder")
    training_args.push_to_hub = False
    return training_args.hub_model_id


def publish_run(
    model_dir: str | Path,
    data_args: DataArguments,
    training_args: PaperTrainingArguments,
    card_args: DatasetCardArguments,
    repo_id: str,
) -> Path:
    """Score the saved model ``model_dir`` (with its tokenizer) on the validation split as
    ``hf-vanilla-evaluate`` does (the paper's
    decoding; ``<output_dir>/validation.results.json`` and ``validation.hyp.<target_lang>``), write
    ``<output_dir>/hub`` with :func:`hf_vanilla.hub.push.publish` from those results and the run's card data,
    and push it to ``repo_id``. Returns the folder; raises :class:`~hf_vanilla.hub.push.HubPushError` (one line
    naming the command to retry; the folder and the training output are kept) when the push fails."""
    output_dir = Path(training_args.output_dir)
    model = load_pretrained_checked(model_dir)  # the results record the fingerprint of these weights
    tokenizer = load_tokenizer(model_dir)
    validation = load_from_args(data_args)["validation"]
    sources, references = parallel_columns(validation, data_args.source_lang, data_args.target_lang)
    _, results_file = evaluate_split_into(
        output_dir,
        model,
        tokenizer,
        sources,
        references,
        split="validation",
        source_lang=data_args.source_lang,
        target_lang=data_args.target_lang,
        model_name=str(model_dir),
        dataset_name=dataset_card_from_args(card_args).name,
        options=DecodingOptions(),
        batch_size=training_args.per_device_eval_batch_size,
        device=str(training_args.device),
        bleu_tokenize=training_args.bleu_tokenize,
    )
    summary = summarize_training(output_dir)
    if summary and training_args.average_last_n_checkpoints:
        summary += f" The weights are the average of its last {training_args.average_last_n_checkpoints} checkpoints."
    args = PublishArguments(
        output_dir=str(output_dir / HUB_FOLDER),
        results_files=[str(results_file)],
        hub_model_id=repo_id,
        overwrite=training_args.overwrite,
        training_summary=summary,
        **card_data(card_args),
    )
    folder = publish(model, tokenizer, args, model_dir=model_dir)
    push_to_hub(
        folder,
        repo_id,
        private=training_args.hub_private_repo,
        token=training_args.hub_token,
        revision=training_args.hub_revision,
    )
    return folder


@contextlib.contextmanager
def run_folder(model_args: TrainingModelArguments, training_args: PaperTrainingArguments) -> Iterator[None]:
    """Hold ``output_dir`` for one run: processes a launcher started that form no process group are
    refused first (:func:`~hf_vanilla.training.launch_checks.check_process_group`), a fresh run may not
    write into its own input model, and the main process holds a lock on the folder
    (:func:`~hf_vanilla.training.checkpoints.hold_run_dir`) for the block: a second run into it meanwhile is
    refused with :class:`~hf_vanilla.training.checkpoints.RunInUseError`. Nested blocks for the same folder
    share the outer one's lock, so a command holds it over :func:`run_training` and the steps after it."""
    held = os.path.realpath(training_args.output_dir)
    if held in _HELD_RUN_FOLDERS:
        yield
        return
    exit_with_launcher()  # a worker of a torchrun agent that is killed dies with it (a node's failure)
    check_process_group(training_args)
    if training_args.resume_from_checkpoint in (None, "", "false", "False"):  # the kind, and no input in it
        refuse_to_replace(
            training_args.output_dir, True, "--output_dir", inputs=[model_args.model_name_or_path]
        )
    with hold_run_dir(training_args.output_dir, hold=training_args.process_index == 0):
        _HELD_RUN_FOLDERS.add(held)
        try:
            yield
        finally:
            _HELD_RUN_FOLDERS.discard(held)


#: The ``output_dir`` folders :func:`run_folder` holds in this process.
_HELD_RUN_FOLDERS: set[str] = set()


def run_training(
    model_args: TrainingModelArguments,
    data_args: DataArguments,
    training_args: PaperTrainingArguments,
    card_args: DatasetCardArguments | None = None,
) -> Path:
    """Train (or resume) and save the final model, tokenizer and generation config in ``output_dir``;
    returns the folder of the model: ``output_dir``, or with ``--do_train false`` the saved model given
    (``--model_name_or_path``), which nothing trains. Scoring, averaging and publishing are separate
    steps (:func:`evaluate_model`, :func:`average_run`, :func:`publish_run`) that ``hf-vanilla-train``
    composes after it.

    ``card_args``: the training data as the model card names it (needed with ``--push_to_hub``), recorded
    with the arguments in every ``training_args.json`` the run writes; resuming takes those recorded in the
    checkpoint unless ``card_args`` names a dataset.

    Runs inside :func:`run_folder` (its checks, and the lock on ``output_dir``), after everything
    :func:`take_hub_push` and :func:`check_averaging_is_possible` check. A step with a non-finite loss or
    gradient norm, or non-finite weights at a save, stops the run with
    :class:`~hf_vanilla.training.resilience.NonFiniteTrainingError` before anything is saved.
    """
    with run_folder(model_args, training_args):
        return _run_training(model_args, data_args, training_args, card_args or DatasetCardArguments())


def _tokenized_data(
    model_args: TrainingModelArguments,
    data_args: DataArguments,
    training_args: PaperTrainingArguments,
    tokenizer: PreTrainedTokenizerBase,
    load_data: Callable[[], datasets.DatasetDict],
) -> datasets.DatasetDict:
    """The tokenized splits, from the cache of tokenized data when they are there (only the main process
    of each node tokenizes; the others read)."""
    lengths = (model_args.max_source_length, model_args.max_target_length)
    fingerprint = data_fingerprint(
        data_args, tokenizer, *lengths, data=load_data() if data_args.dataset_name else None
    )
    return cached_tokenization(
        data_args.tokenized_cache_dir or default_cache_root(),
        fingerprint,
        load_data,
        functools.partial(
            tokenize_translations,
            tokenizer=tokenizer,
            source_lang=data_args.source_lang,
            target_lang=data_args.target_lang,
            max_source_length=lengths[0],
            max_target_length=lengths[1],
            desc="Tokenizing",
        ),
        training_args.main_process_first(desc="tokenizing into the cache"),
    )


def _run_training(
    model_args: TrainingModelArguments,
    data_args: DataArguments,
    training_args: PaperTrainingArguments,
    card_args: DatasetCardArguments,
) -> Path:
    resume = resolve_resume_checkpoint(
        training_args.resume_from_checkpoint, training_args.output_dir, training_args.overwrite
    )
    if resume is not None:
        logger.info("Resuming from %s", resume)
        card_data_recorded_in(resume, card_args)  # unless given again
    check_averaging_is_possible(training_args, resume)
    hub_repo = take_hub_push(
        training_args, data_args, card_args
    )  # before the Trainer exists: its own push stays off
    transformers.set_seed(training_args.seed)

    # The text is read only when needed: to train a tokenizer, to fill the tokenized-data cache, or to
    # publish; a warm restart with a cached tokenization does not read it at all.
    load_data = functools.cache(functools.partial(load_from_args, data_args))
    splits = list(data_args.local_files()) or list(load_data())
    if training_args.do_train and "train" not in splits:
        raise ValueError(f"No training split in the data (splits: {splits}); give --train_files or --demo.")
    if hub_repo is not None and "validation" not in splits:
        raise ValueError(_NO_VALIDATION_TO_PUBLISH)
    if not training_args.do_train:
        saved = resume or model_args.model_name_or_path
        if saved is None:
            raise ValueError(
                "--do_train false scores a saved model, and none was given: give it with --model_name_or_path "
                "(nothing was done)."
            )
        return Path(saved)
    tokenizer = load_or_train_tokenizer(  # given by path, else saved with the checkpoint or model, else new
        (model_args.tokenizer_name_or_path, resume, model_args.model_name_or_path),
        load_data,
        data_args,
        model_args.tokenizer_vocab_size,
        training_args,
    )
    model = build_model(model_args, tokenizer, resume)
    tokenized = _tokenized_data(model_args, data_args, training_args, tokenizer, load_data)
    refuse_too_long_pairs(model, tokenizer, tokenized, data_args)
    if hub_repo is not None and len(tokenized["validation"]) == 0:
        raise ValueError(_NO_VALIDATION_TO_PUBLISH)
    load_data.cache_clear()  # the text of the training split is not needed any more: free its memory
    train_set = tokenized.get("train")
    eval_set = tokenized.get("validation")
    if training_args.eval_strategy != "no" and eval_set is None:
        raise ValueError(
            "Evaluation during training needs a validation split; give one or pass --eval_strategy no."
        )
    _describe(model, training_args, len(train_set) if train_set is not None else 0)

    trainer = _paper_trainer(model, training_args, tokenizer, train_set, eval_set, card_data(card_args))
    trainer.add_callback(SaveOnSignalCallback())  # SIGTERM/Ctrl-C: save the current step, exit 143/130
    train_result = trainer.train(resume_from_checkpoint=resume)
    trainer.save_model()  # model, tokenizer and generation config in output_dir
    trainer.log_metrics("train", train_result.metrics)
    trainer.save_metrics("train", train_result.metrics)
    trainer.save_state()
    return Path(training_args.output_dir)


def evaluate_model(
    model_dir: str | Path,
    model_args: TrainingModelArguments,
    data_args: DataArguments,
    training_args: PaperTrainingArguments,
    prefix: str = "",
) -> dict[str, float]:
    """Score the saved model ``model_dir`` on the validation and test splits as training evaluates
    (``eval_loss``, and BLEU and chrF with ``--predict_with_generate``), logged and saved in ``output_dir``
    as ``<prefix>eval_*`` and ``<prefix>test_*``; returns the metrics. The tokenizer is
    ``--tokenizer_name_or_path``'s, else the folder's, and must match the model; the tokenized splits come
    from the cache training filled."""
    tokenizer_source = model_args.tokenizer_name_or_path or model_dir
    tokenizer = load_tokenizer(tokenizer_source)
    model = load_pretrained_checked(model_dir)
    check_tokenizer_matches_config(
        tokenizer, model.config, f"tokenizer {tokenizer_source}, model {model_dir}"
    )
    model.config.label_smoothing = model_args.label_smoothing  # eval_loss is the loss training minimises
    load_data = functools.cache(functools.partial(load_from_args, data_args))  # read where the cache misses
    tokenized = _tokenized_data(model_args, data_args, training_args, tokenizer, load_data)
    splits = {name: tokenized[name] for name in ("validation", "test") if name in tokenized}
    trainer = _paper_trainer(model, training_args, tokenizer, None, splits.get("validation"))
    return _evaluate_splits(trainer, splits, prefix)


def average_run(training_args: PaperTrainingArguments) -> Path:
    """``--average_last_n_checkpoints N`` (§6.1): the last N checkpoints of ``output_dir`` averaged into
    ``<output_dir>/averaged`` by the main process (replaced when a resumed run ends again), while the other
    processes wait; returns that folder."""
    averaged_dir = Path(training_args.output_dir) / "averaged"
    with training_args.main_process_first(local=False, desc="averaging the last checkpoints"):
        if training_args.process_index == 0:
            average_last_checkpoints(
                training_args.output_dir,
                training_args.average_last_n_checkpoints,
                averaged_dir,
                overwrite=True,
            )
    return averaged_dir
