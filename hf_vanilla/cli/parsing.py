"""The commands' option parser: dataclass fields become ``--options`` exactly as transformers'
``HfArgumentParser`` makes them, without importing transformers (or torch), so that ``--help`` answers at
once.

:class:`DataclassArgumentParser` follows ``HfArgumentParser._parse_dataclass_field`` of transformers 5
(``--name`` and ``--name-with-dashes``, ``Optional[X]`` as ``X``, ``Literal`` and ``Enum`` as choices,
``bool`` as ``--flag [true|false]`` plus ``--no_flag`` when the default is true, ``list[X]`` as ``nargs="+"``,
a field without default as a required option). tests/cli/test_help.py builds both parsers for every
command and compares their help text and their options, so the two cannot drift apart.

``hf-vanilla-train``'s options include the ~100 of transformers' ``Seq2SeqTrainingArguments``, which cannot
be read without importing torch: the first ``hf-vanilla-train`` that imports transformers (a run, or a
``--help`` before any) writes a description of the options transformers' parser makes for them
(:func:`describe_training_arguments`) into the user's cache (:func:`training_arguments_cache`, one file per
transformers version), and every later ``--help`` adds them from there (checked by the same test).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import tempfile
import types
from collections.abc import Callable, Iterable, Sequence
from enum import Enum
from importlib.metadata import version
from inspect import isclass
from pathlib import Path
from typing import Any, Literal, Union, get_type_hints

__all__ = [
    "DataclassArgumentParser",
    "describe_training_arguments",
    "remember_training_arguments",
    "string_to_bool",
    "training_arguments_cache",
]

logger = logging.getLogger(__name__)


def string_to_bool(value: str | bool) -> bool:
    """``--flag yes|no|true|false|t|f|y|n|1|0`` (any case), as ``HfArgumentParser`` reads a bool."""
    if isinstance(value, bool):
        return value
    if value.lower() in ("yes", "true", "t", "y", "1"):
        return True
    if value.lower() in ("no", "false", "f", "n", "0"):
        return False
    raise argparse.ArgumentTypeError(
        f"Truthy value expected: got {value} but expected one of yes/no, true/false, t/f, y/n, 1/0 "
        "(case insensitive)."
    )


def _choice_type(choices: Sequence[Any]) -> Callable[[str], Any]:
    by_text = {str(choice): choice for choice in choices}
    return lambda text: by_text.get(text, text)


class DataclassArgumentParser(argparse.ArgumentParser):
    """An ``argparse`` parser whose options are the fields of ``dataclass_types``, made as
    ``HfArgumentParser`` makes them; :meth:`parse_args_into_dataclasses` returns one instance of each."""

    def __init__(self, dataclass_types: type | Iterable[type], **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(**kwargs)
        self.dataclass_types = (
            [dataclass_types] if dataclasses.is_dataclass(dataclass_types) else list(dataclass_types)
        )
        for dtype in self.dataclass_types:
            hints = get_type_hints(dtype)
            for item in dataclasses.fields(dtype):
                if item.init:
                    self.add_field(item, hints[item.name])

    def add_field(self, item: dataclasses.Field, annotation: Any) -> None:
        """Add the option(s) of one dataclass field of type ``annotation`` (resolved)."""
        options = [f"--{item.name}"] + ([f"--{item.name.replace('_', '-')}"] if "_" in item.name else [])
        kwargs = dict(item.metadata)
        aliases = kwargs.pop("aliases", [])
        aliases = [aliases] if isinstance(aliases, str) else list(aliases)
        kind = annotation
        origin = getattr(kind, "__origin__", kind)
        if origin is Union or isinstance(origin, types.UnionType):
            args = kind.__args__
            if str not in args and (len(args) != 2 or type(None) not in args):
                raise ValueError(f"Field {item.name!r}: only Optional[X] (or a union with str) is supported.")
            if type(None) not in args:
                kind = args[0] if args[1] is str else args[1]
            elif bool not in args:
                kind = args[0] if isinstance(None, args[1]) else args[1]
            origin = getattr(kind, "__origin__", kind)
        is_bool = kind is bool or kind == bool | None
        bool_kwargs = dict(kwargs)
        if origin is Literal or (isinstance(kind, type) and issubclass(kind, Enum)):
            kwargs["choices"] = kind.__args__ if origin is Literal else [member.value for member in kind]
            kwargs["type"] = _choice_type(kwargs["choices"])
            if item.default is not dataclasses.MISSING:
                kwargs["default"] = item.default
            else:
                kwargs["required"] = True
        elif is_bool:
            kwargs["type"] = string_to_bool
            if kind is bool or (item.default is not None and item.default is not dataclasses.MISSING):
                kwargs["default"] = False if item.default is dataclasses.MISSING else item.default
                kwargs["nargs"] = "?"
                kwargs["const"] = True
        elif isclass(origin) and issubclass(origin, list):
            kwargs["type"] = kind.__args__[0]
            kwargs["nargs"] = "+"
            if item.default_factory is not dataclasses.MISSING:
                kwargs["default"] = item.default_factory()
            elif item.default is dataclasses.MISSING:
                kwargs["required"] = True
        else:
            kwargs["type"] = kind
            if item.default is not dataclasses.MISSING:
                kwargs["default"] = item.default
            elif item.default_factory is not dataclasses.MISSING:
                kwargs["default"] = item.default_factory()
            else:
                kwargs["required"] = True
        self.add_argument(*options, *aliases, **kwargs)
        if item.default is True and is_bool:
            no_name = f"no_{item.name}"
            self.add_argument(
                f"--{no_name}",
                f"--{no_name.replace('_', '-')}",
                action="store_false",
                dest=item.name,
                **{**bool_kwargs, "default": False},
            )

    def add_described(self, description: Sequence[dict[str, Any]]) -> None:
        """Add options from a description written by :func:`describe_training_arguments` (for ``--help``:
        they convert no values)."""
        for action in description:
            kwargs = {key: value for key, value in action.items() if key not in ("option_strings", "action")}
            self.add_argument(*action["option_strings"], action=action["action"], **kwargs)

    def parse_args_into_dataclasses(self, args: Sequence[str]) -> tuple[Any, ...]:
        """Parse ``args`` into one instance of each dataclass; an argument none of them takes is refused
        (``ValueError``, as ``HfArgumentParser`` does)."""
        namespace, remaining = self.parse_known_args(list(args))
        if remaining:
            raise ValueError(f"Unknown arguments {remaining}: see --help for this command's options.")
        values = vars(namespace)
        return tuple(
            dtype(**{item.name: values[item.name] for item in dataclasses.fields(dtype) if item.init})
            for dtype in self.dataclass_types
        )


def training_arguments_cache() -> Path:
    """Where the description of transformers' training options is kept for the installed transformers:
    ``$XDG_CACHE_HOME/hf_vanilla`` (``~/.cache/hf_vanilla``), one file per transformers version."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hf_vanilla"
    return root / f"seq2seq_training_arguments-{version('transformers')}.json"


def remember_training_arguments() -> None:
    """Write :func:`describe_training_arguments` to :func:`training_arguments_cache` if it is not there
    (imports transformers and torch). A cache that cannot be written only keeps ``--help`` slow."""
    path = training_arguments_cache()
    if path.is_file():
        return
    text = json.dumps(describe_training_arguments(), indent=1, ensure_ascii=False) + "\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, delete=False) as handle:
            handle.write(text)
        os.replace(handle.name, path)
    except OSError as err:
        logger.debug("Not keeping the training options' description in %s: %s", path, err)


def describe_training_arguments() -> dict[str, Any]:
    """The options transformers' ``HfArgumentParser`` makes for ``Seq2SeqTrainingArguments``, as
    :meth:`DataclassArgumentParser.add_described` reads them, with the transformers version they describe
    (imports transformers and torch)."""
    from transformers import HfArgumentParser, Seq2SeqTrainingArguments

    actions = []
    for action in HfArgumentParser(Seq2SeqTrainingArguments)._actions:  # argparse lists them nowhere else
        if isinstance(action, argparse._HelpAction):
            continue
        entry: dict[str, Any] = {
            "option_strings": action.option_strings,
            "action": "store_false" if isinstance(action, argparse._StoreFalseAction) else "store",
            "dest": action.dest,
            "default": action.default,
            "required": action.required,
            "help": action.help,
        }
        if entry["action"] == "store":
            choices = None if action.choices is None else list(action.choices)
            entry |= {"nargs": action.nargs, "const": action.const, "choices": choices}
        actions.append(entry)
    return {"transformers": version("transformers"), "actions": json.loads(json.dumps(actions, default=str))}
