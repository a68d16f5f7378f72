"""What every comparison's JSON carries, and the Markdown table benchmarks/RESULTS.md shows of it.

A comparison's command (``python -m benchmarks.<comparison>.run ... --json_out FILE``) writes its full
report with two keys added: ``meta`` (:func:`metadata`: the command, the date, the machine with its CPU
flags, the library versions) and ``table`` (``{"columns": [...], "rows": [[...], ...]}``, made from the
report by the comparison's own ``table`` function). A report copied into ``benchmarks/<comparison>/results/``
is that comparison's current measurement; ``python -m benchmarks.render`` turns them all into
benchmarks/RESULTS.md with :func:`render_run`. This module imports neither torch nor an engine.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys
from typing import Any

#: The CPU flags that decide which kernels run (lscpu's names), in the order a table lists them.
KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")

#: The libraries whose version a table names, when installed.
LIBRARIES = ("torch", "transformers", "ctranslate2", "onnxruntime", "torchao")


def cpu_description() -> tuple[str, list[str]]:
    """The CPU's model name and which of :data:`KERNEL_FLAGS` it has (from ``lscpu``)."""
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor(), []
    fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
    flags = set(fields.get("Flags", "").split())
    return fields.get("Model name", "").strip(), [flag for flag in KERNEL_FLAGS if flag in flags]


def metadata(argv: list[str] | None = None) -> dict[str, Any]:
    """The command that ran (``python -m <module> <arguments>``), when, on what, with which libraries."""
    cpu, flags = cpu_description()
    versions = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    module = sys.modules["__main__"].__spec__.name if sys.modules["__main__"].__spec__ else sys.argv[0]
    return {
        "command": shlex.join(["python", "-m", module, *(sys.argv[1:] if argv is None else argv)]),
        "date": datetime.date.today().isoformat(),
        "machine": {"cpu": cpu, "logical_cpus": os.cpu_count(), "flags": flags},
        "versions": versions,
    }


def cell(value: object) -> str:
    return "" if value is None else str(value).replace("|", "\\|")


def render_run(report: dict[str, Any]) -> str:
    """One run's table: its title, then the command, machine, CPU flags, date and versions, then the rows."""
    meta, table = report["meta"], report["table"]
    machine = meta["machine"]
    versions = ", ".join(f"{name} {version}" for name, version in meta["versions"].items()) or "not recorded"
    lines = [f"### {table['title']}", ""]
    lines += [f"- command: `{meta['command']}`"]
    lines += [f"- machine: {machine['cpu']}, {machine['logical_cpus']} logical CPUs"]
    lines += [f"- CPU flags: {', '.join(machine['flags']) or 'none of ' + ', '.join(KERNEL_FLAGS)}"]
    lines += [f"- date: {meta['date']}", f"- versions: {versions}"]
    if meta.get("source"):
        lines += [f"- source: {meta['source']}"]
    lines += ["", "| " + " | ".join(table["columns"]) + " |", "|" + "---|" * len(table["columns"])]
    for row in table["rows"]:
        if len(row) != len(table["columns"]):
            raise ValueError(
                f"{table['title']}: a row of {len(row)} cells under {len(table['columns'])} columns"
            )
        lines.append("| " + " | ".join(cell(value) for value in row) + " |")
    if table.get("note"):
        lines += ["", table["note"]]
    return "\n".join(lines) + "\n"
