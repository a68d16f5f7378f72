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

from hf_vanilla.inference.loading import load_model_and_tokenizer
from hf_vanilla.inference.options import DecodingOptions, InferenceModelArguments
from hf_vanilla.inference.translation import translate

__all__ = ["Translator"]


class Translator:
    """Translate batches of texts with a model loaded once.

    ``model_name_or_path`` and ``model_options`` (``device``, ``dtype``, ``backend``, ``batch_size``,
    ``max_tokens``, ``quantization``, ``tokenizer_name_or_path``, ``trust_remote_code``) are
    ``hf-vanilla-translate``'s options of the same names, loaded through the same checks (a CTranslate2
    export too); ``decoding`` its decoding options (default: the paper's, §6.1), ``max_length`` its
    ``--max_length``. Called with a list of texts, it returns their translations; called with a batch
    (a dict of columns, as Ray Data's default batch format; a pandas DataFrame; a pyarrow Table), it
    returns a batch of the same kind with the column ``output_column`` added, the translation of each
    row's ``column``. A blank text gives an empty translation, as a blank line gives a blank line.
    """

    def __init__(
        self,
        model_name_or_path: str,
        *,
        decoding: DecodingOptions | None = None,
        column: str = "text",
        output_column: str = "translation",
        max_length: int | None = None,
        **model_options: Any,
    ) -> None:
        self.args = InferenceModelArguments(model_name_or_path=model_name_or_path, **model_options)
        self.decoding = decoding or DecodingOptions()
        self.column, self.output_column = column, output_column
        if max_length is not None and max_length < 1:
            raise ValueError(f"max_length must be a positive number of tokens, got {max_length}.")
        self.generate_kwargs = {} if max_length is None else {"max_new_tokens": max_length}
        self.model, self.tokenizer = load_model_and_tokenizer(self.args, allow_ctranslate2=True)

    def translate(self, texts: Sequence[str]) -> list[str]:
        """The translations of ``texts``, in their order."""
        for row, text in enumerate(texts):
            if not isinstance(text, str):
                raise ValueError(
                    f"row {row} of the batch: column {self.column!r} holds {text!r}, not text; give a string "
                    "('' for no sentence)."
                )
        return translate(
            self.model, self.tokenizer, list(texts), self.decoding, self.args.batch_size, self.args.device,
            self.generate_kwargs, self.args.max_tokens,
        )  # fmt: skip

    def __call__(self, batch: Any) -> Any:
        if isinstance(batch, (list, tuple)):
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
        if self.output_column in columns:
            raise ValueError(
                f"The batch already has a column {self.output_column!r}: name another with "
                "Translator(..., output_column=NAME)."
            )
        if isinstance(batch, Mapping):
            import numpy as np

            values = batch[self.column]
            texts = self.translate(values.tolist() if isinstance(values, np.ndarray) else list(values))
            return {**batch, self.output_column: np.array(texts, dtype=object)}
        if kind == "pandas":
            return batch.assign(**{self.output_column: self.translate(batch[self.column].tolist())})
        import pyarrow as pa

        texts = self.translate(batch.column(self.column).to_pylist())
        return batch.append_column(self.output_column, pa.array(texts, pa.string()))
