"""Shared fixtures: tiny configs (d_model 32, 2 + 2 layers, 4 heads, vocab 100), a tiny tokenizer, and a
tiny model trained on a copy task."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


import datasets
import pytest
import torch
from helpers import TRAIN, VALID, copy_task, tiny_model
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from hf_vanilla import VanillaTransformerForConditionalGeneration
from hf_vanilla.data.numbers import make_demo_splits
from hf_vanilla.data.tokenization import train_tokenizer_from_dataset

# Tiny models run fastest on one thread; several threads only add synchronisation (and contend
# with each other on a shared 2-core machine).
torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def datasets_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The session's own `datasets` cache (for training runs' tokenized-data cache, hf_vanilla.data.cache),
    here and in the processes tests start, rather than the user's."""
    folder = tmp_path_factory.mktemp("datasets_cache")
    patch = pytest.MonkeyPatch()
    patch.setenv("HF_DATASETS_CACHE", str(folder))
    patch.setattr(datasets.config, "HF_DATASETS_CACHE", folder)
    yield folder
    patch.undo()


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Every test starts on one torch thread (as set above): a ``ctranslate2.Translator`` sets the process's
    OpenMP thread count, torch's included, to the machine's cores, and every later test then ran its tiny
    matrices on 2 spinning threads (3-10x the CPU time on a loaded 2-core machine)."""
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)
    yield


@pytest.fixture
def gloo_group_of_one(tmp_path: Path) -> Iterator[None]:
    """A default process group of one process (gloo, a file store) for this test; gone after it."""
    store = torch.distributed.FileStore(str(tmp_path / "process-group-store"), 1)
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


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


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tokenizer")
    data = make_demo_splits(TRAIN, VALID, 0)
    train_tokenizer_from_dataset(data, "en", "de", vocab_size=300).save_pretrained(folder)
    return folder
