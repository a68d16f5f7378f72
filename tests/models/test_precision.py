"""Mixed precision and activation memory: bf16 autocast training, half-precision generation with padding,
gradient checkpointing's saved activations (its same-gradients property is in test_modeling.py)."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import tiny_model
from transformers import DataCollatorForSeq2Seq

from hf_vanilla.data.loading import load_local_files
from hf_vanilla.data.tokenization import tokenize_translations
from hf_vanilla.training.arguments import PaperTrainingArguments
from hf_vanilla.training.precision import cpu_bf16_instructions
from hf_vanilla.training.trainer import PaperSeq2SeqTrainer

WORDS = [f"w{i}" for i in range(4, 40)]


def _copy_task(tmp_path: Path, tokenizer: Any, n: int = 64) -> Any:
    rng = random.Random(0)
    lines = []
    for _ in range(n):
        words = " ".join(rng.choices(WORDS, k=rng.randint(2, 8)))
        lines.append(f"{words}\t{words}\n")
    path = tmp_path / "train.tsv"
    path.write_text("".join(lines), encoding="utf-8")
    data = load_local_files({"train": [str(path)]}, "en", "de")
    return tokenize_translations(data, tokenizer, "en", "de")["train"]


def _trainer(tmp_path: Path, tokenizer: Any, model: Any, **overrides: Any) -> PaperSeq2SeqTrainer:
    defaults = {
        "output_dir": str(tmp_path / "out"),
        "max_steps": 12,
        "warmup_steps": 2,
        "learning_rate": 3e-3,
        "max_tokens": None,  # sentence-count batches of per_device_train_batch_size
        "per_device_train_batch_size": 8,
        "save_strategy": "no",
        "eval_strategy": "no",
        "do_eval": False,
        "logging_steps": 1,
        "report_to": "none",
        "disable_tqdm": True,
        "use_cpu": True,
        "seed": 0,
    }
    return PaperSeq2SeqTrainer(
        model=model,
        args=PaperTrainingArguments(**{**defaults, **overrides}),
        train_dataset=_copy_task(tmp_path, tokenizer),
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
    )


# --------------------------------------------------------------------------------------------------
# bf16 autocast training
# --------------------------------------------------------------------------------------------------
@pytest.mark.skipif(
    cpu_bf16_instructions() is None,
    reason="--bf16 is refused on a CPU without native bfloat16 instructions (AVX512-BF16, AMX or Arm BF16)",
)
def test_bf16_autocast_training_on_cpu_runs_and_stays_finite(tmp_path: Path, tokenizer: Any) -> None:
    model = tiny_model().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    dtypes: set[torch.dtype] = set()
    model.lm_head.register_forward_hook(lambda module, args, output: dtypes.add(output.dtype))
    trainer = _trainer(tmp_path, tokenizer, model, bf16=True)
    trainer.train()

    assert dtypes == {torch.bfloat16}  # autocast really ran the matmuls in bf16
    assert all(p.dtype == torch.float32 for p in model.parameters())  # fp32 master weights
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert len(losses) == 12 and all(math.isfinite(loss) for loss in losses)
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3  # it learns
    after = model.state_dict()
    assert all(torch.isfinite(after[k]).all() for k in after)
    assert any(not torch.equal(after[k], before[k]) for k in after)


# --------------------------------------------------------------------------------------------------
# Half-precision inference with padding
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("num_beams", [1, 4])
def test_half_precision_generation_with_padded_batches_has_no_nan(dtype: torch.dtype, num_beams: int) -> None:
    model = tiny_model().to(dtype)
    input_ids = torch.tensor(
        [
            [5, 6, 7, 8, 9, 10, 11, 12, 2],
            [13, 14, 2, 0, 0, 0, 0, 0, 0],  # mostly padding
            [0, 0, 0, 0, 0, 0, 0, 0, 0],  # nothing but padding: every key masked
        ]
    )
    attention_mask = (input_ids != 0).long()
    encoder = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    assert encoder.dtype == dtype and torch.isfinite(encoder).all()

    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        num_beams=num_beams,
        max_new_tokens=8,
        output_scores=True,
        output_logits=True,
        return_dict_in_generate=True,
    )
    assert out.sequences.shape[0] == 3
    assert ((out.sequences >= 0) & (out.sequences < model.config.vocab_size)).all()
    for logits in out.logits:
        assert not torch.isnan(logits).any() and torch.isfinite(logits).all()
    for scores in out.scores:  # processed scores: -inf marks forbidden tokens, never NaN
        assert not torch.isnan(scores).any()
    if num_beams > 1:
        assert torch.isfinite(out.sequences_scores).all()


# --------------------------------------------------------------------------------------------------
# Gradient checkpointing: activation memory
# --------------------------------------------------------------------------------------------------
MID_SIZE = {
    "vocab_size": 1000,
    "d_model": 128,
    "encoder_layers": 4,
    "decoder_layers": 4,
    "encoder_attention_heads": 8,
    "decoder_attention_heads": 8,
    "encoder_ffn_dim": 512,
    "decoder_ffn_dim": 512,
    "max_position_embeddings": 256,
}


def saved_activation_bytes(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> int:
    """Bytes that autograd keeps alive from the forward pass for the backward pass (distinct storages,
    parameters excluded): the activation memory gradient checkpointing trades for recomputation.

    Counted with ``torch.autograd.graph.saved_tensors_hooks``; deterministic, unlike timing or RSS.
    """
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters and tensor.device.type != "meta":
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(**batch).loss
    loss.backward()  # the recomputation inside backward saves more, but only one layer at a time
    return sum(storages.values())


def test_gradient_checkpointing_keeps_far_fewer_activations() -> None:
    generator = torch.Generator().manual_seed(0)
    batch = {
        "input_ids": torch.randint(4, 1000, (8, 48), generator=generator),
        "labels": torch.randint(4, 1000, (8, 40), generator=generator),
    }
    plain = tiny_model(**MID_SIZE).train()
    checkpointed = tiny_model(**MID_SIZE).train()
    checkpointed.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    full, reduced = saved_activation_bytes(plain, batch), saved_activation_bytes(checkpointed, batch)
    # Without: every layer's attention probabilities, FFN hidden states, ... With: each layer's input only.
    assert reduced < 0.25 * full, (reduced, full)


# --------------------------------------------------------------------------------------------------
# fp16 loss scaling: GPU only (on CPU accelerate 1.15 accepts fp16 but runs fp32 without a scaler)
# --------------------------------------------------------------------------------------------------
@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 loss scaling needs a CUDA device")
def test_fp16_trainer_scales_the_loss_on_gpu(tmp_path: Path, tokenizer: Any) -> None:
    model = tiny_model().train()
    trainer = _trainer(tmp_path, tokenizer, model, fp16=True, use_cpu=False)
    trainer.train()
    scaler = trainer.accelerator.scaler
    assert scaler is not None and scaler.is_enabled() and scaler.get_scale() > 1
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert all(math.isfinite(loss) for loss in losses)
