"""One prepared check for a GPU machine, kept at this path: it runs ``python -m benchmarks.gpu.run``
(benchmarks/gpu/run.py lists the checks and the options; ``--help`` prints them).

    python scripts/gpu_check.py                      # base and big, all checks, compact table
    python scripts/gpu_check.py --device cpu --sizes tiny --steps 2 --fsdp_smoke false   # dry run
"""

import runpy
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(
        0, str(Path(__file__).resolve().parents[1])
    )  # the repository root, which holds benchmarks/
    runpy.run_module("benchmarks.gpu.run", run_name="__main__", alter_sys=True)
