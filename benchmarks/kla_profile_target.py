"""One warm-up and one profiled forward+backward call of the KLA op on CUDA, for a profiler:

    ncu --clock-control none -k regex:_kla --launch-skip 2 --launch-count 2 \\
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats \\
        --section Occupancy python3 benchmarks/kla_profile_target.py --B 4 --M 960

(each call launches the forward and the backward kernel; the first call compiles them). The
inputs are those of ``benchmarks/gpu.py`` (``kla_inputs``).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    for name, default in (("B", 4), ("L", 2048), ("M", 960), ("S", 16)):
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--no-var", action="store_true",
                    help="no output variance (the LM's configuration: its gradient not read)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("kla_profile_target.py: needs a CUDA device")
    from gpu import kla_inputs

    from kalmanscan.core.kla_op import kla_filter

    x = {n: t.requires_grad_(True) for n, t in kla_inputs(a.B, a.L, a.M, a.S).items()}
    for _ in range(2):
        res = kla_filter(**x, backend="triton", check=False, return_variance=not a.no_var)
        outs = [res.y] if a.no_var else [res.y, res.yvar]
        torch.autograd.grad(outs, list(x.values()), [torch.ones_like(res.y)] * len(outs))
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
