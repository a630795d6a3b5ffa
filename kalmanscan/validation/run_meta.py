"""The date and device every result JSON carries (benchmarks/results/README.md): the benchmark
scripts' and the regime battery's ``--json``.

>>> sorted(run_meta(cuda=False))
['date', 'device']
"""

from __future__ import annotations

import datetime
import platform


def utc_now() -> str:
    """Now in UTC, ISO 8601 to the second: ``2026-12-02T12:26:22+00:00``."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo``; else ``platform.processor()`` or the
    architecture."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_meta(cuda: bool) -> dict:
    """``{"date": utc_now(), "device": ...}``: the CUDA device's name when ``cuda``, else the
    CPU's model."""
    if cuda:
        import torch

        device = torch.cuda.get_device_name()
    else:
        device = cpu_model()
    return {"date": utc_now(), "device": device}
