"""A translator object for batch engines: it loads the model once and translates each batch it is called
with, as Ray Data's ``map_batches`` calls a class (one object per worker), or any loop over batches.

>>> import ray
>>> from hf_vanilla.inference.translator import Translator
>>> ds = ray.data.read_text("corpus.en", drop_empty_lines=False)
>>> ds = ds.map_batches(Translator, fn_constructor_kwargs={"model_name_or_path": "runs/base"},
...                     batch_size=1024, compute=ray.data.ActorPoolStrategy(size=2))

docs/scaling.md has the program for a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hf_vanilla.inference.loading import load_for_translation
from hf_vanilla.inference.options import DecodingOptions, Hypothesis, InferenceModelArguments
from hf_vanilla.inference.translation import (
    TargetPrefixError,
    format_alignment,
    sentence_splitter,
    translate_nbest,
)

__all__ = ["Translator"]


class Translator:
    """Translate batches of texts with a model loaded once.

    ``model_name_or_path`` and ``model_options`` (``device``, ``dtype``, ``backend``, ``batch_size``,
    ``max_tokens``, ``quantization``, ``tokenizer_name_or_path``, ``trust_remote_code``, ``ensemble``) are
    ``hf-vanilla-translate``'s options of the same names, loaded through the same checks (a CTranslate2
    export too; ``ensemble="runs/b,runs/c"`` decodes with the ensemble); ``decoding`` its decoding options
    (default: the paper's, §6.1), ``max_length`` its ``--max_length``, ``split_sentences`` its
    ``--split_sentences`` (a language code). Called with a list of texts, it returns their translations;
    called with a batch (a dict of columns, as Ray Data's default batch format; a pandas DataFrame; a
    pyarrow Table), it returns a batch of the same kind with the column ``output_column`` added, the
    translation of each row's ``column``. ``prefix_column`` names a column of target prefixes (as
    ``--target_prefix_file``'s lines; blank: none); ``alignment_column`` adds a column with each
    translation's hard alignment (as ``--alignment_file``'s lines). A blank text gives an empty
    translation, as a blank line gives a blank line.
    """

    def __init__(
        self,
        model_name_or_path: str,
        *,
        decoding: DecodingOptions | None = None,
        column: str = "text",
        output_column: str = "translation",
        prefix_column: str | None = None,
        alignment_column: str | None = None,
        split_sentences: str | None = None,
        max_length: int | None = None,
        **model_options: Any,
    ) -> None:
        self.args = InferenceModelArguments(model_name_or_path=model_name_or_path, **model_options)
        self.decoding = decoding or DecodingOptions()
        self.column, self.output_column = column, output_column
        self.prefix_column, self.alignment_column = prefix_column, alignment_column
        self.split_sentences = split_sentences
        named = [
            name for name in (column, output_column, prefix_column, alignment_column) if name is not None
        ]
        if len(set(named)) < len(named):
            raise ValueError(f"Translator's columns {named} repeat a name: give each column its own.")
        if max_length is not None and max_length < 1:
            raise ValueError(f"max_length must be a positive number of tokens, got {max_length}.")
        if split_sentences is not None:  # before loading the model: pysbd installed, the language known
            joined = [name for name, value in (("prefix_column", prefix_column), ("alignment_column",
                      alignment_column)) if value is not None]  # fmt: skip
            if joined:
                raise ValueError(
                    f"split_sentences joins one translation per sentence back into its text: leave out "
                    f"{', '.join(joined)}."
                )
            sentence_splitter(split_sentences)
        self.generate_kwargs = {} if max_length is None else {"max_new_tokens": max_length}
        self.model, self.tokenizer = load_for_translation(self.args)

    def hypotheses(
        self, texts: Sequence[str], prefixes: Sequence[str] | None = None, alignments: bool = False
    ) -> list[Hypothesis]:
        """The translation of each of ``texts``, in their order, starting with its prefix (``prefixes``,
        one per text; blank: none) and with its hard alignment where ``alignments``."""
        for name, values in (("texts", texts), ("prefixes", prefixes or ())):
            for row, text in enumerate(values):
                if not isinstance(text, str):
                    column = self.column if name == "texts" else self.prefix_column
                    raise ValueError(
                        f"row {row} of the batch: column {column!r} holds {text!r}, not text; give a string "
                        "('' for none)."
                    )
        if prefixes is not None and len(prefixes) != len(texts):
            raise ValueError(
                f"{len(prefixes)} prefixes for {len(texts)} texts: give one per text ('' for none)."
            )
        try:
            found = translate_nbest(
                self.model, self.tokenizer, list(texts), self.decoding, self.args.batch_size, self.args.device,
                self.generate_kwargs, None, self.args.max_tokens, None if prefixes is None else list(prefixes),
                alignments, self.split_sentences,
            )  # fmt: skip
        except TargetPrefixError as error:
            raise ValueError(f"row {error.index} of the batch: its target prefix: {error.reason}") from None
        return [best[0] if best else Hypothesis("", alignment=[] if alignments else None) for best in found]

    def translate(self, texts: Sequence[str], prefixes: Sequence[str] | None = None) -> list[str]:
        """The translations of ``texts``, in their order (``prefixes``: one target prefix per text)."""
        return [hypothesis.text for hypothesis in self.hypotheses(texts, prefixes)]

    def __call__(self, batch: Any) -> Any:
        if isinstance(batch, (list, tuple)):
            named = [name for name in (self.prefix_column, self.alignment_column) if name is not None]
            if named:
                raise ValueError(
                    f"A list of texts has no columns for {', '.join(map(repr, named))}: pass a dict of columns, "
                    "a pandas DataFrame or a pyarrow Table, or call translate(texts, prefixes)."
                )
            return self.translate(batch)
        kind = type(batch).__module__.split(".")[0]
        if isinstance(batch, Mapping):  # Ray Data's default: a dict of NumPy arrays
            columns = list(batch)
        elif kind == "pandas":
            columns = list(batch.columns)
        elif kind == "pyarrow":
            columns = list(batch.column_names)
        else:
            raise TypeError(
                f"Translator takes a list of texts, a dict of columns, a pandas DataFrame or a pyarrow Table, "
                f"not a {type(batch).__name__}."
            )
        if self.column not in columns:
            raise ValueError(
                f"The batch has no column {self.column!r} (it has {columns}): name the text column with "
                "Translator(..., column=NAME)."
            )
        if self.prefix_column is not None and self.prefix_column not in columns:
            raise ValueError(
                f"The batch has no column {self.prefix_column!r} (it has {columns}): add the target prefixes "
                "there ('' for none), or leave out prefix_column."
            )
        for name in (self.output_column, self.alignment_column):
            if name is not None and name in columns:
                raise ValueError(
                    f"The batch already has a column {name!r}: name another with Translator(..., "
                    f"{'output_column' if name == self.output_column else 'alignment_column'}=NAME)."
                )
        texts, prefixes = (
            None if name is None else _column(batch, name, kind) for name in (self.column, self.prefix_column)
        )
        found = self.hypotheses(texts, prefixes, alignments=self.alignment_column is not None)
        added = {self.output_column: [hypothesis.text for hypothesis in found]}
        if self.alignment_column is not None:
            added[self.alignment_column] = [format_alignment(hypothesis.alignment) for hypothesis in found]
        if isinstance(batch, Mapping):
            import numpy as np

            return {**batch, **{name: np.array(values, dtype=object) for name, values in added.items()}}
        if kind == "pandas":
            return batch.assign(**added)
        import pyarrow as pa

        for name, values in added.items():
            batch = batch.append_column(name, pa.array(values, pa.string()))
        return batch


def _column(batch: Any, name: str, kind: str) -> list[Any]:
    """Column ``name`` of a dict of columns, a pandas DataFrame or a pyarrow Table, as a list."""
    if isinstance(batch, Mapping):
        values = batch[name]
        return values.tolist() if hasattr(values, "tolist") else list(values)
    if kind == "pandas":
        return batch[name].tolist()
    return batch.column(name).to_pylist()
