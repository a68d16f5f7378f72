"""Shared fixtures: tiny configs (d_model 32, 2 + 2 layers, 4 heads, vocab 100), a tiny tokenizer, and a
tiny model trained on a copy task."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from hf_vanilla import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

# Tiny models run fastest on one thread; several threads only add synchronisation (and contend
# with each other on a shared 2-core machine).
torch.set_num_threads(1)

#: The model card's data as a training push or hf-vanilla-publish takes it (custom data, its terms, a licence).
CARD_ARGS = (
    "--dataset",
    "custom",
    "--dataset_id",
    "pairs",
    "--data_terms",
    "CC BY 4.0",
    "--weights_license",
    "cc-by-4.0",
)

TINY = {
    "vocab_size": 100,
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "max_position_embeddings": 64,
}


def tiny_config(**overrides: object) -> VanillaTransformerConfig:
    return VanillaTransformerConfig(**{**TINY, **overrides})


def tiny_model(seed: int = 0, **overrides: object) -> VanillaTransformerForConditionalGeneration:
    torch.manual_seed(seed)
    return VanillaTransformerForConditionalGeneration(tiny_config(**overrides)).eval()


@pytest.fixture
def model() -> VanillaTransformerForConditionalGeneration:
    return tiny_model()


@pytest.fixture
def batch() -> dict[str, torch.Tensor]:
    """Two source rows (the second padded), decoder inputs and labels (the second padded with -100)."""
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(4, 100, (2, 9), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    input_ids[1, 6:] = 0
    attention_mask[1, 6:] = 0
    labels = torch.randint(4, 100, (2, 7), generator=generator)
    labels[:, -1] = 2
    labels[1, 5:] = -100
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


@pytest.fixture
def tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over 96 words with the model's special tokens (<pad> 0, <s> 1, </s> 2, <unk> 3)."""
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({f"w{i}": i + 4 for i in range(96)})
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


#: Prepended to code run "where hf_vanilla is not installed": the editable install stays on sys.path, so
#: the import is refused instead.
BLOCK_HF_VANILLA = r"""
import sys

class _BlockHfVanilla:
    def find_spec(self, name, path=None, target=None):
        if name == "hf_vanilla" or name.startswith("hf_vanilla."):
            raise ModuleNotFoundError(f"blocked: {name}")

sys.meta_path.insert(0, _BlockHfVanilla())
"""


def run_clean(code: str, cwd: Path, *args: str, block_hf_vanilla: bool = True) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter, offline, without progress bars, stdin closed (an interactive
    prompt would print and then read EOF), with hf_vanilla not importable unless ``block_hf_vanilla`` is
    false. Fails the test with the process's stderr if it exits non-zero."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(
        HF_HUB_OFFLINE="1",
        HF_MODULES_CACHE=str(cwd / ".hf_modules"),
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
    )
    source = (BLOCK_HF_VANILLA if block_hf_vanilla else "") + code
    result = subprocess.run(
        [sys.executable, "-c", source, *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def copy_task(generator: torch.Generator, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sources of 6 random words (4…19) + </s>; the target is the source."""
    words = torch.randint(4, 20, (rows, 6), generator=generator)
    source = torch.cat([words, torch.full((rows, 1), 2)], dim=1)
    return source, source.clone()


@pytest.fixture(scope="session")
def copy_model() -> VanillaTransformerForConditionalGeneration:
    """A tiny model trained to copy its input (a few seconds), shared by the session (deep-copy it
    before changing it): its greedy outputs are confident, so a change of kernels or precision that
    changes them is a real change."""
    torch.manual_seed(0)
    model = tiny_model(vocab_size=20, d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128, dropout=0.0)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3, betas=(0.9, 0.98))
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 50))
    generator = torch.Generator().manual_seed(0)
    for _ in range(400):
        source, labels = copy_task(generator, 32)
        optimizer.zero_grad()
        model(input_ids=source, labels=labels).loss.backward()
        optimizer.step()
        warmup.step()
    return model.eval()
