"""Batched translation with the paper's decoding settings (Vaswani et al., 2017, §6.1).

§6.1: "We used beam search with a beam size of 4 and length penalty α = 0.6 [...]. We set the maximum
output length during inference to input length + 50, but terminate early when possible."

* **Beam size 4**: ``num_beams=4``.
* **Maximum output length = input length + 50**, per sentence: the model's ``generate()`` applies
  it on every call (the 50 is the generation config's ``max_length_offset``), so nothing is passed
  here; a ``max_new_tokens``/``max_length`` in ``generate_kwargs`` caps it further. "Input length"
  counts the unpadded source tokens (subwords, with any special token the tokenizer appends); the
  bound counts generated tokens including ``</s>``.
* **"Terminate early when possible"**: beam search stops when no running hypothesis can still beat
  the finished ones: transformers' ``early_stopping="never"``, the default of ``early_stopping``
  here. ``"true"`` stops as soon as ``num_beams`` hypotheses have finished, ``"false"`` uses HF's
  heuristic (``benchmarks/experiments/early_stopping.py`` compares them).
* **Length penalty α = 0.6**. The paper's α refers to the GNMT penalty (Wu et al., 2016, Eq. 14)
  lp(Y) = ((5 + |Y|) / 6)^α, score(Y) = log P(Y | X) / lp(Y). Hugging Face beam search has one fixed
  formula, score(Y) = log P(Y | X) / |Y|^α, applied inside the search when a hypothesis finishes. Two
  choices are offered (``length_penalty_type``):

  - ``"hf"`` (default): HF's |Y|^α inside the search. Exact beam search, not the paper's formula.
  - ``"gnmt"``: the paper's formula as **n-best rescoring**. The search runs with HF's |Y|^α; all
    ``num_beams`` finished hypotheses are returned, their summed log-probabilities are recovered
    (``sequences_scores × |Y|^α``, HF's own definition), divided by ((5 + |Y|) / 6)^α, and the best
    one is kept. It re-ranks the final beam; it does not change which hypotheses the search pruned.

  |Y| counts generated tokens including end-of-sentence (not the decoder start token) in both, as
  HF and tensor2tensor do.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from transformers.tokenization_utils_base import VERY_LARGE_INTEGER

from hf_vanilla.data.tokenization import check_tokenizer_matches_config
from hf_vanilla.inference.ctranslate2 import CTranslate2Model
from hf_vanilla.inference.options import DecodingOptions, Hypothesis, check_nbest, refuse_non_finite

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


__all__ = [
    "InputTooLongError",
    "TargetPrefixError",
    "TranslationOutOfMemoryError",
    "check_batching",
    "check_input_length",
    "format_alignment",
    "format_nbest",
    "longest_input",
    "one_line",
    "sentence_splitter",
    "target_prefix_ids",
    "translate",
    "translate_nbest",
]


def longest_input(model: Any, tokenizer: Any) -> int | None:
    """The most source tokens the model takes: ``max_position_embeddings`` (the CTranslate2 export's
    position table; ``generate()`` computes positions for any length but is held to the same limit by
    :func:`translate`), or for a CTranslate2 model the tokenizer's ``model_max_length`` (set from the
    model when exported). ``None``: no limit known."""
    if isinstance(model, CTranslate2Model):
        limit = tokenizer.model_max_length
        return int(limit) if limit < VERY_LARGE_INTEGER else None
    return getattr(model.config, "max_position_embeddings", None)


class InputTooLongError(ValueError):
    """A sentence with more tokens than :func:`longest_input`; ``index`` is its place in the input."""

    def __init__(
        self, index: int, length: int, limit: int, where: str | None = None, fix: str = "Split the sentence."
    ) -> None:
        self.index, self.length, self.limit = index, length, limit
        where = where or f"sentence {index + 1}"
        super().__init__(
            f"{where}: {length} tokens, more than the model's longest input of {limit} tokens "
            f"(its max_position_embeddings, the tokenizer's model_max_length). {fix}"
        )


def check_batching(batch_size: int, max_tokens: int) -> None:
    """Refuse a batch size below 1 or a negative token budget, naming the flag (``--batch_size``,
    ``--max_tokens``) of the commands that pass them on."""
    if batch_size < 1:
        raise ValueError(f"--batch_size {batch_size}: give a positive number of sentences per batch.")
    if max_tokens < 0:
        raise ValueError(
            f"--max_tokens {max_tokens}: give 0 (no token budget) or a positive number of tokens."
        )


def one_line(text: str) -> str:
    """``text`` as one line: each line boundary that ``str.splitlines()`` knows (``\\n``, ``\\r``, ``\\r\\n``,
    ``\\x0b``, ``\\x0c``, ``\\x1c``-``\\x1e``, ``\\x85``, U+2028, U+2029) becomes a space, and the ends are
    stripped. A byte-level tokenizer can decode a hypothesis into text holding them; every translation
    goes through here, so that each input line gives exactly one output line."""
    return " ".join(text.splitlines()).strip()


def check_input_length(
    model: Any, tokenizer: Any, length: int, index: int = 0, where: str | None = None
) -> None:
    """Raise :class:`InputTooLongError` (naming ``where``, default "sentence <index + 1>") when ``length``
    tokens exceed :func:`longest_input`: the one check of the model's length limit that translation,
    evaluation and the attention plots share."""
    limit = longest_input(model, tokenizer)
    if limit is not None and length > limit:
        raise InputTooLongError(index, length, limit, where)


def _batches(
    order: list[int], lengths: dict[int, int], batch_size: int, max_tokens: int
) -> Iterator[list[int]]:
    """Consecutive groups of ``order`` (longest first) of at most ``batch_size`` sentences and, with a
    ``max_tokens`` budget, at most that many padded tokens (sentences × the group's longest)."""
    batch: list[int] = []
    for i in order:
        if batch and (
            len(batch) == batch_size or (max_tokens and (len(batch) + 1) * lengths[batch[0]] > max_tokens)
        ):
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


class TranslationOutOfMemoryError(ValueError):
    """A batch did not fit in memory; the message names the flags that make batches smaller."""

    def __init__(self, sentences: int, longest: int, num_beams: int) -> None:
        super().__init__(
            f"Out of memory translating a batch of {sentences} sentence(s) of up to {longest} tokens with "
            f"--num_beams {num_beams}: lower --batch_size, set a --max_tokens budget (a batch's sentences × "
            "its longest), or lower --num_beams."
        )


def _out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` says that memory ran out: ``MemoryError`` (CTranslate2's ``std::bad_alloc``),
    torch's ``OutOfMemoryError`` (CUDA) or its CPU allocator's "can't allocate memory"."""
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
        return True
    text = str(error)
    return "can't allocate memory" in text or "out of memory" in text


def _within_the_bound(generate_kwargs: dict[str, Any], model: Any, longest: int) -> dict[str, Any]:
    """``generate_kwargs`` with a ``max_new_tokens`` above the batch's own bound (its longest source, of
    ``longest`` tokens, + the model's ``max_length_offset``) lowered to that bound: the outputs are the same,
    and ``generate()`` does not allocate for a length no output can reach (``--max_length 2147483647``)."""
    cap = generate_kwargs.get("max_new_tokens")
    offset = generate_kwargs.get(
        "max_length_offset", getattr(model.generation_config, "max_length_offset", None)
    )
    if cap is None or isinstance(offset, bool) or not isinstance(offset, int):
        return generate_kwargs
    return {**generate_kwargs, "max_new_tokens": min(cap, longest + offset)}


def _offset(model: Any, generate_kwargs: dict[str, Any]) -> int | None:
    """The ``max_length_offset`` of the output length bound: the call's, else the model's (``None``: a
    model without the per-sentence bound)."""
    if isinstance(model, CTranslate2Model):
        return model.max_length_offset
    return generate_kwargs.get(
        "max_length_offset", getattr(model.generation_config, "max_length_offset", None)
    )


def _length_bound(model: Any, generate_kwargs: dict[str, Any], length: int) -> int | None:
    """The most output tokens (``</s>`` included) a sentence of ``length`` source tokens may get: its
    length + ``max_length_offset``, or less under a ``max_new_tokens`` cap (``None``: no bound)."""
    offset, cap = _offset(model, generate_kwargs), generate_kwargs.get("max_new_tokens")
    bounds = [bound for bound in (None if offset is None else length + offset, cap) if bound is not None]
    return min(bounds, default=None)


class TargetPrefixError(ValueError):
    """A target prefix that cannot be used; ``index`` is its place in the input, ``reason`` what to do."""

    def __init__(self, index: int, reason: str, where: str = "--target_prefix_file") -> None:
        self.index, self.reason = index, reason
        super().__init__(f"{where}, line {index + 1}: {reason}")


def target_prefix_ids(
    model: Any,
    tokenizer: Any,
    sentences: Sequence[str],
    prefixes: Sequence[str] | None,
    lengths: dict[int, int],
    generate_kwargs: dict[str, Any],
) -> dict[int, list[int]]:
    """The target-prefix token ids of each sentence to translate (the keys of ``lengths``, its source
    tokens; no special token; ``[]`` for a blank prefix), checked: one prefix per sentence, none for a
    blank sentence, and each shorter than the sentence's output length bound (room for ``</s>``); a bad
    prefix raises :class:`TargetPrefixError`. Nothing is decoded: the server checks requests with it."""
    if prefixes is None:
        return {i: [] for i in lengths}
    if len(prefixes) != len(sentences):
        raise ValueError(
            f"--target_prefix_file has {len(prefixes)} line(s) for {len(sentences)} input line(s): give one "
            "prefix per input line (a blank line for none)."
        )
    for i, (sentence, prefix) in enumerate(zip(sentences, prefixes, strict=True)):
        if prefix.strip() and not sentence.strip():
            raise TargetPrefixError(
                i,
                "a prefix for a blank input line; leave that prefix line blank (a blank input line gives a "
                "blank output line).",
            )
    ids = {
        i: tokenizer(text_target=prefixes[i].strip(), add_special_tokens=False)["input_ids"]
        if prefixes[i].strip()
        else []
        for i in lengths
    }
    for i, prefix in ids.items():
        bound = _length_bound(model, generate_kwargs, lengths[i])
        if bound is not None and len(prefix) >= bound:
            raise TargetPrefixError(
                i,
                f"the prefix has {len(prefix)} tokens, but this line's output holds at most {bound - 1} "
                "before </s> (input length + max_length_offset, or --max_length): shorten the prefix or "
                "raise --max_length.",
            )
    return ids


def _with_prefix(generate_kwargs: dict[str, Any], model: Any, prefix: int) -> dict[str, Any]:
    """``generate_kwargs`` for a batch whose decoder prompt holds ``prefix`` forced tokens after the start
    token: ``generate()`` bounds the tokens it adds after its prompt, so the bound and a
    ``max_new_tokens`` cap are lowered by the prefix, and the whole output keeps the bound."""
    if not prefix:
        return generate_kwargs
    kwargs = dict(generate_kwargs)
    offset = _offset(model, generate_kwargs)
    if offset is not None:  # a prefix beyond the offset: outputs are cut at their bound afterwards
        kwargs["max_length_offset"] = max(offset - prefix, 0)
    if "max_new_tokens" in kwargs:
        kwargs["max_new_tokens"] -= prefix
    return kwargs


def sentence_splitter(language: str) -> Callable[[str], list[str]]:
    """A function that splits a line into its sentences with pysbd (Sadvilkar and Neumann, 2020; rule
    based, no model) for ``language`` (an ISO 639-1 code it knows: en, de, fr, ...), and returns pieces
    that join back into the line: sentences at even places, the whitespace between them at odd ones."""
    try:
        import pysbd
        from pysbd.languages import LANGUAGE_CODES
    except ImportError as err:
        raise ImportError(
            "--split_sentences needs pysbd: pip install 'hf_vanilla[split]' (or pip install pysbd)."
        ) from err
    if language not in LANGUAGE_CODES:
        raise ValueError(
            f"--split_sentences {language!r}: pysbd splits {', '.join(sorted(LANGUAGE_CODES))}; give one of "
            "these language codes."
        )
    segmenter = pysbd.Segmenter(language=language, clean=False)

    def split(line: str) -> list[str]:
        pieces, cursor = [], len(line) - len(line.lstrip())
        for sentence in (piece.strip() for piece in segmenter.segment(line)):
            start = line.find(sentence, cursor) if sentence else -1
            if start < 0:  # not found as it is in the line: the line is not split
                return [line.strip()]
            if pieces:
                pieces.append(line[cursor:start])
            pieces.append(sentence)
            cursor = start + len(sentence)
        return pieces or [line.strip()]

    return split


def _translate_sentences(
    split: Callable[[str], list[str]],
    sentences: Sequence[str],
    translate_lines: Callable[[list[str]], list[list[Hypothesis]]],
) -> list[list[Hypothesis]]:
    """Translate the sentences of each line with ``translate_lines`` and join their translations with the
    whitespace that was between them: one hypothesis per line (none for a blank line)."""
    pieces = [split(line) if line.strip() else [] for line in sentences]
    flat = [sentence for line in pieces for sentence in line[::2]]
    owners = [index for index, line in enumerate(pieces) for _ in line[::2]]
    try:
        translated = iter(translate_lines(flat))
    except InputTooLongError as err:  # name the input line, not the sentence's place among all sentences
        raise InputTooLongError(owners[err.index], err.length, err.limit, fix="Split it further.") from None
    results: list[list[Hypothesis]] = []
    for line in pieces:
        joined = [
            piece if k % 2 else (next(translated) or [Hypothesis("")])[0].text for k, piece in enumerate(line)
        ]
        results.append([Hypothesis("".join(joined))] if line else [])
    return results


@contextlib.contextmanager
def _seeded(model: Any, device: Any, seed: int | None) -> Iterator[None]:
    """Sampling with random numbers from ``seed`` (``None``: as they come): CTranslate2's generator is
    seeded; torch's is seeded inside a fork of its state, which is restored afterwards."""
    if seed is None:
        yield
    elif isinstance(model, CTranslate2Model):
        model.seed(seed)
        yield
    else:
        import torch

        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            yield


def translate_nbest(
    model: Any,
    tokenizer: Any,
    sentences: Sequence[str] | str,
    options: DecodingOptions | None = None,
    batch_size: int = 64,
    device: str | torch.device | None = None,
    generate_kwargs: dict[str, Any] | None = None,
    nbest: int | None = None,
    max_tokens: int = 0,
    prefixes: Sequence[str] | str | None = None,
    alignments: bool = False,
    split_sentences: str | None = None,
) -> list[list[Hypothesis]] | list[Hypothesis]:
    """Translate ``sentences`` in batches; per sentence, in input order, its hypotheses: one without
    ``nbest`` (score ``None``), else the ``nbest`` best with scores, best first (see
    :func:`generate_hypotheses`). A blank sentence gets no hypothesis (an empty list). A bare string is
    one sentence: its hypotheses are returned (a list of :class:`Hypothesis`, not a list of lists).

    ``model`` is a transformers model or a :class:`CTranslate2Model` (then ``generate_kwargs`` may only
    hold ``max_new_tokens``). Batches hold at most ``batch_size`` sentences and, with ``max_tokens``, at
    most that many padded source tokens. A sentence longer than :func:`longest_input` raises
    :class:`InputTooLongError` before anything is translated; a batch that does not fit in memory
    :class:`TranslationOutOfMemoryError`.

    ``prefixes`` (one per sentence; a blank one: none) are target prefixes: each translation starts with
    its prefix's tokens (forced decoding) and the rest is decoded. The prefix counts in the output length
    bound; scores count the decoded tokens after it. Sentences are batched with others of the same
    prefix length (``generate()`` then needs no padding inside the decoder prompt).

    ``alignments``: the best hypothesis of each sentence gets its hard alignment (see
    :func:`~hf_vanilla.inference.decoding.hard_alignments`; with CTranslate2,
    :meth:`CTranslate2Model.hard_alignments`, from an export written with the alignment's attention).

    ``split_sentences`` (a language code, see :func:`sentence_splitter`): each line is split into its
    sentences, they are translated, and each line's translations are joined with the whitespace that was
    between its sentences (one hypothesis per line; not with ``nbest``, ``prefixes`` or ``alignments``).
    """
    if isinstance(sentences, str):  # one sentence, not a sequence of one-character sentences
        return translate_nbest(
            model, tokenizer, [sentences], options, batch_size, device, generate_kwargs, nbest, max_tokens,
            None if prefixes is None else [prefixes], alignments, split_sentences,
        )[0]  # fmt: skip
    if split_sentences is not None:
        given = [flag for flag, value in (("--nbest", nbest), ("--target_prefix_file", prefixes),
                 ("--alignment_file", alignments or None)) if value is not None]  # fmt: skip
        if given:
            raise ValueError(
                f"--split_sentences joins one translation per sentence back into its line: leave out {', '.join(given)}."
            )
        return _translate_sentences(
            sentence_splitter(split_sentences),
            sentences,
            lambda pieces: translate_nbest(
                model, tokenizer, pieces, options, batch_size, device, generate_kwargs, max_tokens=max_tokens
            ),
        )
    check_batching(batch_size, max_tokens)
    if tokenizer.pad_token_id is None:
        raise ValueError(
            "The tokenizer has no pad token: set tokenizer.pad_token (e.g. '<pad>') before translating."
        )
    options = options or DecodingOptions()
    check_nbest(nbest, options.num_beams, options.do_sample)
    generate_kwargs = dict(generate_kwargs or {})
    refuse_non_finite({**asdict(options), **generate_kwargs})
    ct2 = isinstance(model, CTranslate2Model)
    check_tokenizer_matches_config(tokenizer, model.config)  # both backends: a CTranslate2Model has one too
    if ct2 and alignments and not model.attention_aligns:
        raise ValueError(
            "--alignment_file: this CTranslate2 export's attention is CTranslate2's default (the first head of the "
            "last layer), not the heads averaged that alignments use: export it again with hf-vanilla-export-ct2, "
            "or use --backend transformers."
        )
    if ct2:
        unknown = sorted(set(generate_kwargs) - {"max_new_tokens"})
        if unknown:
            raise ValueError(
                f"The ctranslate2 backend takes no generate() argument other than max_new_tokens: {unknown}."
            )
    else:  # torch, imported here: the CTranslate2 backend translates without it
        import torch

        from hf_vanilla.inference.decoding import generate_hypotheses, hard_alignments
        from hf_vanilla.inference.loading import resolve_device

        device = resolve_device(device)
        model.to(device)
        model.eval()

    results: list[list[Hypothesis]] = [[] for _ in sentences]
    todo = [i for i, sentence in enumerate(sentences) if sentence.strip()]
    if len(todo) < len(sentences):
        logger.info("%d blank input line(s) give blank output lines", len(sentences) - len(todo))
    if not todo:
        return results
    ids = dict(zip(todo, tokenizer([sentences[i] for i in todo])["input_ids"], strict=True))
    lengths = {i: len(row) for i, row in ids.items()}
    for i in todo:
        check_input_length(model, tokenizer, lengths[i], i)
    prefix_ids = target_prefix_ids(model, tokenizer, sentences, prefixes, lengths, generate_kwargs)
    order = sorted(todo, key=lambda i: lengths[i], reverse=True)
    groups = sorted({len(prefix) for prefix in prefix_ids.values()})
    done = 0
    with _seeded(model, device, options.seed):
        for indices in (
            batch
            for group in groups
            for batch in _batches(
                [i for i in order if len(prefix_ids[i]) == group], lengths, batch_size, max_tokens
            )
        ):
            try:
                if ct2:
                    outputs = model.generate_hypotheses(
                        tokenizer,
                        [ids[i] for i in indices],
                        options,
                        nbest,
                        generate_kwargs.get("max_new_tokens"),
                        [prefix_ids[i] for i in indices] if prefixes is not None else None,
                    )
                else:
                    batch = tokenizer.pad({"input_ids": [ids[i] for i in indices]}, return_tensors="pt").to(
                        device
                    )
                    prefix = len(prefix_ids[indices[0]])
                    kwargs = _with_prefix(
                        _within_the_bound(generate_kwargs, model, lengths[indices[0]]), model, prefix
                    )
                    if prefix:
                        start = model.config.decoder_start_token_id
                        kwargs["decoder_input_ids"] = torch.tensor(
                            [[start, *prefix_ids[i]] for i in indices], device=device
                        )
                    outputs = generate_hypotheses(
                        model, batch["input_ids"], batch["attention_mask"], options, nbest, **kwargs
                    )
            except (MemoryError, RuntimeError) as error:  # torch's OutOfMemoryError is a RuntimeError
                if not _out_of_memory(error):
                    raise
                raise TranslationOutOfMemoryError(
                    len(indices), lengths[indices[0]], options.num_beams
                ) from error
            kept = {}
            for i, hypotheses in zip(indices, outputs, strict=True):
                bound = _length_bound(model, generate_kwargs, lengths[i]) if prefix_ids[i] else None
                kept[i] = [row if bound is None else row[: bound - 1] for row, _ in hypotheses]
                texts = tokenizer.batch_decode(kept[i], skip_special_tokens=True)
                results[i] = [
                    Hypothesis(one_line(text), score)
                    for text, (_, score) in zip(texts, hypotheses, strict=True)
                ]
            if alignments:
                best = [kept[i][0] for i in indices]
                special = set(tokenizer.all_special_ids)
                if ct2:
                    aligned = model.hard_alignments(tokenizer, [ids[i] for i in indices], best, special)
                else:
                    aligned = hard_alignments(
                        model, batch["input_ids"], batch["attention_mask"], best, special
                    )
                for i, alignment in zip(indices, aligned, strict=True):
                    results[i][0].alignment = alignment
            done += len(indices)
            logger.debug("translated %d/%d sentences", done, len(order))
    return results


def translate(
    model: Any,
    tokenizer: Any,
    sentences: Sequence[str] | str,
    options: DecodingOptions | None = None,
    batch_size: int = 64,
    device: str | torch.device | None = None,
    generate_kwargs: dict[str, Any] | None = None,
    max_tokens: int = 0,
    prefixes: Sequence[str] | str | None = None,
    split_sentences: str | None = None,
) -> list[str] | str:
    """Translate ``sentences`` in batches and return the translations in input order; a bare string is one
    sentence and gives one string.

    Sentences are sorted by token length so each batch holds similar lengths (less padding), then the
    original order is restored. Empty or blank lines are not sent to the model and give empty lines.
    The model is moved to ``device`` (default: CUDA if available) and put in eval mode; a
    :class:`CTranslate2Model` runs where it was loaded.
    ``generate_kwargs`` go to ``model.generate`` (e.g. ``max_new_tokens``, which caps the output
    further than the per-sentence input length + 50 bound, or ``max_length_offset``, which changes
    the 50). A tokenizer that does not belong to the model (another size or special-token ids) raises
    ``ValueError`` before anything is translated, as does a sentence longer than the model's longest
    input (:class:`InputTooLongError`). ``prefixes``: target prefixes, one per sentence;
    ``split_sentences``: a language code to split each line into sentences (see :func:`translate_nbest`).
    """
    if isinstance(sentences, str):
        return translate(
            model, tokenizer, [sentences], options, batch_size, device, generate_kwargs, max_tokens,
            None if prefixes is None else [prefixes], split_sentences,
        )[0]  # fmt: skip
    hypotheses = translate_nbest(
        model, tokenizer, sentences, options, batch_size, device, generate_kwargs,
        max_tokens=max_tokens, prefixes=prefixes, split_sentences=split_sentences,
    )  # fmt: skip
    return [best[0].text if best else "" for best in hypotheses]


def format_nbest(index: int, hypotheses: list[Hypothesis]) -> str:
    """The n-best lines of input line ``index`` (0-based), one per hypothesis, best first:
    ``index<TAB>score<TAB>translation`` (fairseq's H lines without the ``H-``); a blank input line gives
    one line ``index<TAB><TAB>`` (no score, no translation)."""
    if not hypotheses:
        return f"{index}\t\t\n"
    return "".join(f"{index}\t{hypothesis.score:.4f}\t{hypothesis.text}\n" for hypothesis in hypotheses)


def format_alignment(pairs: Sequence[tuple[int, int]] | None) -> str:
    """A hard alignment as one line of ``SRC-TGT`` token index pairs (fairseq's and fast_align's format;
    ``""`` for none): the alignment file's lines and the :class:`Translator`'s alignment column."""
    return " ".join(f"{source}-{target}" for source, target in pairs or ())
