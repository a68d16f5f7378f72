"""The command-line tools, and what all of them share: how errors and interrupts end, and ``--overwrite``.

``pip install`` installs each as an ``hf-vanilla-*`` command (``[project.scripts]`` in pyproject.toml);
``scripts/*.py`` in a source checkout are thin wrappers of the same ``main`` functions.

| command | module |
|---|---|
| ``hf-vanilla-train-tokenizer`` | :mod:`hf_vanilla.cli.train_tokenizer` |
| ``hf-vanilla-train`` | :mod:`hf_vanilla.cli.train` |
| ``hf-vanilla-average`` | :mod:`hf_vanilla.cli.average_checkpoints` |
| ``hf-vanilla-translate`` | :mod:`hf_vanilla.cli.translate` |
| ``hf-vanilla-evaluate`` | :mod:`hf_vanilla.cli.evaluate_bleu` |
| ``hf-vanilla-plot`` | :mod:`hf_vanilla.cli.plot` |
| ``hf-vanilla-publish`` | :mod:`hf_vanilla.cli.publish` |
| ``hf-vanilla-convert`` | :mod:`hf_vanilla.cli.convert` |
| ``hf-vanilla-export-ct2`` | :mod:`hf_vanilla.cli.export_ctranslate2` |
| ``hf-vanilla-export-onnx`` | :mod:`hf_vanilla.cli.export_onnx` |
| ``hf-vanilla-demo`` | :mod:`hf_vanilla.cli.demo` |
| ``hf-vanilla-app`` | :mod:`hf_vanilla.cli.app` (the web demo) |
| ``hf-vanilla-serve`` | :mod:`hf_vanilla.cli.serve` (translation over HTTP) |

Each command (and ``python -m hf_vanilla.demo``) has a ``main(argv)`` that returns an exit status
through :func:`run_cli`:

* A user error — a missing, damaged or mismatched file, a flag that cannot be honoured, an output
  that exists without ``--overwrite`` — ends in one line on stderr, ``error: <what and how to fix
  it>``, and exit status 1, without a traceback. ``--debug`` (``hf-vanilla-train``: ``--log_level
  debug``) lets the exception propagate with its traceback. Anything else (a bug) propagates as it is.
* A number option given ``nan`` or ``inf`` is refused in one line naming it
  (:func:`refuse_non_finite`, run by :func:`parse_arguments` and by the commands with their own parser):
  argparse's ``float`` accepts both, and they decode or train into garbage without an error. So is an
  integer beyond 64 bits, which argparse's ``int`` accepts and torch cannot hold.
* Ctrl-C ends in ``interrupted`` and status 130, SIGTERM (``kill``, a scheduler) in ``terminated``
  and status 143, after the same clean-up: temporary files and staged folders are removed and every
  existing output stays as it was (training first saves a checkpoint; see
  :class:`hf_vanilla.training.resilience.SaveOnSignalCallback`, which handles both signals while it trains).
* Nothing that exists is replaced unless ``--overwrite`` is given
  (:func:`hf_vanilla.io.atomic.refuse_to_replace`), and outputs are written under a temporary
  name and renamed into place when complete, so a refused or failed run leaves them as they were.
  Without ``--overwrite`` that rename does not replace an output that appeared while the command ran
  (:class:`hf_vanilla.io.atomic.OutputAppearedError`).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from hf_vanilla.io.atomic import forget_new_outputs
from hf_vanilla.io.numbers import LARGEST_INT, is_non_finite

logger = logging.getLogger(__name__)


__all__ = [
    "DEBUG_EPILOG",
    "Terminated",
    "add_debug_flag",
    "configure_logging",
    "parse_arguments",
    "quiet_onnx_exporter",
    "quiet_unused_torchao",
    "refuse_non_finite",
    "run_cli",
    "user_errors",
]

#: Epilog of every command's ``--help`` (``--debug`` is taken out of the arguments by :func:`run_cli`).
DEBUG_EPILOG = "An error ends in one line; --debug shows its traceback."


def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that describe bad input (their message says what to do), not a bug in hf_vanilla.

    ``ValueError`` covers ``UnicodeDecodeError``, ``json.JSONDecodeError`` and the checkpoint checks;
    ``OSError`` missing, existing or unreadable files and Hub download failures; huggingface_hub's
    ``HfHubHTTPError`` a Hub refusal and its ``StrictDataclassError`` a config field of the wrong type or
    choice (transformers' ``@strict`` config validation). Those two are named only once huggingface_hub is
    imported (nothing can raise them before), so that ``--help`` does not import it.
    """
    errors: tuple[type[BaseException], ...] = (ValueError, OSError, ImportError)
    hub_errors = sys.modules.get("huggingface_hub.errors")
    if hub_errors is not None:
        errors += (hub_errors.HfHubHTTPError, hub_errors.StrictDataclassError)
    return errors


class Terminated(KeyboardInterrupt):
    """Raised in the main thread on SIGTERM while :func:`run_cli` runs a command, so that the ``finally``
    blocks and context managers that remove temporary files run, as they do on Ctrl-C."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated(signal.Signals(signum).name)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """``--help`` of every command: the module docstring as written, and each option's default."""


def refuse_non_finite(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """Raise ``ValueError`` naming the first option of ``parser`` (an ``argparse`` parser) that ``argv`` gives a non-finite number (``nan``, ``inf``,
    ``-inf``) or an integer beyond 64 bits, before any of the command's dataclasses is built. Defaults are the program's own and
    are not checked."""
    namespace, _ = parser.parse_known_args(list(argv))
    for name, value in vars(namespace).items():
        if value is parser.get_default(name):
            continue
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if is_non_finite(item):
                raise ValueError(
                    f"--{name} {item}: not a finite number. Give an ordinary number (nan and inf are refused: "
                    "they decode or train into garbage)."
                )
            if isinstance(item, int) and not isinstance(item, bool) and abs(item) > LARGEST_INT:
                raise ValueError(
                    f"--{name} {item}: too large a number (beyond 64 bits, which torch and the libraries below it "
                    "hold). Give a smaller one."
                )


def dataclass_parser(types: Any, **kwargs: Any) -> argparse.ArgumentParser:
    """transformers' ``HfArgumentParser`` of the dataclasses ``types`` (one or a tuple), every command's
    parser. Importing transformers is what it costs; the commands' own options import no torch."""
    from transformers import HfArgumentParser

    return HfArgumentParser(types, **kwargs)


def parse_into_dataclasses(parser: Any, argv: Sequence[str]) -> tuple[Any, ...]:
    """One instance of each dataclass of the :func:`dataclass_parser` ``parser``, from ``argv``; an argument
    none of them takes is refused (``ValueError``, naming it)."""
    *parsed, remaining = parser.parse_args_into_dataclasses(
        args=list(argv), return_remaining_strings=True, look_for_args_file=False
    )
    if remaining:
        raise ValueError(f"Unknown arguments {remaining}: see --help for this command's options.")
    return tuple(parsed[: len(parser.dataclass_types)])


def parse_arguments(
    argv: Sequence[str], types: Any, description: str | None
) -> tuple[argparse.ArgumentParser, tuple[Any, ...]]:
    """Parse ``argv`` into the dataclasses ``types`` (one or a tuple) with :func:`dataclass_parser` and the
    commands' ``--debug`` epilog, refusing non-finite numbers (:func:`refuse_non_finite`), then log INFO
    and above to stderr. Returns the parser (for ``parser.error``) and the parsed dataclasses."""
    parser = dataclass_parser(
        types, description=description, epilog=DEBUG_EPILOG, formatter_class=HelpFormatter
    )
    add_debug_flag(parser)
    refuse_non_finite(parser, argv)
    parsed = parse_into_dataclasses(parser, argv)
    configure_logging(
        torchao=any(str(getattr(args, "quantization", None)).startswith("torchao") for args in parsed)
    )
    return parser, parsed


def add_debug_flag(parser: argparse.ArgumentParser) -> None:
    """List ``--debug`` in ``parser``'s ``--help``; :func:`run_cli` takes it out of the arguments before
    the parser sees them, so it never reaches the parsed options."""
    parser.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="On an error, show its traceback rather than one line; also log other libraries' INFO messages.",
    )


def configure_logging(torchao: bool = False) -> None:
    """Log hf_vanilla's INFO and everyone's warnings to stderr; other libraries' INFO (the ONNX
    exporter's hundreds of lines, for one) only with ``--debug``. Unless the command quantizes with
    torchao (``torchao``) or ``--debug`` is given, torchao's import messages are dropped
    (:func:`quiet_unused_torchao`)."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    logging.getLogger("hf_vanilla").setLevel(logging.INFO)
    if _debugging:
        logging.getLogger().setLevel(logging.INFO)
    if not torchao:
        quiet_unused_torchao()


class _TorchaoEnums(logging.Filter):
    """Drops torch's warning that torchao registers its Enum types the deprecated way."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not any(str(getattr(arg, "__module__", "")).startswith("torchao") for arg in args)


_TORCHAO_ENUMS = _TorchaoEnums()


def quiet_unused_torchao() -> None:
    """Keep torchao's import messages out of the output of a command that does not use torchao; call it
    before the model is loaded. transformers imports torchao whenever it is installed
    (``transformers.quantizers``, at every model load); torchao then warns that its optional compiled
    kernels do not load (``Failed to load .../torchao/_C_*.so``: built for another Python or torch) or that
    Triton is missing, and torch (``torch.utils._pytree``, through torch's own log handler) that torchao
    registers its Enum types the deprecated way. torchao's errors still show, and with ``--debug`` (train:
    ``--log_level debug``) everything."""
    if _debugging:
        return
    logging.getLogger("torchao").setLevel(logging.ERROR)
    logging.getLogger("torch.utils._pytree").addFilter(_TORCHAO_ENUMS)  # a filter is added once


class _TorchvisionSkipped(logging.Filter):
    """Drops the ONNX exporter's notes that torchvision's operators are skipped because torchvision is
    not installed (detection operators: ``nms``, ``roi_align``, ...; this model has none)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("torchvision is not installed")


_TORCHVISION_SKIPPED = _TorchvisionSkipped()


def quiet_onnx_exporter() -> None:
    """Keep torch's ONNX exporter's messages that do not concern this model out of ``hf-vanilla-export-onnx``'s
    output: four lines per graph saying that torchvision's detection operators are skipped, and the
    ``FutureWarning`` torch's own pytree code raises about ``LeafSpec`` (torch calling its deprecated API,
    nothing the user wrote). Everything else still shows, and with ``--debug`` these too."""
    if _debugging:
        return
    logging.getLogger("torch.onnx._internal.exporter._registration").addFilter(_TORCHVISION_SKIPPED)
    warnings.filterwarnings(
        "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
    )


#: Whether the running command was given ``--debug`` (set by :func:`run_cli`).
_debugging = False


def _say(line: str) -> None:
    """Write ``line`` to stderr in one write, so the lines of parallel processes sharing a log never interleave."""
    sys.stderr.flush()
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _wants_traceback(argv: Sequence[str]) -> bool:
    if "--debug" in argv:
        return True
    pairs = itertools.pairwise(argv)
    return "--log_level=debug" in argv or any(a == "--log_level" and b == "debug" for a, b in pairs)


def run_cli(
    body: Callable[[list[str]], object],
    argv: Sequence[str] | None = None,
    *,
    debug_flag: bool = True,
    catch_sigterm: bool = True,
) -> int:
    """Run a command's ``body(argv)`` and turn user errors and Ctrl-C into one line and an exit status.

    With ``debug_flag`` a ``--debug`` argument is taken out of ``argv`` before ``body`` parses it
    (``train.py`` passes ``False``: its ``--debug`` belongs to ``TrainingArguments``). Returns 0 on
    success, 1 after a user error, 130 after Ctrl-C, 143 after SIGTERM (raised as :class:`Terminated`
    in the main thread, so clean-up runs); ``SystemExit`` (``--help``, a usage error, a
    training run stopped by a signal) passes through. ``train.py`` also passes ``catch_sigterm=False``:
    :class:`~hf_vanilla.training.resilience.SaveOnSignalCallback` handles its signals, and a second SIGTERM
    kills it at once.
    """
    global _debugging
    args = list(sys.argv[1:] if argv is None else argv)
    debug = _debugging = _wants_traceback(args)
    if debug_flag:
        args = [a for a in args if a != "--debug"]
    catching = catch_sigterm and threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if catching else None
    try:
        body(args)
    except Terminated:
        if debug:
            raise
        _say("terminated")
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        if debug:
            raise
        _say("interrupted")
        return 130
    except Exception as err:
        if debug or not isinstance(err, user_errors()):
            raise
        _say("error: " + " ".join(str(err).split()))  # one line, also for multi-line messages
        return 1
    finally:
        forget_new_outputs()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return 0
