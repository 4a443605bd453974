"""What a benchmark script prints about the machine and writes as its results."""

from __future__ import annotations

import json
import os
import platform

import torch

__all__ = ["machine_info", "publish", "speedups", "table_head"]


def machine_info(extra: str = "") -> str:
    """One line: architecture, cores, CPU, torch and its thread count (``extra`` after)."""
    info = (f"machine: {platform.machine()} {os.cpu_count()} cores "
            f"({platform.processor() or _cpu_name()}), torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads")
    return f"{info}, {extra}" if extra else info


def _cpu_name() -> str:
    """The CPU's model name (Linux), or ``cpu``."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def publish(out: str | None, text: str, info: str, rows: list) -> None:
    """Print ``text``; with ``out``, also write it as ``results.md`` and ``info`` and
    ``rows`` as ``results.json`` there."""
    print(text)
    if not out:
        return
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"info": info, "rows": rows}, f, indent=1)


def speedups(ms: dict[str, float], base: str) -> tuple[dict[str, float], str]:
    """Each system's speed against ``base`` (its median ms over theirs), and the line
    that prints them."""
    ratio = {k: ms[base] / v for k, v in ms.items()}
    return ratio, "  ".join(f"{k} {v:.2f} ms ({ratio[k]:.2f}x)" for k, v in ms.items())


def table_head(title: str, info: str, columns: list[str]) -> list[str]:
    """A results page's first lines: its title, the machine line, a markdown table head."""
    return [f"# {title}\n\n{info}\n", "| " + " | ".join(columns) + " |",
            "|---" * len(columns) + "|"]
