"""Where the chunked KLA op's time goes: the CUDA profiler's per-kernel device time of
``kla_filter(backend="triton")`` forward and forward + backward, chunked and unchunked, at shapes
with the same lanes a step (``B C`` rows of ``L / C`` steps against ``B C`` sequences of ``L / C``
steps), so a chunked pass can be compared with the unchunked kernel at equal occupancy.

    python benchmarks/kla_chunk_kernels.py [--out F.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
_argv, sys.argv = sys.argv, sys.argv[:1]  # kla_chunked parses its own arguments on import

from kla_chunked import call, inputs, with_chunks  # noqa: E402

from kalmanscan.kla.config import KLAConfig  # noqa: E402
from kalmanscan.kla.layer import KLALayer  # noqa: E402

CASES = [  # (B, L, C)
    (1, 32768, 1), (1, 32768, 8), (8, 4096, 1),
    (2, 8192, 1), (2, 8192, 4), (8, 2048, 1),
]  # fmt: skip


def profile(fn, reps=5):
    fn()
    fn()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    per = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name[:60]] += e.device_time_total / 1e3 / reps
    return dict(sorted(per.items(), key=lambda kv: -kv[1]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args(_argv[1:])
    layer = KLALayer(512, KLAConfig())
    with torch.no_grad():
        dyn = tuple(t.detach().float() for t in layer.dynamics())
    rows = []
    for B, L, C in CASES:
        M, S = dyn[0].shape
        x = inputs(B, L, M, S, dyn, "cuda")
        with_chunks(C)
        gy = torch.randn(B, L, M, device="cuda")
        row = {"B": B, "L": L, "C": C}
        for what, grads in (("fwd", None), ("fwdbwd", (gy, gy * 0.1))):
            per = profile(lambda grads=grads: call(x, grads))
            row[what] = {"total_ms": sum(per.values()), "kernels": per}
            print(B, L, C, what, round(sum(per.values()), 3),
                  {k: round(v, 3) for k, v in list(per.items())[:6]}, flush=True)
        rows.append(row)
    with_chunks(None)
    if args.out:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, open(args.out, "w"),
                  indent=1)


if __name__ == "__main__":
    main()
