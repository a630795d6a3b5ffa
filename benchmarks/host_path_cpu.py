"""Host cost of the public functions on the triton backend's Python path, measured on the CPU.

    python benchmarks/host_path_cpu.py [--shapes 65536x64,256x16384] [--calls 400]
                                       [--profile] [--out results.json]

No GPU is needed: CPU tensors stand in for CUDA ones, ``backend="auto"`` resolves to
``"triton"`` and every Triton launch goes through :func:`kalmanscan.cuda._common.launch`'s own
fast path (specialization key, argument list) into a compiled kernel that does nothing. What is
left is what the H200's host runs a call: argument conversion, broadcasting, the backend's
plan, allocations, launches, autograd plumbing, output building. The torch ops the path runs
(the flags' fill, the log-likelihood partials' sum) run on the CPU.

Per call (microseconds of wall time, ``--clock cpu`` for the thread's CPU time; the calls
interleaved in 5 rounds of ``--calls / 5`` each, the smallest round median, as the machine
may be shared):

- ``total``: the whole call;
- ``exposed``: the part of it during which the GPU would sit idle: from the call's start to its
  first kernel launch, and from the flags' read (the host synchronization) to the next launch or
  to the call's return. On the GPU a call's wall time is about its kernels plus ``exposed``
  (the host work between launches overlaps the kernels already queued).

``--profile`` prints the top functions by own time (cProfile) for each call. Shapes: ``65536 x
64`` has the plan of ``2^20 x 64`` (1024 chunks: the few-long-lanes regime, same host path);
``256 x 16384`` one thread a lane (the many-lanes regime).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import os
import pstats
import statistics
import time

os.environ.pop("TRITON_INTERPRET", None)  # the compiled launch path, never the interpreter

import torch  # noqa: E402

from kalmanscan.validation.run_meta import run_meta  # noqa: E402

_STAMPS: list = []
# --clock cpu: the calling thread's CPU time (another process's load on a shared machine
# counts less, but each reading is a system call of about 1.5 us here)
clock = time.perf_counter


class _NoopKernel:
    """Stands in for a compiled Triton kernel: ``kernel[grid](*args)`` records the time only."""

    def __getitem__(self, grid):
        return self._run

    @staticmethod
    def _run(*args):
        _STAMPS.append(("launch", clock()))


class _AnyKey(dict):
    """A specialization cache in which every key has a compiled (no-op) kernel."""

    def get(self, key, default=None):
        return _NOOP


_NOOP = _NoopKernel()


def install_mock():
    """Route ``backend="auto"`` on CPU tensors to triton, launches to :class:`_NoopKernel`, and
    stamp the flags' read."""
    torch.set_num_threads(1)  # the CPU ops stand in for launches: no thread pool's waits
    torch.cuda.current_device = lambda: 0  # the launch key's device (no CUDA here)
    from kalmanscan.core import backends
    from kalmanscan.core import filter as core_filter
    from kalmanscan.cuda import _common
    from kalmanscan.cuda.filter import adjoint, kernels

    backends.AUTO["filter"] = dict(backends.AUTO["filter"], cpu=("triton",))
    real_unavailable = backends._unavailable
    backends._unavailable = lambda name, device, op: (
        None if name == "triton" else real_unavailable(name, device, op)
    )
    assert not _common.interpreting() and _common.FAST_LAUNCH
    # Big buffers are views of one kept arena: on CUDA the caching allocator hands back the
    # previous call's blocks, where a fresh CPU allocation of that size maps new pages.
    real_empty = torch.empty
    arenas = {}

    def empty(*size, dtype=None, device=None, **kw):
        shape = size[0] if len(size) == 1 and not isinstance(size[0], int) else size
        n = math.prod(shape)
        if kw or n < 1 << 16:
            return real_empty(*size, dtype=dtype, device=device, **kw)
        dtype = dtype or torch.get_default_dtype()
        arena = arenas.get(dtype)
        if arena is None or arena.numel() < n:
            arena = arenas[dtype] = torch.zeros(n, dtype=dtype)  # (no denormals to sum)
        return arena[:n].view(shape)

    torch.empty = empty
    for fn in (kernels.filter_kernel, kernels.carry_kernel, kernels.smooth_kernel,
               adjoint.adjoint_kernel, adjoint.adjoint_carry_kernel):  # fmt: skip
        entry = _common._Launch(fn)
        entry.cache = _AnyKey()
        _common._LAUNCH[fn] = entry
    real_read = core_filter._read_flags

    def read(flags):
        _STAMPS.append(("sync", clock()))
        return real_read(flags)

    core_filter._read_flags = read


def inputs(T, N, seed=2):
    """As ``benchmarks/gpu.py``'s ``public_inputs``: ``z [T, N]`` float32 (5 % NaN) and
    per-lane ``obs_var, decay, process_var`` ``[N]``."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(T, N, generator=g)
    z[torch.rand(T, N, generator=g) < 0.05] = float("nan")
    R = torch.rand(N, generator=g) + 0.5
    a = torch.rand(N, generator=g) * 0.2 + 0.8
    p = torch.rand(N, generator=g) * 0.1 + 0.01
    return z, R, a, p


def exposed(t0, t1, stamps):
    """Host time of a call ``[t0, t1]`` during which no kernel would be running."""
    launches = [t for k, t in stamps if k == "launch"]
    if not launches:
        return t1 - t0
    idle = launches[0] - t0
    for k, t in stamps:
        if k == "sync":
            nxt = [u for u in launches if u > t]
            idle += (nxt[0] if nxt else t1) - t
    return idle


def calls(T, N):
    import kalmanscan as ks

    z, R, a, p = inputs(T, N)
    leaves = [x.clone().requires_grad_(True) for x in (R, a, p)]
    return {
        "filter": lambda: ks.filter(z, R, a, p),
        "smooth": lambda: ks.smooth(z, R, a, p),
        "loglik": lambda: ks.loglik(z, R, a, p),
        "loglik_grad": lambda: torch.autograd.grad(ks.loglik(z, *leaves).sum(), leaves),
    }


def measure(fns, n, rounds=5):
    """Per call of each of ``fns``: the smallest of ``rounds`` interleaved rounds' medians (the
    machine is shared: the least disturbed round)."""
    for fn in fns.values():
        for _ in range(20):
            fn()
    res = {name: {"total": [], "exposed": []} for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            totals, idles = [], []
            for _ in range(max(1, n // rounds)):
                _STAMPS.clear()
                t0 = clock()
                fn()
                t1 = clock()
                totals.append(t1 - t0)
                idles.append(exposed(t0, t1, _STAMPS))
            res[name]["total"].append(statistics.median(totals) * 1e6)
            res[name]["exposed"].append(statistics.median(idles) * 1e6)
            res[name]["launches"] = sum(k == "launch" for k, _ in _STAMPS)
            res[name]["syncs"] = sum(k == "sync" for k, _ in _STAMPS)
    return {
        name: {
            "total_us": min(r["total"]),
            "exposed_us": min(r["exposed"]),
            "launches": r["launches"],
            "syncs": r["syncs"],
        }
        for name, r in res.items()
    }


def profile(fn, n=200, top=25):
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        fn()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(top)
    return s.getvalue()


def compare(before: str, args) -> dict:
    """Run this script ``args.repeats`` times on the tree at ``before`` and on this one,
    alternately (subprocesses), and keep per call the smallest figures of each."""
    import subprocess
    import sys
    import tempfile

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runs = {"before": [], "after": []}
    for _ in range(args.repeats):
        for label, root in (("before", before), ("after", here)):
            with tempfile.NamedTemporaryFile(suffix=".json") as f:
                cmd = [
                    sys.executable,
                    os.path.abspath(__file__),
                    "--shapes",
                    args.shapes,
                    "--calls",
                    str(args.calls),
                    "--clock",
                    args.clock,
                    "--out",
                    f.name,
                ]
                env = dict(os.environ, PYTHONPATH=root)
                subprocess.run(cmd, check=True, env=env, cwd="/", stdout=subprocess.DEVNULL)
                runs[label].append(json.load(open(f.name))["results"])
    best = {}
    for label, rs in runs.items():
        rows = {}
        for r in (r for run in rs for r in run):
            k = (tuple(r["shape"]), r["call"])
            if k not in rows:
                rows[k] = dict(r)
            else:
                for m in ("total_us", "exposed_us"):
                    rows[k][m] = min(rows[k][m], r[m])
        best[label] = list(rows.values())
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--shapes", default="65536x64,256x16384")
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    ap.add_argument("--before", help="a source tree of kalmanscan to compare against (e.g. "
                    "from git archive), run alternately with this one")  # fmt: skip
    ap.add_argument("--repeats", type=int, default=3, help="runs of each tree with --before")
    args = ap.parse_args()
    if args.before:
        best = compare(args.before, args)
        for label, rows in best.items():
            for row in rows:
                print(label, json.dumps({k: round(v, 1) if isinstance(v, float) else v
                                         for k, v in row.items()}))  # fmt: skip
        if args.out:
            doc = {
                **run_meta(cuda=False),
                "torch": torch.__version__,
                "what": "host path of the public functions on the triton backend, launches "
                "no-ops, CPU tensors; microseconds a call, the smallest of --repeats runs of "
                "each tree, run alternately (benchmarks/host_path_cpu.py --before)",
                "clock": args.clock,
                "calls": args.calls,
                "repeats": args.repeats,
                **best,
            }
            with open(args.out, "w") as f:
                json.dump(doc, f, indent=1)
        return
    global clock
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    install_mock()
    rows = []
    for sh in args.shapes.split(","):
        T, N = map(int, sh.split("x"))
        fns = calls(T, N)
        for name, m in measure(fns, args.calls).items():
            row = {"shape": [T, N], "call": name, **m}
            rows.append(row)
            print(json.dumps({k: round(v, 1) if isinstance(v, float) else v
                              for k, v in row.items()}), flush=True)  # fmt: skip
        if args.profile:
            for name, fn in fns.items():
                print(name, T, N)
                print(profile(fn), flush=True)
    if args.out:
        doc = {
            **run_meta(cuda=False),
            "torch": torch.__version__,
            "what": "host path of the public functions on the triton backend, launches no-ops, "
            "CPU tensors; median microseconds a call (benchmarks/host_path_cpu.py)",
            "clock": args.clock,
            "results": rows,
        }
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
