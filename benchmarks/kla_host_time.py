"""Where the host time of a KLA forward+backward call goes (CUDA; Python profiler).

``kla_kernel_time.py`` shows that at B = 4 a forward+backward call through the API takes longer
than its kernels: the GPU waits on the host. This script runs ``--calls`` calls of
``kla_filter(..., check=False)`` plus ``torch.autograd.grad`` back to back (one
synchronization at the end), reports the host time a call (wall time / calls) next to the
kernels' time (CUDA events around the same loop), and prints the functions that took the host
time (``cProfile``, sorted by own time).

    python benchmarks/kla_host_time.py --B 4 --M 960 --json F
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import io
import json
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    for name, default in (("B", 4), ("L", 2048), ("M", 960), ("S", 16), ("calls", 50)):
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("kla_host_time.py: needs a CUDA device")
    from gpu import kla_inputs

    from kalmanscan.core.kla_op import kla_filter

    x = {n: t.requires_grad_(True) for n, t in kla_inputs(a.B, a.L, a.M, a.S).items()}
    leaves = list(x.values())

    def call():
        res = kla_filter(**x, backend="triton", check=False)
        return torch.autograd.grad([res.y, res.yvar], leaves, [torch.ones_like(res.y)] * 2)

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(a.calls):
        call()
    end.record()
    host_ms = (time.perf_counter() - t0) * 1e3 / a.calls  # time to issue a call
    torch.cuda.synchronize()
    gpu_ms = start.elapsed_time(end) / a.calls  # issue-to-finish, GPU clock
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(a.calls):
        call()
    torch.cuda.synchronize()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
    print(f"B={a.B} L={a.L} M={a.M} S={a.S}: host {host_ms:.3f} ms a call to issue, "
          f"{gpu_ms:.3f} ms a call on the GPU clock")  # fmt: skip
    print(buf.getvalue())
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"date": datetime.date.today().isoformat(),
                       "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "shape": dict(B=a.B, L=a.L, M=a.M, S=a.S), "calls": a.calls,
                       "host_issue_ms_per_call": host_ms, "gpu_ms_per_call": gpu_ms,
                       "profile_top": buf.getvalue().splitlines()[:60]}, f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
