"""Reliability on CUDA: extreme regimes, a 1e7-step lane, peak GPU memory and bitwise determinism.

One run writes one JSON (``--out``):

- ``regimes``: every regime of ``benchmarks/reliability.py`` (decay near/at 0 and 1, process
  variance 0 and huge, observation variance 1e-12 and 1e12, diffuse priors, never-observed lanes,
  1e5/1e6-step lanes, ...) through the ``"torch"`` and ``"triton"`` backends on CUDA in float32
  and float64, with the worst error against the float64 reference computed on the CPU (the
  ``sequential`` backend, or the scalar float64 loop for long single lanes), and the count of
  non-finite outputs where the reference is finite.
- ``kla_regimes``: the KLA op's regimes (``KLA_REGIMES``: value precisions over 12 decades, decay
  1-1e-6, 0 and 1, huge process variance) through ``torch`` and ``triton`` in float32 and float64
  against the float64 sequential op on the CPU.
- ``long_lane``: one lane of 1e7 steps (a=0.999, p=1e-3, r=1, 10% missing, diffuse), same paths;
  its reference (the scalar float64 loop, ~20 s) runs in a separate process meanwhile.
- ``memory``: ``torch.cuda.max_memory_allocated`` during one call minus what was allocated before,
  compared with the bytes of inputs + outputs, for the large shapes of the kernel issue: the
  general filter on 64 lanes x 2^20 steps and 65536 lanes x 4096 steps (both backends, float32),
  and the KLA op at B=8, L=2048, M=2048, S=16 (``triton``; forward, and forward + backward), next to
  the size one ``[B, L, M, S]`` tensor would take.
- ``determinism``: whether repeated runs give bitwise-identical outputs (and KLA gradients).

No speed is claimed here (benchmarks/gpu.py does that); timings are medians for orientation only.

    python benchmarks/reliability_gpu.py --out benchmarks/results/reliability-h200.json
    python benchmarks/reliability_gpu.py --sections kla_regimes --out benchmarks/results/reliability-kla-h200.json
    python benchmarks/reliability_gpu.py --quick --out /tmp/r.json     # CPU: checks the script, skips CUDA
    python benchmarks/reliability_gpu.py --quick --interpret-triton --out /tmp/r.json  # + the kernels interpreted
"""

# ruff: noqa: E501  (report strings)
from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import platform
import sys
import tempfile
import time
import traceback

if "--interpret-triton" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the kernels' import

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kalmanscan as ks  # noqa: E402
from benchmarks.reliability import (  # noqa: E402
    F32_ADEQUATE,
    KLA_SHAPE,
    _model,
    _simulate,
    errors,
    kla_rows,
    reference,
    regimes,
    scalar_reference,
)

CUDA = torch.cuda.is_available()
LONG_T = 10**7


def _sync():
    if CUDA:
        torch.cuda.synchronize()


def _tensors(m, dtype, device):
    return {
        k: torch.as_tensor(np.asarray(v, np.float64), dtype=dtype, device=device)
        for k, v in m.items()
    }


def run_filter(m, dtype, backend, device):
    kw = _tensors(m, dtype, device)
    with torch.no_grad():
        return ks.filter(**kw, backend=backend)


def _np(res):
    return {k: getattr(res, k).double().cpu().numpy() for k in ("mean", "var", "loglik")}


def paths(device):
    out = [("torch", torch.float32), ("torch", torch.float64)]
    if device == "cuda":
        out += [("triton", torch.float32), ("triton", torch.float64)]
    return out


def _timed(fn, repeats=3):
    ts, res = [], None
    for _ in range(repeats):
        _sync()
        t0 = time.perf_counter()
        res = fn()
        _sync()
        ts.append(time.perf_counter() - t0)
    return res, float(np.median(ts))


def regime_rows(device, quick):
    rows = []
    R = regimes(quick)
    for i, (name, (desc, build, nonfinite)) in enumerate(R.items()):
        m = build(np.random.default_rng(1000 + i))
        ref = reference(m)
        row = dict(
            regime=name,
            description=desc,
            T=int(np.shape(m["z"])[0]),
            N=int(np.shape(m["z"])[1]),
            expected_nonfinite=nonfinite,
            paths={},
        )
        for backend, dtype in paths(device):
            key = f"{backend}-{str(dtype).replace('torch.', '')}"
            try:
                res, secs = _timed(
                    lambda m=m, d=dtype, b=backend: run_filter(m, d, b, device), repeats=1
                )
                e = errors(_np(res), ref)
                e["median_s"] = round(secs, 5)
                if dtype == torch.float32:
                    e["adequate"] = bool(max(e["mean"], e["var"], e["loglik"]) <= F32_ADEQUATE)
                row["paths"][key] = e
            except Exception as exc:  # a path that fails is recorded, not hidden
                row["paths"][key] = dict(error=f"{type(exc).__name__}: {exc}")
        rows.append(row)
        print(
            name,
            {
                k: (v.get("mean"), v.get("var"), v.get("loglik"))
                if "error" not in v
                else v["error"]
                for k, v in row["paths"].items()
            },
            flush=True,
        )
    return rows


# ------------------------------------------------------------------------------------- long lane
def _long_model(T):
    rng = np.random.default_rng(77)
    z = _simulate(rng, T, 1, 0.999, 1e-3, 1.0)
    z[rng.random(z.shape) < 0.1] = np.nan
    return _model(z, 1.0, 0.999, 1e-3)


def _long_reference_worker(T, path):
    ref = scalar_reference(_long_model(T))
    np.savez(path, **ref)


def long_lane(device, T, ref_proc, ref_path):
    m = _long_model(T)
    out = dict(T=T, model="a=0.999, p=1e-3, r=1, 10% missing, diffuse prior", paths={})
    results = {}
    for backend, dtype in paths(device):
        key = f"{backend}-{str(dtype).replace('torch.', '')}"
        try:
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            res, secs = _timed(
                lambda m=m, d=dtype, b=backend: run_filter(m, d, b, device), repeats=1
            )
            entry = dict(median_s=round(secs, 4))
            if device == "cuda":
                entry["peak_bytes_over_baseline"] = int(torch.cuda.max_memory_allocated() - base)
            results[key] = _np(res)
            del res
            out["paths"][key] = entry
        except Exception as exc:
            out["paths"][key] = dict(error=f"{type(exc).__name__}: {exc}")
    t0 = time.perf_counter()
    ref_proc.join()
    out["reference_wait_s"] = round(time.perf_counter() - t0, 2)
    if ref_proc.exitcode != 0:
        out["reference_error"] = f"reference process exit code {ref_proc.exitcode}"
        return out
    ref = dict(np.load(ref_path))
    for key, r in results.items():
        out["paths"][key].update(errors(r, ref))
    print(
        "long lane",
        {k: (v.get("mean"), v.get("var"), v.get("loglik")) for k, v in out["paths"].items()},
        flush=True,
    )
    return out


# ---------------------------------------------------------------------------------------- memory
def _bytes(*xs):
    total = 0
    for x in xs:
        if isinstance(x, torch.Tensor):
            total += x.numel() * x.element_size()
        elif isinstance(x, (tuple, list)):
            total += _bytes(*x)
    return total


def filter_memory(T, N, backend, dtype=torch.float32):
    g = torch.Generator(device="cuda").manual_seed(0)
    z = torch.randn(T, N, device="cuda", dtype=dtype, generator=g)
    z[::7] = float("nan")
    obs = torch.full((1, N), 0.5, device="cuda", dtype=dtype)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with torch.no_grad():
        res = ks.filter(z, obs, 0.95, 0.1, backend=backend)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    out_bytes = _bytes(*[getattr(res, f) for f in res._fields])
    row = dict(
        op="filter",
        backend=backend,
        dtype=str(dtype).replace("torch.", ""),
        T=T,
        N=N,
        input_bytes=_bytes(z, obs),
        output_bytes=out_bytes,
        peak_bytes_over_inputs=int(peak),
        peak_over_outputs=round(peak / out_bytes, 3),
        peak_over_inputs_plus_outputs=round(peak / (out_bytes + _bytes(z, obs)), 3),
    )
    del res, z
    torch.cuda.empty_cache()
    return row


def kla_memory(B, L, M, S, backend, backward):
    from kalmanscan.core.kla_op import kla_filter

    g = torch.Generator(device="cuda").manual_seed(0)
    x = dict(
        v=torch.randn(B, L, M, device="cuda", generator=g),
        Lv=torch.rand(B, L, M, device="cuda", generator=g) + 0.1,
        k=torch.nn.functional.normalize(torch.randn(B, L, S, device="cuda", generator=g), dim=-1),
        q=torch.nn.functional.normalize(torch.randn(B, L, S, device="cuda", generator=g), dim=-1),
        decay=torch.full((M, S), 0.99, device="cuda"),
        process_var=torch.full((M, S), 0.01, device="cuda"),
    )
    if backward:
        for t in x.values():
            t.requires_grad_(True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    if backward:
        res = kla_filter(**x, backend=backend)
        torch.autograd.backward(
            [res.y, res.yvar], [torch.ones_like(res.y), torch.ones_like(res.yvar)]
        )
        grads = [t.grad for t in x.values()]
    else:
        with torch.no_grad():
            res = kla_filter(**x, backend=backend)
        grads = []
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    io = (
        _bytes(*x.values()) + _bytes(res.y, res.yvar, res.final.lam, res.final.eta) + _bytes(*grads)
    )
    blms = B * L * M * S * 4
    row = dict(
        op="kla" + ("-fwd-bwd" if backward else "-fwd"),
        backend=backend,
        B=B,
        L=L,
        M=M,
        S=S,
        inputs_outputs_bytes=io,
        peak_bytes_over_inputs=int(peak),
        peak_over_inputs_outputs=round(peak / io, 3),
        one_BLMS_float32_tensor_bytes=blms,
        peak_over_one_BLMS_tensor=round(peak / blms, 3),
    )
    del res, x, grads
    torch.cuda.empty_cache()
    return row


def memory_rows(quick):
    rows = []
    shapes = [(2**20, 64), (4096, 65536)] if not quick else [(2**14, 64), (256, 4096)]
    for T, N in shapes:
        for backend in ("triton", "torch"):
            try:
                rows.append(filter_memory(T, N, backend))
            except Exception as exc:
                rows.append(
                    dict(
                        op="filter", backend=backend, T=T, N=N, error=f"{type(exc).__name__}: {exc}"
                    )
                )
                torch.cuda.empty_cache()
    B, L, M, S = (8, 2048, 2048, 16) if not quick else (2, 256, 256, 16)
    for backend, backward in (("triton", False), ("triton", True), ("torch", False)):
        try:
            rows.append(kla_memory(B, L, M, S, backend, backward))
        except Exception as exc:
            rows.append(
                dict(
                    op="kla",
                    backend=backend,
                    backward=backward,
                    error=f"{type(exc).__name__}: {exc}",
                )
            )
            torch.cuda.empty_cache()
    for r in rows:
        print("memory", r, flush=True)
    return rows


# ----------------------------------------------------------------------------------- determinism
def _same_bits(a, b):
    """Bitwise equality of two lists of tensors (NaN payloads included)."""
    return all(
        x.shape == y.shape
        and x.detach().cpu().numpy().tobytes() == y.detach().cpu().numpy().tobytes()
        for x, y in zip(a, b, strict=True)
    )


def determinism(device, quick):
    rows = []
    shapes = [(4096, 1024), (2**20, 1), (64, 65536)] if not quick else [(256, 64), (5000, 1)]
    for T, N in shapes:
        g = torch.Generator(device=device).manual_seed(3)
        for backend, dtype in paths(device):
            z = torch.randn(T, N, device=device, dtype=dtype, generator=g)
            z[torch.rand(T, N, device=device, generator=g) < 0.2] = float("nan")
            outs = []
            for _ in range(3):
                with torch.no_grad():
                    sm = ks.smooth(z, 0.5, 0.97, 0.05, offset=0.1, backend=backend)
                f = sm.filtered
                outs.append([sm.mean, sm.var, f.mean, f.var, f.loglik, f.final.lam, f.final.eta])
                _sync()
            rows.append(
                dict(
                    op="smooth",
                    backend=backend,
                    dtype=str(dtype).replace("torch.", ""),
                    T=T,
                    N=N,
                    bitwise_identical=all(_same_bits(outs[0], o) for o in outs[1:]),
                )
            )
    # gradients of the general filter and of the KLA op
    for backend, dtype in paths(device):
        g = torch.Generator(device=device).manual_seed(4)
        z = torch.randn(2048, 256, device=device, dtype=dtype, generator=g)
        grads = []
        for _ in range(3):
            a = torch.tensor(0.95, device=device, dtype=dtype, requires_grad=True)
            p = torch.tensor(0.1, device=device, dtype=dtype, requires_grad=True)
            r = ks.filter(z, 0.5, a, p, backend=backend)
            r.loglik.sum().backward()
            grads.append([a.grad, p.grad])
        rows.append(
            dict(
                op="filter-grad",
                backend=backend,
                dtype=str(dtype).replace("torch.", ""),
                T=2048,
                N=256,
                bitwise_identical=all(_same_bits(grads[0], gr) for gr in grads[1:]),
            )
        )
    from kalmanscan.core.kla_op import kla_filter

    kla_backends = ["torch"] + (["triton"] if device == "cuda" else [])
    B, L, M, S = (2, 512, 256, 16) if not quick else (1, 32, 8, 4)
    for backend in kla_backends:
        g = torch.Generator(device=device).manual_seed(5)
        base = dict(
            v=torch.randn(B, L, M, device=device, generator=g),
            Lv=torch.rand(B, L, M, device=device, generator=g) + 0.1,
            k=torch.randn(B, L, S, device=device, generator=g),
            q=torch.randn(B, L, S, device=device, generator=g),
            decay=torch.full((M, S), 0.99, device=device),
            process_var=torch.full((M, S), 0.01, device=device),
        )
        outs = []
        for _ in range(3):
            x = {k: t.clone().requires_grad_(True) for k, t in base.items()}
            res = kla_filter(**x, backend=backend)
            torch.autograd.backward(
                [res.y, res.yvar], [torch.ones_like(res.y), torch.ones_like(res.yvar)]
            )
            outs.append([res.y.detach(), res.yvar.detach()] + [t.grad for t in x.values()])
        rows.append(
            dict(
                op="kla-fwd-bwd",
                backend=backend,
                dtype="float32",
                B=B,
                L=L,
                M=M,
                S=S,
                bitwise_identical=all(_same_bits(outs[0], o) for o in outs[1:]),
            )
        )
    for r in rows:
        print("determinism", r, flush=True)
    return rows


def triton_interpreted(T=200):
    """The Triton kernels of the general filter under TRITON_INTERPRET=1 (CPU), at the backend
    contract (docs/backend-contract.md: mean, var, loglik, flags), on every short regime cut to
    ``T`` steps, against the float64 ``sequential`` backend: a preview of the ``triton`` rows
    without a GPU."""
    from kalmanscan.core.sequential import filter_lanes as reference_lanes
    from kalmanscan.core.steps import from_prior
    from kalmanscan.cuda import filter as F
    from kalmanscan.testing import rel_error

    rows = []
    for i, (name, (_desc, build, _nonfinite)) in enumerate(regimes(True).items()):
        if name.startswith("long-"):
            continue
        m = build(np.random.default_rng(1000 + i))
        z64 = torch.tensor(np.asarray(m["z"], np.float64)[:T])
        Tn, N = z64.shape

        def param(k, dtype, m=m, Tn=Tn, N=N):
            x = torch.tensor(np.asarray(m[k], np.float64), dtype=dtype)
            x = x[:Tn] if x.ndim == 2 else x
            return x.reshape(
                x.shape if x.ndim == 2 else (1,) * (2 - x.ndim) + tuple(x.shape)
            ).expand(Tn, N)

        row = dict(regime=name, T=Tn, N=N)
        for dtype in (torch.float64, torch.float32):
            obs = param("obs_var", dtype)
            z = z64.to(dtype).masked_fill(torch.isinf(obs), float("nan"))
            pv = torch.tensor(np.asarray(m["prior_var"], np.float64), dtype=dtype).expand(N)
            pm = torch.tensor(np.asarray(m["prior_mean"], np.float64), dtype=dtype).expand(N)
            x0 = tuple(x.contiguous() for x in from_prior(pm, pv))
            args = (
                z,
                obs,
                param("decay", dtype),
                param("process_var", dtype),
                param("loading", dtype),
                param("offset", dtype),
            )
            ref = reference_lanes(*(a.double() for a in args), tuple(x.double() for x in x0))
            got = F.filter_lanes(*args, x0)
            row[str(dtype).replace("torch.", "")] = dict(
                mean=rel_error(
                    got["mean"], ref["mean"], scale=float(ref["mean"].nan_to_num().abs().max())
                ),
                var=rel_error(got["var"], ref["var"]),
                loglik=rel_error(got["loglik"], ref["loglik"]),
                flags=int(got["flags"]),
            )
        rows.append(row)
        print("triton (interpreted)", row, flush=True)
    return rows


SECTIONS = ("triton_interpreted", "regimes", "kla_regimes", "long_lane", "memory", "determinism")


def _section(result, name, fn):
    if name not in result["meta"]["sections"]:
        return
    t0 = time.perf_counter()
    try:
        result[name] = fn()
    except Exception:
        result[name] = dict(error=traceback.format_exc()[-3000:])
        print(f"section {name} failed:\n{result[name]['error']}", flush=True)
    result.setdefault("section_seconds", {})[name] = round(time.perf_counter() - t0, 1)
    # written after every section, so a run cut short still leaves what it measured
    with open(result["meta"]["out"], "w") as f:
        json.dump(result, f, indent=1, default=float)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="write the JSON here")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="small shapes; on a machine without CUDA run the CPU paths only (checks the script)",
    )
    ap.add_argument(
        "--interpret-triton",
        action="store_true",
        help="also run the Triton kernels under TRITON_INTERPRET=1 on the CPU (regimes cut to 200 steps)",
    )
    ap.add_argument(
        "--sections",
        default=None,
        help=f"comma-separated sections to run (default: all of {', '.join(SECTIONS[1:])})",
    )
    args = ap.parse_args(argv)
    sections = SECTIONS[1:] if args.sections is None else tuple(args.sections.split(","))
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        ap.error(f"--sections: expected names among {list(SECTIONS)}, got {unknown}")
    if args.interpret_triton:
        sections = ("triton_interpreted",) + tuple(x for x in sections if x != "triton_interpreted")
    device = "cuda" if CUDA else "cpu"
    if CUDA and args.interpret_triton:
        print(
            "--interpret-triton is for machines without CUDA (it would interpret the GPU kernels too)",
            file=sys.stderr,
        )
        return 2
    if not CUDA and not args.quick:
        print("no CUDA device: run with --quick to check the script on the CPU", file=sys.stderr)
        return 2
    long_T = LONG_T if not args.quick else 10**5
    ref_path = os.path.join(tempfile.gettempdir(), f"kalmanscan-long-ref-{os.getpid()}.npz")
    ctx = mp.get_context("spawn")
    ref_proc = ctx.Process(target=_long_reference_worker, args=(long_T, ref_path))
    if "long_lane" in sections:
        ref_proc.start()
    triton_version = None
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        pass
    result = dict(
        meta=dict(
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            device=torch.cuda.get_device_name() if CUDA else f"cpu ({platform.machine()})",
            torch=torch.__version__,
            triton=triton_version,
            quick=args.quick,
            command="python benchmarks/reliability_gpu.py"
            + (" --quick" if args.quick else "")
            + (" --interpret-triton" if args.interpret_triton else "")
            + (f" --sections {args.sections}" if args.sections else "")
            + f" --out {args.out}",
            reference="float64 on the CPU: the sequential backend; a scalar float64 loop for single lanes > 2e4 steps",
            float32_adequate_if_error_below=F32_ADEQUATE,
            out=args.out,
            sections=list(sections),
        )
    )
    if args.interpret_triton:
        _section(result, "triton_interpreted", triton_interpreted)
    _section(result, "regimes", lambda: regime_rows(device, args.quick))
    kla_paths = [("torch", torch.float32), ("torch", torch.float64)]
    if CUDA:
        kla_paths += [("triton", torch.float32), ("triton", torch.float64)]
    kla_shape = KLA_SHAPE if not args.quick else (1, 512, 8, 4)
    if CUDA and "kla_regimes" in sections:  # the time chunks the triton op takes at this shape
        from kalmanscan.cuda.kla import tuning

        B, L, M, S = kla_shape
        result["meta"]["kla_triton_chunks"] = tuning.chunks_for(
            B * M * S, L, tuning.sm_count(torch.device("cuda"))
        )
    _section(result, "kla_regimes", lambda: kla_rows(kla_paths, device=device, shape=kla_shape))
    try:
        _section(result, "long_lane", lambda: long_lane(device, long_T, ref_proc, ref_path))
    finally:
        if ref_proc.is_alive():
            ref_proc.join(timeout=120)
        if os.path.exists(ref_path):
            os.remove(ref_path)
    if CUDA:
        _section(result, "memory", lambda: memory_rows(args.quick))
    elif "memory" in sections:
        result["memory"] = "skipped: no CUDA device"
    _section(result, "determinism", lambda: determinism(device, args.quick))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, default=float)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
