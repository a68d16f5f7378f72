"""A shared source+target BPE vocabulary (§5.1) as a `transformers` fast tokenizer.

The paper encodes WMT 2014 English-German with byte-pair encoding into "a shared source-target vocabulary
of about 37000 tokens" (§5.1); sharing is what lets one matrix serve as source embedding, target embedding
and pre-softmax projection (§3.4). Here one `tokenizers` BPE model is trained on the source and target
sides together.

Choices, and why:

- **Byte-level BPE** (`ByteLevel` pre-tokenizer and decoder, GPT-2 style, all 256 bytes in the initial
  alphabet): any UTF-8 text encodes without `<unk>` — German umlauts and ß, unseen scripts in test sets —
  and decodes back exactly: `decode(encode(x), skip_special_tokens=True) == x`, repeated spaces included.
  `add_prefix_space=False` keeps that exact (a prefix space would come back on decoding), at the cost of a
  sentence-initial word getting other tokens than the same word after a space. No normalizer, for the
  same reason (NFKC would change text). `clean_up_tokenization_spaces=False`, or "a ." would decode as "a.".
- **Special tokens** `<pad>`=0, `<s>`=1, `</s>`=2, `<unk>`=3, matching the config defaults
  (pad 0, bos 1, eos 2; `decoder_start_token_id` = bos). `<unk>` exists for completeness; byte-level BPE
  never produces it.
- **`</s>` is appended** to every encoded sequence, source and target alike, by a `TemplateProcessing`
  post-processor — as Marian does. Labels therefore end in `</s>`, and the model's shift-right puts
  `<s>` in front of the decoder input.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast  # neither imports torch

from hf_vanilla.data.options import TOKENIZER_SAMPLE_PAIRS, DataArguments
from hf_vanilla.io.errors import CorruptCheckpointError
from hf_vanilla.io.json_files import read_json
from hf_vanilla.io.manifest import verify_tokenizer_files

if TYPE_CHECKING:  # each costs seconds to import (the Auto classes import torch); translation needs none
    import datasets
    from transformers import PretrainedConfig, TrainingArguments

logger = logging.getLogger(__name__)

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)  # ids 0, 1, 2, 3 in this order
_MIN_VOCAB = len(SPECIAL_TOKENS) + 256  # specials + the byte alphabet


def _wrap(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
        model_input_names=["input_ids", "attention_mask"],
        padding_side="right",
    )


def train_bpe_tokenizer(
    texts: Iterable[str] | Iterable[list[str]],
    vocab_size: int = 37000,
    min_frequency: int = 2,
    length: int | None = None,
    show_progress: bool = False,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `texts` (strings or batches of strings) and wrap it for `transformers`.

    `vocab_size` counts everything (4 special tokens + 256 bytes + merges); the result can be smaller when
    the text has too few distinct pairs (see `len(tokenizer)`). `length` (the number of items in `texts`)
    only drives the progress bar.
    """
    if vocab_size < _MIN_VOCAB:
        raise ValueError(
            f"vocab_size={vocab_size} is too small: byte-level BPE needs {len(SPECIAL_TOKENS)} special tokens "
            f"+ 256 bytes = {_MIN_VOCAB} ids before the first merge. Use vocab_size >= {_MIN_VOCAB}."
        )
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=length)
    for expected_id, token in enumerate(SPECIAL_TOKENS):
        if tokenizer.token_to_id(token) != expected_id:  # a tokenizers change would break the config contract
            raise RuntimeError(f"{token} got id {tokenizer.token_to_id(token)}, expected {expected_id}.")
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}", special_tokens=[(EOS, SPECIAL_TOKENS.index(EOS))]
    )
    logger.info(
        "Trained a byte-level BPE with %d tokens (asked for %d).", tokenizer.get_vocab_size(), vocab_size
    )
    return _wrap(tokenizer)


def iter_translation_texts(
    dataset: datasets.Dataset, source_lang: str, target_lang: str, batch_size: int = 1000
) -> Iterator[list[str]]:
    """Batches of sentences from a dataset's `translation` column: each batch's source then target side."""
    if "translation" not in dataset.column_names:
        raise ValueError(f"Expected a `translation` column, got columns {dataset.column_names}.")
    for batch in dataset.select_columns(["translation"]).iter(batch_size=batch_size):
        pairs = batch["translation"]
        yield [pair[source_lang] for pair in pairs] + [pair[target_lang] for pair in pairs]


def train_tokenizer_from_dataset(
    data: datasets.DatasetDict | datasets.Dataset,
    source_lang: str,
    target_lang: str,
    vocab_size: int = 37000,
    min_frequency: int = 2,
    split: str = "train",
    max_pairs: int | None = TOKENIZER_SAMPLE_PAIRS,
) -> PreTrainedTokenizerFast:
    """Train the shared BPE on both sides of `data[split]` (or of `data` if it is one `Dataset`).

    With more than `max_pairs` pairs (None or 0: no limit) it trains on every k-th pair, k the smallest
    step that keeps at most `max_pairs`: the sample spans the whole corpus (WMT14's training data is
    Europarl, then Common Crawl, then News Commentary; its first million pairs would be Europarl only).
    Time and memory then stay bounded whatever the corpus size. The effect on the vocabulary: merges
    are learnt from the sample's pair counts, so a word frequent enough in the sample gets the same
    tokens; rare words (seen in the full corpus but not the sample) are split into more, smaller
    pieces — they are still encoded, byte-level BPE has no unknown tokens.
    """
    import datasets

    if isinstance(data, datasets.DatasetDict):
        if split not in data:
            raise ValueError(f"No split {split!r} to train the tokenizer on; the data has {list(data)}.")
        data = data[split]
    if max_pairs is not None and max_pairs < 0:
        raise ValueError(f"max_pairs must be a positive number of pairs, or 0 for all; got {max_pairs}.")
    if max_pairs and len(data) > max_pairs:
        step = -(-len(data) // max_pairs)
        logger.info(
            "Training the tokenizer on every %d-th pair (%d of %d)", step, -(-len(data) // step), len(data)
        )
        data = data.select(range(0, len(data), step))
    batch_size = 1000
    return train_bpe_tokenizer(
        iter_translation_texts(data, source_lang, target_lang, batch_size),
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        length=-(-len(data) // batch_size),
    )


def check_tokenizer_matches_config(
    tokenizer: PreTrainedTokenizerBase, config: PretrainedConfig, sources: str | None = None
) -> None:
    """Raise `ValueError` if the tokenizer's size or special-token ids disagree with the model config.

    The one check of every backend: ``config`` is a transformers model's config or a
    :class:`hf_vanilla.inference.ctranslate2.CTranslate2Model`'s (read from the export); a special-token id the
    config does not have is not compared.

    The sizes must be equal: a larger tokenizer produces ids with no embedding; a smaller one (another
    tokenizer, say the demo's 400 tokens for an 8,000-token model) maps text to the wrong rows and the
    model translates it into fluent nonsense without an error. With separate source and target
    vocabularies (`config.decoder_vocab_size`) a tokenizer with `get_tgt_vocab` is checked on both
    sides. The pad, bos and eos ids must agree, or padding is not masked and generation never stops
    at `</s>`. `sources` names where the two came from, for the message (e.g. "runs/tok and runs/base").
    """
    problems = []
    for name in ("pad", "bos", "eos"):
        if not hasattr(config, f"{name}_token_id"):  # not said by the model (a foreign CTranslate2 export)
            continue
        tok_id, cfg_id = getattr(tokenizer, f"{name}_token_id"), getattr(config, f"{name}_token_id")
        if tok_id != cfg_id:
            problems.append(f"{name}_token_id is {tok_id} in the tokenizer but {cfg_id} in the model")
    sizes = [("vocabulary", len(tokenizer), config.vocab_size)]
    if getattr(config, "decoder_vocab_size", None) is not None and hasattr(tokenizer, "get_tgt_vocab"):
        sizes = [
            ("source vocabulary", len(tokenizer.get_src_vocab()), config.vocab_size),
            ("target vocabulary", len(tokenizer.get_tgt_vocab()), config.decoder_vocab_size),
        ]
    for side, tokens, rows in sizes:
        if tokens != rows:
            problems.append(f"the tokenizer's {side} has {tokens} tokens but the model's has {rows}")
    if problems:
        where = f" ({sources})" if sources else ""
        raise ValueError(
            f"Tokenizer and model disagree{where}: {'; '.join(problems)}. This is not the tokenizer the model "
            "was trained with: use that one (it is saved in the model folder, the default when no tokenizer "
            "is given), or train the model with this tokenizer."
        )


def _names_the_tokenizers_backend(folder: Path) -> bool:
    """Whether ``folder``'s tokenizer_config.json names the class ``AutoTokenizer`` would build from
    tokenizer.json alone (``TokenizersBackend``, formerly ``PreTrainedTokenizerFast``: every tokenizer this
    project writes). That class is loaded directly, without the Auto classes' import of torch, so a
    CTranslate2 translation starts in about a second."""
    path = folder / "tokenizer_config.json"
    if not (path.is_file() and (folder / "tokenizer.json").is_file()):
        return False
    try:
        named = json.loads(path.read_text(encoding="utf-8")).get("tokenizer_class")
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return False  # AutoTokenizer reports it
    return named in ("TokenizersBackend", "PreTrainedTokenizerFast")


#: What to do about a damaged tokenizer file.
_RESAVE_TOKENIZER = (
    "Save the tokenizer again (`tokenizer.save_pretrained`) or copy it from the folder it was trained into."
)


def check_tokenizer_files(folder: Path) -> None:
    """Refuse a tokenizer folder with a damaged file, in one error naming it: a file that differs from the
    folder's ``checksums.sha256`` (:func:`hf_vanilla.io.manifest.verify_tokenizer_files`), a JSON file that
    is not JSON or not a JSON object, a ``tokenizer.json`` the tokenizers library cannot read."""
    verify_tokenizer_files(folder)
    for name in ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json"):
        if (folder / name).is_file():
            read_json(folder / name, hint=_RESAVE_TOKENIZER)
    path = folder / "tokenizer.json"
    if path.is_file():
        read_json(path, hint=_RESAVE_TOKENIZER)
        try:
            Tokenizer.from_file(str(path))
        except Exception as err:  # the tokenizers library raises Exception itself for what it cannot parse
            raise CorruptCheckpointError(
                f"{str(path)!r} is damaged: it is JSON but not a tokenizer ({err}). {_RESAVE_TOKENIZER}"
            ) from err


def load_tokenizer(source: str | Path, **kwargs: Any) -> PreTrainedTokenizerBase:
    """`AutoTokenizer.from_pretrained(source, **kwargs)` (for this project's tokenizers the class it
    picks, loaded directly), with an error naming the folder or file and
    the cause when it cannot be loaded (a damaged `tokenizer.json`, a folder without a tokenizer)."""
    folder = Path(source)
    if folder.is_dir():
        check_tokenizer_files(folder)
    try:
        if _names_the_tokenizers_backend(folder) and not kwargs.get("trust_remote_code"):
            return PreTrainedTokenizerFast.from_pretrained(str(source), **kwargs)  # what AutoTokenizer picks
        from transformers import AutoTokenizer  # imports torch: only for other tokenizer classes

        return AutoTokenizer.from_pretrained(str(source), **kwargs)
    except (OSError, ValueError) as err:
        detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        what = "the folder" if folder.is_dir() else "a folder or Hub id"
        raise ValueError(
            f"Cannot load a tokenizer from {str(source)!r} ({detail}). Give {what} holding the tokenizer files "
            "(tokenizer.json, tokenizer_config.json), e.g. the model folder or scripts/train_tokenizer.py's "
            "--output_dir."
        ) from err


def tokenize_translations(
    data: datasets.DatasetDict | datasets.Dataset,
    tokenizer: PreTrainedTokenizerBase,
    source_lang: str,
    target_lang: str,
    max_source_length: int | None = None,
    max_target_length: int | None = None,
    num_proc: int | None = None,
    **map_kwargs: Any,
) -> datasets.DatasetDict | datasets.Dataset:
    """Map `translation` pairs to `input_ids`, `attention_mask` and `labels` (each ending in `</s>`).

    Truncation to `max_*_length` keeps the final `</s>`. Nothing is padded here: padding happens per batch
    in `DataCollatorForSeq2Seq`, which pads labels with -100.
    """

    def encode(batch: dict[str, list]) -> dict[str, list]:
        sources = [pair[source_lang] for pair in batch["translation"]]
        targets = [pair[target_lang] for pair in batch["translation"]]
        encoded = tokenizer(sources, max_length=max_source_length, truncation=max_source_length is not None)
        labels = tokenizer(
            text_target=targets, max_length=max_target_length, truncation=max_target_length is not None
        )
        encoded["labels"] = labels["input_ids"]
        return dict(encoded)

    return data.map(encode, batched=True, remove_columns=["translation"], num_proc=num_proc, **map_kwargs)


def load_or_train_tokenizer(
    sources: Sequence[str | None],
    load_data: Callable[[], datasets.DatasetDict],
    data_args: DataArguments,
    vocab_size: int,
    training_args: TrainingArguments,
) -> PreTrainedTokenizerBase:
    """The tokenizer saved at the first of ``sources`` that is given (a tokenizer path, a checkpoint or
    a model folder, in the caller's order of precedence), else a new shared BPE (§5.1) of
    ``vocab_size`` tokens trained on both sides of the training split of ``load_data()`` (called only
    then, so that a warm restart need not read the text) — by the main process only
    under data parallelism, which sends its files to the other ranks (no shared file system needed)."""
    source = next((path for path in sources if path), None)
    if source is not None:
        logger.info("Loading the tokenizer from %s", source)
        return load_tokenizer(source)
    from accelerate.utils import broadcast_object_list  # the train extra; not needed to load a tokenizer

    # Under data parallelism the main process trains it once and sends its files to every rank (no
    # shared file system needed); every rank, the main one included, loads the same files. A failure
    # on the main process is sent too, so that no rank waits for files that never come.
    processes = training_args.world_size
    message: list[dict[str, bytes] | str | None] = [None]
    if training_args.process_index == 0:
        logger.info(
            "Training a shared BPE tokenizer (%d tokens) on the training split, once for %d process(es)",
            vocab_size,
            processes,
        )
        try:
            tokenizer = train_tokenizer_from_dataset(
                load_data(), data_args.source_lang, data_args.target_lang, vocab_size=vocab_size
            )
            if processes == 1:
                return tokenizer
            with tempfile.TemporaryDirectory() as folder:
                tokenizer.save_pretrained(folder)
                message = [{path.name: path.read_bytes() for path in Path(folder).iterdir()}]
        except Exception as error:
            if processes > 1:
                broadcast_object_list([f"{type(error).__name__}: {error}"], from_process=0)
            raise
    broadcast_object_list(message, from_process=0)
    files = message[0]
    if not isinstance(files, dict):
        raise RuntimeError(f"The main process failed to train the tokenizer ({files}); see its log.")
    with tempfile.TemporaryDirectory() as folder:
        for name, content in files.items():
            (Path(folder) / name).write_bytes(content)
        tokenizer = load_tokenizer(folder)
    logger.info("Loaded the tokenizer the main process trained (%d tokens)", len(tokenizer))
    return tokenizer
