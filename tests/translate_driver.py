"""Runs ``hf-vanilla-translate`` unchanged, for the multi-process tests (tests/inference/test_sharding.py),
launched as ``torchrun`` or ``accelerate launch`` ``tests/translate_driver.py <translate arguments>``.

``HF_VANILLA_STOP_RANK=R``: the process of ``RANK`` R, when it starts translating its second part (that
part's file is open under its temporary name), prints ``translate_driver: rank R stopped, pid P`` and
waits to be killed.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import hf_vanilla.inference.streaming as streaming
from hf_vanilla.cli.translate import main

_translate_stream, _translate_nbest = streaming.translate_stream, streaming.translate_nbest
_parts_started = []


def _counting_translate_stream(*args: Any, **kwargs: Any) -> int:
    _parts_started.append(kwargs.get("span"))
    return _translate_stream(*args, **kwargs)


def _stopping_translate_nbest(*args: Any, **kwargs: Any) -> Any:
    """``translate_nbest``, which stops for good in this process's second part."""
    if len(_parts_started) == 2:
        print(f"translate_driver: rank {os.environ['RANK']} stopped, pid {os.getpid()}", flush=True)
        while True:
            time.sleep(60)
    return _translate_nbest(*args, **kwargs)


if os.environ.get("HF_VANILLA_STOP_RANK", "none") == os.environ.get("RANK"):
    streaming.translate_stream = _counting_translate_stream
    streaming.translate_nbest = _stopping_translate_nbest

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
