"""The training recipe (§5): Eq. (3) exactly, Seq2SeqTrainer with generation-based BLEU, resume, averaging."""

from __future__ import annotations

import json
import math
import random
import warnings
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import tiny_model
from transformers import (
    AutoModelForSeq2SeqLM,
    DataCollatorForSeq2Seq,
    EvalPrediction,
    HfArgumentParser,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainerCallback,
)
from transformers.optimization import get_inverse_sqrt_schedule

from hf_vanilla.cli.train import train_and_score
from hf_vanilla.data.batching import TokenBudgetBatchSampler
from hf_vanilla.data.loading import load_local_files
from hf_vanilla.data.options import DataArguments
from hf_vanilla.data.tokenization import tokenize_translations
from hf_vanilla.hub.options import DatasetCardArguments
from hf_vanilla.inference.translation import InputTooLongError
from hf_vanilla.training.arguments import PaperTrainingArguments
from hf_vanilla.training.options import PAPER_MAX_TOKENS_PER_PROCESS, TrainingModelArguments
from hf_vanilla.training.run import run_training
from hf_vanilla.training.schedule import PaperLRLambda, paper_learning_rate, paper_peak_learning_rate
from hf_vanilla.training.trainer import PaperSeq2SeqTrainer, build_compute_metrics

WORDS = [f"w{i}" for i in range(4, 40)]


def _pairs(n: int, seed: int, reverse: bool = False) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        words = rng.choices(WORDS, k=rng.randint(2, 6))
        target = words[::-1] if reverse else words
        pairs.append((" ".join(words), " ".join(target)))
    return pairs


def _write_tsv(path: Path, pairs: list[tuple[str, str]]) -> str:
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return str(path)


def _dataset(tmp_path: Path, tokenizer, n_train: int = 64, n_valid: int = 8, reverse: bool = False):
    files = {
        "train": [_write_tsv(tmp_path / "train.tsv", _pairs(n_train, 0, reverse))],
        "validation": [_write_tsv(tmp_path / "valid.tsv", _pairs(n_valid, 1, reverse))],
    }
    return tokenize_translations(load_local_files(files, "en", "de"), tokenizer, "en", "de")


def _args(output_dir: Path, **overrides: object) -> PaperTrainingArguments:
    defaults = {
        "output_dir": str(output_dir),
        "max_steps": 8,
        "warmup_steps": 3,
        "max_tokens": 0,  # sentence-count batches of per_device_train_batch_size
        "per_device_train_batch_size": 8,
        "per_device_eval_batch_size": 4,
        "eval_strategy": "no",
        "save_strategy": "no",
        "logging_steps": 1,
        "report_to": "none",
        "disable_tqdm": True,
        "use_cpu": True,
        "seed": 0,
    }
    return PaperTrainingArguments(**{**defaults, **overrides})


def _trainer(model, args, data, tokenizer) -> PaperSeq2SeqTrainer:
    return PaperSeq2SeqTrainer(
        model=model,
        args=args,
        train_dataset=data["train"],
        eval_dataset=data["validation"],
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
        compute_metrics=build_compute_metrics(tokenizer),
    )


# --------------------------------------------------------------------------------------------------
# §5.3 Eq. (3)
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("d_model", "warmup"), [(512, 4000), (32, 3)])
def test_hf_inverse_sqrt_is_eq3_at_the_same_step(d_model: int, warmup: int) -> None:
    """HF's inverse_sqrt with peak d^-0.5 · w^-0.5 evaluated at s equals Eq. (3) at step s."""
    peak = paper_peak_learning_rate(d_model, warmup)
    assert peak == pytest.approx(d_model**-0.5 * warmup**-0.5)
    hf = get_inverse_sqrt_schedule(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=peak), warmup)
    paper = PaperLRLambda(warmup)
    for step in [*range(1, 3 * warmup), 10 * warmup, 25 * warmup]:
        expected = paper_learning_rate(step, d_model, warmup)
        assert peak * hf.lr_lambdas[0](step) == pytest.approx(expected, rel=1e-12)
        # The k-th update happens after k - 1 completed updates.
        assert peak * paper(step - 1) == pytest.approx(expected, rel=1e-12)
    assert paper(warmup - 1) == 1.0  # the peak is reached on update number `warmup`
    assert paper(0) > 0  # unlike HF's f(0) = 0: no update is wasted at learning rate 0


def test_paper_base_peak_learning_rate() -> None:
    assert paper_peak_learning_rate(512, 4000) == pytest.approx(6.9877e-4, rel=1e-4)


class _RecordLR(TrainerCallback):
    def __init__(self) -> None:
        self.lrs: list[float] = []

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        self.lrs.append(optimizer.param_groups[0]["lr"])


def test_trainer_applies_eq3_to_every_update_with_paper_adam(tmp_path: Path, tokenizer) -> None:
    data = _dataset(tmp_path, tokenizer)
    model = tiny_model()
    trainer = _trainer(model, _args(tmp_path / "out", max_steps=8, warmup_steps=3), data, tokenizer)
    recorder = _RecordLR()
    trainer.add_callback(recorder)
    trainer.train()
    d_model = model.config.d_model
    assert trainer.args.learning_rate == pytest.approx(paper_peak_learning_rate(d_model, 3))
    expected = [paper_learning_rate(k, d_model, 3) for k in range(1, 9)]
    np.testing.assert_allclose(recorder.lrs, expected, rtol=1e-9)
    group = trainer.optimizer.param_groups[0]
    assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9 and group["weight_decay"] == 0.0


def test_hf_label_smoother_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--label_smoothing"):
        _args(tmp_path, label_smoothing_factor=0.1)


def test_paper_defaults_do_not_clip_and_batch_by_tokens(tmp_path: Path, tokenizer) -> None:
    """§5.3 (tensor2tensor's clip_grad_norm = 0) and §5.1 (≈ 25k + 25k tokens per step over 8 GPUs);
    --max_tokens 0 goes back to sentence-count batches."""
    parser = HfArgumentParser(PaperTrainingArguments)
    (args,) = parser.parse_args_into_dataclasses(["--output_dir", str(tmp_path)])
    assert args.max_grad_norm == 0.0
    assert args.max_tokens == PAPER_MAX_TOKENS_PER_PROCESS == 6250
    trainer = _trainer(tiny_model(), args, _dataset(tmp_path, tokenizer), tokenizer)
    assert isinstance(trainer.token_budget_sampler(), TokenBudgetBatchSampler)
    (args,) = parser.parse_args_into_dataclasses(["--output_dir", str(tmp_path), "--max_tokens", "0"])
    assert args.max_tokens is None
    with pytest.raises(ValueError, match="--max_tokens"):
        _args(tmp_path, max_tokens=-1)


# --------------------------------------------------------------------------------------------------
# Trainer with generation
# --------------------------------------------------------------------------------------------------
# --------------------------------------------------------------------------------------------------
# Trainer with generation
# --------------------------------------------------------------------------------------------------
def test_compute_metrics_decodes_and_scores(tokenizer) -> None:
    compute = build_compute_metrics(tokenizer)
    sentence = tokenizer.convert_tokens_to_ids([f"w{i}" for i in range(1, 7)])
    other = tokenizer.convert_tokens_to_ids(["w9"])
    # <s> ... </s>, padded with pad (0) and with the Trainer's -100; labels end in </s>, padded with -100.
    predictions = np.array([[1, *sentence, 2, 0], [1, *other, 2, *[-100] * 6]])
    labels = np.array([[*sentence, 2], [sentence[0], 2, *[-100] * 5]])
    metrics = compute(EvalPrediction(predictions=predictions, label_ids=labels))
    assert metrics["exact_match"] == 0.5
    assert metrics["gen_len"] == pytest.approx((6 + 1) / 2)  # special tokens and padding do not count
    assert 0 < metrics["bleu"] < 100 and 0 < metrics["chrf"] < 100


def test_train_then_predict_keeps_the_paper_generation_bound(tmp_path: Path, tokenizer) -> None:
    """Evaluation generates with the model's config (beam 4, §6.1 bound) on every batch, and leaves it as is."""
    data = _dataset(tmp_path, tokenizer, n_valid=5)
    model = tiny_model()
    eos = tokenizer.eos_token_id

    def never_eos(module, inputs, logits):
        # Hypotheses then only end where the §6.1 bound forces </s>.
        return logits.index_fill(-1, torch.tensor([eos]), -1e4)

    before = model.generation_config.to_dict()
    trainer = _trainer(model, _args(tmp_path / "out", max_steps=1), data, tokenizer)
    trainer.train()
    model.lm_head.register_forward_hook(never_eos)
    output = trainer.predict(data["validation"])  # batches of 4 and 1
    assert {"test_loss", "test_bleu", "test_chrf", "test_exact_match", "test_gen_len"} <= set(output.metrics)
    assert model.generation_config.to_dict() == before  # not filled with max_length=20 and other defaults

    # §6.1: each sentence stops at source length + 50 generated tokens (the last one </s>), in every batch.
    # Position 0 holds the start token <s>.
    source_lengths = [len(ids) for ids in data["validation"]["input_ids"]]
    first_eos = [int(np.argmax(row == eos)) for row in output.predictions]
    assert first_eos == [n + 50 for n in source_lengths]
    assert output.metrics["test_gen_len"] == pytest.approx(np.mean([n + 49 for n in source_lengths]))
    assert output.metrics["test_exact_match"] == 0.0


def test_stock_seq2seq_trainer_then_save_and_reload_keeps_the_bound(tmp_path: Path, tokenizer) -> None:
    """HF's own Seq2SeqTrainer(predict_with_generate) writes max_length=20 into the generation config,
    and it is saved; a 30-token source still decodes up to its own 30 + 50 tokens after reloading."""
    data = _dataset(tmp_path, tokenizer, n_valid=3)
    model = tiny_model()
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path / "out"),
        predict_with_generate=True,
        generation_num_beams=1,
        per_device_eval_batch_size=2,
        report_to="none",
        use_cpu=True,
    )
    trainer = Seq2SeqTrainer(
        model=model,
        args=args,
        eval_dataset=data["validation"],
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
        compute_metrics=build_compute_metrics(tokenizer),  # else evaluate() does not generate
    )
    trainer.evaluate()
    trainer.save_model(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "generation_config.json").read_text())
    assert saved["max_length"] == 20 and saved["max_length_offset"] == 50

    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "saved").eval()
    eos = tokenizer.eos_token_id
    reloaded.lm_head.register_forward_hook(
        lambda m, i, logits: logits.index_fill(-1, torch.tensor([eos]), -1e4)
    )
    source = tokenizer([" ".join(WORDS[:29])], return_tensors="pt")  # 29 words + </s>
    assert source["input_ids"].shape[1] == 30
    for num_beams in (1, 4):
        out = reloaded.generate(**source, num_beams=num_beams)
        assert out[0, 1:].tolist().index(eos) + 1 == 30 + 50


def test_evaluation_logs_the_unsmoothed_nll_and_perplexity(tmp_path: Path, tokenizer) -> None:
    """eval_nll_loss is Σ -log p(label) / target tokens over the whole set (here two batches), beside
    the label-smoothed eval_loss; eval_ppl = exp(eval_nll_loss); both reach the log history."""
    data = _dataset(tmp_path, tokenizer, n_valid=6)
    model = tiny_model(label_smoothing=0.1)
    trainer = _trainer(model, _args(tmp_path / "out", generation_num_beams=1), data, tokenizer)
    metrics = trainer.evaluate()

    batch = trainer.data_collator([data["validation"][i] for i in range(6)])
    batch = {key: value for key, value in batch.items() if key in ("input_ids", "attention_mask", "labels")}
    with torch.no_grad():
        logits = model(**batch).logits
    labels = batch["labels"]
    nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum")
    expected = nll.item() / int((labels != -100).sum())
    assert metrics["eval_nll_loss"] == pytest.approx(expected, rel=1e-5)
    assert metrics["eval_ppl"] == pytest.approx(math.exp(expected), rel=1e-5)
    assert metrics["eval_loss"] != pytest.approx(expected, rel=1e-3)  # the smoothed loss is another number
    logged = trainer.state.log_history[-1]
    assert logged["eval_nll_loss"] == metrics["eval_nll_loss"] and logged["eval_ppl"] == metrics["eval_ppl"]

    # Without label smoothing and in one batch, the NLL per token is exactly the model's loss.
    model.config.label_smoothing = 0.0
    trainer.args.per_device_eval_batch_size = 8
    metrics = trainer.evaluate(metric_key_prefix="plain")
    assert metrics["plain_nll_loss"] == pytest.approx(metrics["plain_loss"], rel=1e-5)


def test_training_learns_to_read_the_source_on_a_copy_task(tmp_path: Path, tokenizer) -> None:
    """60 steps on a copy task: the training loss falls, and the trained model reads its source — on
    held-out pairs its loss with each row's own source is far below its loss with the sources rolled
    by one row (a model that ignores the source, learning only the target words' frequencies and
    lengths, has the same loss both ways)."""
    data = _dataset(tmp_path, tokenizer, n_train=256, n_valid=16)
    # An explicit peak learning rate: Eq. (3)'s d_model^-0.5 scale is too large for d_model = 32.
    args = _args(
        tmp_path / "out",
        max_steps=150,
        warmup_steps=10,
        learning_rate=1e-2,
        per_device_train_batch_size=16,
        logging_steps=25,
    )
    trainer = _trainer(tiny_model(dropout=0.0), args, data, tokenizer)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 6
    assert losses[-1] < 0.7 * losses[0]
    batch = trainer.data_collator(list(data["validation"]))
    model = trainer.model.eval()
    with torch.no_grad():
        own = model(**{key: batch[key] for key in ("input_ids", "attention_mask", "labels")}).loss.item()
        rolled = model(
            input_ids=batch["input_ids"].roll(1, dims=0),
            attention_mask=batch["attention_mask"].roll(1, dims=0),
            labels=batch["labels"],
        ).loss.item()
    assert own < 0.5 * rolled  # measured 1.63 against 5.18; after 100 steps only 2.13 against 4.41
    assert max(entry["learning_rate"] for entry in trainer.state.log_history if "loss" in entry) <= 1e-2


# --------------------------------------------------------------------------------------------------
# run_training: resume, nothing overwritten, averaging
# --------------------------------------------------------------------------------------------------
def _run_args(tmp_path: Path, tokenizer, output_dir: Path, **training: object):
    tokenizer_dir = tmp_path / "tokenizer"
    if not tokenizer_dir.exists():
        tokenizer.save_pretrained(tokenizer_dir)
    files = {
        "train_files": [_write_tsv(tmp_path / "train.tsv", _pairs(48, 0))],
        "validation_files": [_write_tsv(tmp_path / "valid.tsv", _pairs(4, 1))],
    }
    model_args = TrainingModelArguments(
        d_model=32, layers=2, attention_heads=4, ffn_dim=64, tokenizer_name_or_path=str(tokenizer_dir)
    )
    data_args = DataArguments(**files)
    defaults = {"save_strategy": "steps", "save_steps": 3, "generation_num_beams": 1, "do_eval": False}
    return model_args, data_args, _args(output_dir, **{**defaults, **training})


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def test_resume_from_checkpoint_continues_the_same_run(tmp_path: Path, tokenizer) -> None:
    straight = tmp_path / "straight"
    run_training(*_run_args(tmp_path, tokenizer, straight, max_steps=6))
    assert (straight / "checkpoint-3").is_dir() and (straight / "checkpoint-6").is_dir()
    for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json"):
        assert (straight / name).is_file()

    resumed = tmp_path / "resumed"
    run_training(
        *_run_args(
            tmp_path, tokenizer, resumed, max_steps=6, resume_from_checkpoint=str(straight / "checkpoint-3")
        )
    )
    assert not (resumed / "checkpoint-3").exists() and (resumed / "checkpoint-6").is_dir()
    expected, got = _weights(straight), _weights(resumed)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-5, atol=1e-6)

    # "last" resumes the newest checkpoint of output_dir: training to step 9 continues from step 6.
    folder = run_training(
        *_run_args(tmp_path, tokenizer, straight, max_steps=9, resume_from_checkpoint="last")
    )
    assert folder == straight and (straight / "checkpoint-9").is_dir()
    assert json.loads((straight / "train_results.json").read_text())["epoch"] > 0


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_fine_tuning_half_precision_weights_trains_float32_master_weights(
    tmp_path: Path, tokenizer, half: torch.dtype, caplog: pytest.LogCaptureFixture
) -> None:
    """A folder saved after model.half() fine-tunes on float32 master weights (in place, Adam's ε = 1e-9
    and the small updates underflow: the loss climbs); one info line says so."""
    saved = tmp_path / "half"
    tiny_model(seed=0).to(half).save_pretrained(saved)
    model_args, data_args, training_args = _run_args(
        tmp_path, tokenizer, tmp_path / "out", save_strategy="no"
    )
    model_args = TrainingModelArguments(
        model_name_or_path=str(saved), tokenizer_name_or_path=model_args.tokenizer_name_or_path
    )
    training_args.learning_rate = 3e-3
    dtypes: list[set[torch.dtype]] = []

    class Watch(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            dtypes.append({p.dtype for p in model.parameters()})

    original = PaperSeq2SeqTrainer.__init__

    def with_watch(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.add_callback(Watch())

    with caplog.at_level("INFO", logger="hf_vanilla.training.run"), pytest.MonkeyPatch.context() as patch:
        patch.setattr(PaperSeq2SeqTrainer, "__init__", with_watch)
        run_training(model_args, data_args, training_args)
    assert dtypes and all(seen == {torch.float32} for seen in dtypes)
    assert any("upcasts them to float32 master weights" in r.getMessage() for r in caplog.records)
    history = json.loads((tmp_path / "out" / "trainer_state.json").read_text())["log_history"]
    losses = [entry["loss"] for entry in history if "loss" in entry]
    assert all(math.isfinite(loss) for loss in losses)
    assert losses[-1] < losses[0]
    assert all(t.dtype == torch.float32 for t in _weights(tmp_path / "out").values())


@pytest.mark.parametrize(("side", "line"), [("source", 5), ("target", 2)])
def test_a_training_pair_longer_than_the_model_takes_is_one_error_naming_file_and_line(
    tmp_path: Path, tokenizer, side: str, line: int
) -> None:
    """A huge line (a 2 MB line of a crawled corpus asked the allocator for 1.4 TB) is refused at data
    preparation, naming the file and line, as translation refuses an overlong input; nothing is trained."""
    pairs = _pairs(8, 0)
    huge = " ".join(["w5"] * 1100)  # more than max_position_embeddings (1024) tokens
    pairs[line - 1] = (huge, pairs[line - 1][1]) if side == "source" else (pairs[line - 1][0], huge)
    model_args, data_args, training_args = _run_args(tmp_path, tokenizer, tmp_path / "out")
    data_args.train_files = [_write_tsv(tmp_path / "long.tsv", pairs)]
    with pytest.raises(
        InputTooLongError, match=rf"long\.tsv, line {line}, its {side} side \(1 pair\(s\) of the train"
    ):
        run_training(model_args, data_args, training_args)
    assert not any((tmp_path / "out").glob("checkpoint-*"))
    # Truncation, which the message offers, trains on it.
    model_args.max_source_length = model_args.max_target_length = 1024
    run_training(model_args, data_args, _args(tmp_path / "truncated", max_steps=1))


def test_missing_checkpoint_and_existing_run_fail_before_any_work(tmp_path: Path, tokenizer) -> None:
    out = tmp_path / "out"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        run_training(*_run_args(tmp_path, tokenizer, out, resume_from_checkpoint=str(tmp_path / "nope")))
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        run_training(*_run_args(tmp_path, tokenizer, out, resume_from_checkpoint="last"))
    assert not out.exists()  # nothing was started or written

    (out / "checkpoint-3").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="not a Trainer checkpoint"):
        run_training(*_run_args(tmp_path, tokenizer, out, resume_from_checkpoint=str(out / "checkpoint-3")))
    with pytest.raises(FileExistsError, match="already holds checkpoints"):
        run_training(*_run_args(tmp_path, tokenizer, out))
    assert [p.name for p in out.iterdir()] == ["checkpoint-3"]  # nothing overwritten


def test_run_training_only_trains_and_returns_its_folder(tmp_path: Path, tokenizer) -> None:
    """Scoring, averaging and publishing are the command's steps (train_and_score), not the training's."""
    out = tmp_path / "out"
    folder = run_training(
        *_run_args(
            tmp_path, tokenizer, out, max_steps=2, save_steps=1, do_eval=True, average_last_n_checkpoints=2
        ),
        DatasetCardArguments(dataset="multi30k"),
    )
    assert folder == out and (out / "model.safetensors").is_file()
    assert not (out / "averaged").exists() and not (out / "eval_results.json").exists()


def test_scoring_without_training_needs_a_saved_model(tmp_path: Path, tokenizer) -> None:
    """--do_train false scores a saved model; without one there is nothing to score (not a random model)."""
    with pytest.raises(ValueError, match="--do_train false scores a saved model, and none was given"):
        run_training(*_run_args(tmp_path, tokenizer, tmp_path / "out", do_train=False, do_eval=True))


def test_the_model_cards_data_is_its_own_options_recorded_with_the_training_arguments(
    tmp_path: Path, tokenizer
) -> None:
    assert {f.name for f in fields(DatasetCardArguments)}.isdisjoint(
        f.name for f in fields(PaperTrainingArguments)
    )
    out = tmp_path / "out"
    run_training(
        *_run_args(tmp_path, tokenizer, out, max_steps=1, save_steps=1),
        DatasetCardArguments(dataset="multi30k"),
    )
    for recorded in (out / "training_args.json", out / "checkpoint-1" / "training_args.json"):
        assert json.loads(recorded.read_text())["dataset"] == "multi30k"


def test_average_last_checkpoints_at_the_end_and_evaluate_it(tmp_path: Path, tokenizer) -> None:
    out = tmp_path / "out"
    results = train_and_score(
        *_run_args(
            tmp_path, tokenizer, out, max_steps=6, do_eval=True, average_last_n_checkpoints=2, max_tokens=60
        )
    )
    for key in ("eval_bleu", "averaged_eval_bleu", "averaged_eval_exact_match"):
        assert key in results
    averaged = _weights(out / "averaged")
    last_two = [_weights(out / f"checkpoint-{step}") for step in (3, 6)]
    key = "model.shared.weight"
    torch.testing.assert_close(averaged[key], (last_two[0][key] + last_two[1][key]) / 2)


def test_cpu_training_logs_to_tensorboard_without_a_pin_memory_warning(tmp_path: Path, tokenizer) -> None:
    """tensorboard is in the train extra; pinned memory (useless without an accelerator) is off on the CPU."""
    data = _dataset(tmp_path, tokenizer, n_train=8)
    args = _args(tmp_path / "out", max_steps=2, report_to="tensorboard", use_cpu=False)  # not use_cpu=True,
    if args.device.type != "cpu":  # which turns pinning off by itself
        pytest.skip("pinned memory is right with an accelerator")
    assert args.dataloader_pin_memory is False
    trainer = _trainer(tiny_model(), args, data, tokenizer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    assert not [w for w in caught if "pin_memory" in str(w.message)]
    assert list(tmp_path.rglob("events.out.tfevents.*"))
