"""What the KLA backward's reduce-scatter of the ``gk, gq`` channel sums costs (timing only).

The backward kernel sums ``gk, gq`` over a program's channels every step by a reduce-scatter
over the warp (``backward._scatter_channel_sums``: for 4 slots a thread, 7 shuffles, 14 selects
and 7 additions a thread-step) and adds the results by float32 atomics. A transpose through
shared memory (Triton's Gluon dialect) would replace the shuffles and selects by about 2
stores and 8 loads. Before writing it, this script bounds what it could save: it loads
``backward.py`` again as a module of its own whose ``_scatter_channel_sums`` adds a thread's
values in the thread (the same additions, no shuffles, no selects, the same atomics to the same
addresses, so ``gk, gq`` are wrong) and times both backward kernels on the same inputs, in
turns, at the KLA LM's chunk rows (2 x 8,192 tokens in 16 chunks: 32 rows of 512 steps,
``M = 1,024``, ``S = 16``, no ``yvar`` gradient, as in training). The other gradients
(``gv, gLv, gdecay, gprocess_var``, the start adjoints) do not depend on those sums: both
kernels must give them bit for bit, which the script checks.

    python benchmarks/kla_bwd_ablation.py --out benchmarks/results/kla-bwd-scatter-ablation-h200.json
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import pathlib
import statistics
import sys
import tempfile

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kalmanscan.cuda.kla import backward as bwd  # noqa: E402
from kalmanscan.cuda.kla.forward import forward  # noqa: E402

# the reduce-scatter of _scatter_channel_sums (both slot counts), replaced by in-thread sums
_SCATTER_FROM = "        if SG == 4:  # values 0-3: xk's rows, 4-7: xq's\n"
_SCATTER_TO = "        slot = (jt % G) * SG + c % SG\n"
_IN_THREAD = "        w = tl.sum(xk, axis=0) + tl.sum(xq, axis=0)  # (ablation: wrong sums)\n"


def ablated_backward():
    """``kalmanscan/cuda/kla/backward.py`` as a new module (from a temporary file, which the
    JIT reads its source from) whose ``_scatter_channel_sums`` sums in the thread where it
    reduce-scattered (its stores and atomics as they were)."""
    src = pathlib.Path(bwd.__file__).read_text()
    i = src.index(_SCATTER_FROM, src.index("def _scatter_channel_sums("))
    j = src.index(_SCATTER_TO, i)
    new = src[:i] + _IN_THREAD + src[j:]
    path = os.path.join(tempfile.mkdtemp(prefix="kla-bwd-ablation-"), "kla_bwd_ablated.py")
    pathlib.Path(path).write_text(new)
    spec = importlib.util.spec_from_file_location("kla_bwd_ablated", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def inputs(R, L, M, S, device, seed=0):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, lo=None, hi=None):
        x = torch.rand(shape, generator=g, dtype=torch.float64) if lo is not None else None
        x = lo + (hi - lo) * x if x is not None else torch.randn(shape, generator=g)
        return x.to(device, torch.float32)

    v, Lv = r(R, L, M), r(R, L, M, lo=0.5, hi=2.0)
    k, q = r(R, L, S), r(R, L, S)
    k, q = k / k.norm(dim=-1, keepdim=True), q / q.norm(dim=-1, keepdim=True)
    a, p = r(M, S, lo=0.6, hi=0.9999), r(M, S, lo=1e-5, hi=1e-3)
    gy = r(R, L, M)
    return v, Lv, k, q, a, p, gy


def run(R=32, L=512, M=1024, S=16, repeats=30, device="cuda"):
    """Both backwards on one input, in turns: ``(result dict, the two output tuples)``."""
    abl = ablated_backward()
    v, Lv, k, q, a, p, gy = inputs(R, L, M, S, device)
    _, _, lamT, _, _, ck, CK = forward(v, Lv, k, q, a, p, None, None, False, True, var=False)
    glT = torch.zeros_like(lamT)

    def call(mod):
        return mod.backward(v, Lv, k, q, a, p, ck, CK, gy, None, glT, glT, None)

    outs = {"reduce-scatter": call(bwd), "in-thread (ablation)": call(abl)}
    names = ("gv", "gLv", "gk", "gq", "gdecay", "gprocess_var", "gl0", "ge0")
    pairs = dict(zip(names, zip(*outs.values(), strict=True), strict=True))
    same = {n: bool(torch.equal(*pairs[n])) for n in ("gv", "gLv", "gl0", "ge0")}
    # the dynamics' gradients are added by float32 atomics in no fixed order: to rounding
    rel = {
        n: float((x - y).norm() / y.norm().clamp_min(1e-30))
        for n, (x, y) in pairs.items()
        if n in ("gk", "gq", "gdecay", "gprocess_var")
    }
    ms = {key: [] for key in outs}
    # timed on a GPU only (the interpreter's time on a CPU says nothing of the kernels)
    for _ in range(repeats if str(device).startswith("cuda") else 0):
        for key, mod in (("reduce-scatter", bwd), ("in-thread (ablation)", abl)):
            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0.record()
            call(mod)
            t1.record()
            torch.cuda.synchronize()
            ms[key].append(t0.elapsed_time(t1))
    med = {key: statistics.median(x) for key, x in ms.items() if x}
    res = dict(
        shape=dict(rows=R, L=L, M=M, S=S, tokens_per_layer=R * L, yvar_gradient=False),
        repeats=repeats,
        median_ms=med,
        equal_bit_for_bit=same,
        relative_difference=rel,
    )
    if len(med) == 2:
        d = med["reduce-scatter"] - med["in-thread (ablation)"]
        res["saved_ms_a_layer"] = d
        res["saved_ms_a_step_6_layers"] = 6 * d
        res["saved_fraction"] = d / med["reduce-scatter"]
    return res, outs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the result as JSON here")
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("kla_bwd_ablation.py: needs a CUDA device", file=sys.stderr)
        return 2
    res, _ = run(repeats=args.repeats)
    res = dict(
        benchmark="kla_bwd_ablation",
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        device=torch.cuda.get_device_name(0),
        torch=torch.__version__,
        triton=__import__("triton").__version__,
        **res,
    )
    print(json.dumps(res, indent=1))
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    rel = res["relative_difference"]
    ok = all(res["equal_bit_for_bit"].values()) and max(rel["gdecay"], rel["gprocess_var"]) < 1e-5
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
