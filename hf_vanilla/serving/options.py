"""The translation server's options (address, limits, request batching), importable without torch or
FastAPI so that ``hf-vanilla-serve --help`` answers at once."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["API_KEY_VARIABLE", "ServeOptions"]

#: The environment variable holding the server's API key; unset or empty: no key is asked for.
API_KEY_VARIABLE = "HF_VANILLA_API_KEY"


@dataclass
class ServeOptions:
    """Where the server listens and how much it takes at once."""

    host: str = field(
        default="127.0.0.1",
        metadata={"help": "Address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface)."},
    )
    port: int = field(default=8000, metadata={"help": "Port to listen on."})
    max_batch_tokens: int = field(
        default=4096,
        metadata={
            "help": "Requests waiting together are translated as one batch of up to this many source tokens "
            "(a request with more goes alone; 1: one request at a time)."
        },
    )
    max_wait_ms: float = field(
        default=5.0,
        metadata={
            "help": "How long the first waiting request waits for others to join its batch (0: no waiting)."
        },
    )
    max_queue: int = field(
        default=64,
        metadata={"help": "At most this many requests wait; beyond it a request gets 503 with Retry-After."},
    )
    max_texts: int = field(default=64, metadata={"help": "At most this many texts per request."})
    max_body_bytes: int = field(
        default=1_000_000, metadata={"help": "At most this many bytes of request body (413 beyond it)."}
    )

    def __post_init__(self) -> None:
        for name in ("max_batch_tokens", "max_queue", "max_texts", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} {getattr(self, name)}: give a positive number.")
        if not 0 <= self.max_wait_ms <= 60_000:
            raise ValueError(
                f"--max_wait_ms {self.max_wait_ms}: give a number of milliseconds from 0 to 60000."
            )
        if not 0 <= self.port <= 65_535:
            raise ValueError(f"--port {self.port}: give a port from 0 to 65535.")
