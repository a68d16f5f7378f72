"""Serve translations over HTTP (FastAPI + uvicorn; pip install 'hf_vanilla[serve]').

hf-vanilla-serve --model_dir runs/base                       # http://127.0.0.1:8000, docs at /docs
curl -s localhost:8000/translate -H 'Content-Type: application/json' -d '{"texts": ["Hello world."]}'

POST /translate takes {"texts": [...]} and any decoding option below (num_beams, length_penalty, ...;
the flags given here are the defaults), max_length, nbest, target_prefixes (one per text), alignments
and split_sentences. --ensemble B,C serves the ensemble of --model_dir, B and C. GET /health says the
server is up.
Concurrent requests are translated together (--max_batch_tokens, --max_wait_ms). With the environment
variable HF_VANILLA_API_KEY set, /translate asks for the header 'Authorization: Bearer <key>'.
SIGTERM stops taking requests, answers those already taken, and exits 0. See docs/serving.md.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from hf_vanilla.cli import parse_arguments, run_cli
from hf_vanilla.inference.options import DecodingOptions, InferenceModelArguments
from hf_vanilla.serving.options import API_KEY_VARIABLE, ServeOptions

__all__ = ["main"]

logger = logging.getLogger(__name__)


@dataclass
class ServeModelArguments(InferenceModelArguments):
    """The translate command's model options, the folder also named ``--model_dir``."""

    model_name_or_path: str = field(
        metadata={
            "help": "The model folder: a transformers one or a CTranslate2 export (hf-vanilla-export-ct2).",
            "aliases": ["--model_dir"],
        }
    )


def _run(argv: list[str]) -> None:
    _, (model_args, decoding, options) = parse_arguments(
        argv, (ServeModelArguments, DecodingOptions, ServeOptions), __doc__
    )
    try:  # after --help, before loading the model
        import uvicorn

        from hf_vanilla.serving.app import create_app
    except ImportError as err:
        raise ImportError(
            f"hf-vanilla-serve needs FastAPI and uvicorn ({err}): pip install 'hf_vanilla[serve]'."
        ) from err
    from hf_vanilla.inference.loading import load_for_translation
    from hf_vanilla.inference.translation import check_batching

    check_batching(model_args.batch_size, model_args.max_tokens)
    listener = _listen(options.host, options.port)  # before loading the model
    model, tokenizer = load_for_translation(model_args)
    api_key = os.environ.get(API_KEY_VARIABLE) or None
    if api_key is None and options.host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning(
            "listening on %s without an API key: set %s to ask for one.", options.host, API_KEY_VARIABLE
        )
    device = None if model_args.device == "auto" else model_args.device
    app = create_app(
        model, tokenizer, options, decoding, device, model_args.batch_size, model_args.max_tokens, api_key
    )
    server = _draining_server()(uvicorn.Config(app, host=options.host, port=options.port, log_level="info"))
    with listener:
        server.run(sockets=[listener])
    if server.interrupted:
        raise KeyboardInterrupt


def _listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host``:``port``, or an error naming the flags when it cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as err:
        raise OSError(
            f"--host {host} --port {port}: cannot listen there ({err.strerror or err}): give a free --port "
            "(or stop the program holding it), or another --host."
        ) from None


def _draining_server() -> type:
    """uvicorn's server class with the signal handling below (uvicorn imported only when serving)."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        """uvicorn's server, whose SIGTERM ends in exit status 0 once the requests taken are answered
        (uvicorn itself raises the signal again after its graceful shutdown); a Ctrl-C ends as
        ``interrupted`` (130) after the same shutdown, a second one at once."""

        interrupted = False

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self._stop) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

        def _stop(self, signum: int, frame: object) -> None:
            if signum == signal.SIGINT:
                self.force_exit = self.interrupted
                self.interrupted = True
            logger.info("%s: answering the requests taken, then stopping", signal.Signals(signum).name)
            self.should_exit = True

    return DrainingServer


def main(argv: list[str] | None = None) -> int:
    return run_cli(_run, argv)


if __name__ == "__main__":
    sys.exit(main())
