"""The fused Triton dense filter and smoother (kalmanscan/cuda/dense.py) where a predicted
covariance passes the dtype's range (an explosive F over a gap of missing observations): the
rule of the CPU backends (tests/test_dense_lost_loglik.py, kalmanscan.dense.api._lost_steps),
that series' log-likelihood NaN with the same RuntimeWarning, its filtered moments NaN from
that step on and its smoothed moments NaN, the other series exactly as the fused path gives
them alone. Reference: ``sequential`` in float64, ``native`` in float32 (the float32 rule; the
reference is float64 only). Without CUDA the kernels run under TRITON_INTERPRET=1 at small sizes
(as tests/test_cuda_dense.py); outputs are NaN-poisoned (tests/conftest.py).

Before (this file's first version): the fused path returned the lost series' log-likelihood
without a warning, finite where the lost steps came last (-231.18 for a trailing gap, the
reference NaN), and smoothed moments finite before the lost step; the fused smoother's
interpreted kernels raised InterpreterError where a carry met the NaN ('All-NaN slice
encountered': a NaN pivot column in their Gauss-Jordan); a prediction in float32's top binade
(2.04e38) passed the range in the symmetrization, a step before the CPU backends' loss.
"""

from __future__ import annotations

import os
import re
import warnings

import numpy as np
import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton
pytest.importorskip("triton")

import kalmanscan.dense as kd  # noqa: E402
from kalmanscan.cuda import dense as CD  # noqa: E402
from kalmanscan.dense import native  # noqa: E402
from kalmanscan.testing import assert_close  # noqa: E402
from tests.helpers import triton_interpreted  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"
OUTPUTS = ("mean", "cov", "precision", "pred_mean", "pred_cov")
DTYPES = [torch.float32, torch.float64]
WARNING = (
    "kalmanscan.dense: the log-likelihood is NaN: a predicted covariance passed {dt}'s "
    "range{at} (an entry of F P F' + Q beyond {big}), where the covariance form holds neither "
    "it nor its log-likelihood term; that series' filtered moments from that step on and its "
    "smoothed moments are NaN. Rescale the state or time{f32} (docs/reliability.md, limit 5)"
)


def expected_warning(dtype, at=""):
    f64 = dtype == torch.float64
    return WARNING.format(dt="float64" if f64 else "float32", at=at,
                          big="1.8e+308" if f64 else "3.4e+38",
                          f32="" if f64 else ", or use float64")  # fmt: skip


@pytest.fixture(autouse=True)
def interpreted():
    assert CUDA or triton_interpreted(CD.chunk_filter), "the kernels must run interpreted on CPU"


@pytest.fixture
def auto_is_triton(monkeypatch):
    """Off CUDA: ``backend="auto"`` resolves as on CUDA (tests/test_cuda_dense.py's fixture)."""
    if CUDA:
        return
    from kalmanscan.core import backends

    real = backends.resolve

    def resolve(backend, device, op="filter"):
        if backend == "auto" and op == "dense":
            return backends.AUTO["dense"]["cuda"][0]
        return real(backend, device, op)

    monkeypatch.setattr(backends, "resolve", resolve)


@pytest.fixture
def served(monkeypatch):
    """The fused launches of the calls: ("filter" or "smooth", whether their outputs are
    served: parts returned, the screen and the gate not set)."""
    calls = []
    for name, op in (("run", "filter"), ("run_smooth", "smooth")):
        real = getattr(CD, name)

        def spy(model, layout, *rest, _real=real, _op=op):
            parts, flagged, gated = _real(model, layout, *rest)
            calls.append((_op, parts is not None and not flagged and not gated))
            return parts, flagged, gated

        monkeypatch.setattr(CD, name, spy)
    return calls


@pytest.fixture
def lost_rule(monkeypatch):
    """The calls of :func:`CD._lost_rule` (the host's check after the kernel's LOST bit)."""
    calls = []
    real = CD._lost_rule

    def spy(layout, parts):
        calls.append(layout.batch_shape)
        return real(layout, parts)

    monkeypatch.setattr(CD, "_lost_rule", spy)
    return calls


def call(fn, *args, **kw):
    """``fn``'s result and the library's warnings (the interpreter's numpy ones left out)."""
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        out = fn(*args, **kw)
    mine = [w for w in got if not re.search(r"[/\\](triton|numpy)[/\\]", w.filename)]
    return out, [str(w.message) for w in mine]


def tensors(kw, dtype, device):
    return {k: torch.as_tensor(v, dtype=dtype, device=device) for k, v in kw.items()}


H2, R2, Q2 = np.eye(2), np.diag([0.5, 0.7]), np.eye(2)
PRIOR = dict(prior_mean=np.zeros(2), prior_cov=np.eye(2))
# F = BIG I: F F' + Q is well conditioned (the gate lets it through, unlike diag(1e100, .5)); the
# prediction after two unobserved steps, ~BIG^4, passes the range at step 2 (0-based)
BIG = {torch.float64: 1e100, torch.float32: 1e10}
LOST_STEP = 2


def gap_series(dtype):
    """(z [5, 2], F): one observed step, two missing, two observed; lost at step 2 (interpreted:
    chunks of 2, 2 and 1 steps, the lost step in the second, a chunk after it)."""
    z = np.array([[0.3, 0.1], [np.nan] * 2, [np.nan] * 2, [2.0, 0.4], [1.0, 0.2]])
    assert CUDA or CD.chunk_length(len(z)) == LOST_STEP == 2
    return z, BIG[dtype] * np.eye(2)


def gap_model(dtype, series):
    """``series`` "one": the lost series alone; "several": three on axis 1, the lost one in the
    middle (index 1) between two ordinary ones (their own F, data and missing pattern)."""
    z, F = gap_series(dtype)
    kw = dict(Q=Q2, H=H2, R=R2, **PRIOR)
    if series == "one":
        return z, dict(kw, F=F)
    rng = np.random.default_rng(4)
    zs = [0.5 * rng.normal(size=z.shape) for _ in range(2)]
    zs[0][1] = np.nan
    zs[1][4, 0] = np.nan
    z = np.stack([zs[0], z, zs[1]], 1)  # [T, 3, 2]
    F = np.stack([0.9 * np.eye(2), F, np.array([[0.5, 0.2], [-0.1, 0.7]])])
    return z, dict(kw, F=F)


def reference(op, z, kw, dtype):
    """The CPU rule at ``dtype``: sequential (float64) or native (float32), CPU tensors."""
    backend = "sequential" if dtype == torch.float64 else "native"
    if backend == "native" and not native.available():
        pytest.skip("the float32 reference needs the native extension")
    return call(getattr(kd, op), torch.as_tensor(z, dtype=dtype), **tensors(kw, dtype, "cpu"),
                backend=backend)  # fmt: skip


def moments(res, op):
    """(name, tensor) of every output of a filter or smoother result, on the CPU."""
    f = res.filtered if op == "smooth" else res
    out = [(name, getattr(f, name)) for name in (*OUTPUTS, "loglik")]
    if op == "smooth":
        out += [(f"smoothed {name}", getattr(res, name)) for name in ("mean", "cov", "precision")]
    return [(name, t.detach().cpu()) for name, t in out]


def kind(dtype):
    """The tolerance table's row: float64 against sequential as in tests/test_cuda_dense.py;
    float32 against native's float32, another rounding of the same numbers (the "truth" row:
    the fused path's float32 error; 1.03e-4 on an H100 in test_lost_across_chunks)."""
    return "parallel" if dtype == torch.float64 else "truth"


def assert_matches(got, ref, op, dtype):
    """Every output as the reference: NaN and inf in the same entries (rel_error), finite ones
    within the tolerance of the fused path against it."""
    for (name, a), (_, b) in zip(moments(got, op), moments(ref, op), strict=True):
        assert_close(a, b, kind(dtype), dtype, what=name)


@pytest.mark.parametrize("series", ["one", "several"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("op", ["filter", "smooth"])
def test_lost_series_follows_the_cpu_rule(auto_is_triton, served, op, dtype, series):
    # failed before: no warning (filter), InterpreterError (smooth)
    z, kw = gap_model(dtype, series)
    got, msgs = call(getattr(kd, op), torch.as_tensor(z, dtype=dtype, device=DEVICE),
                     **tensors(kw, dtype, DEVICE))  # fmt: skip
    assert served == [(op, True)], "the fused path must have served the call"
    ref, ref_msgs = reference(op, z, kw, dtype)
    at = "" if series == "one" else " at series index (1,)"
    assert msgs == ref_msgs == [expected_warning(dtype, at)]
    assert_matches(got, ref, op, dtype)
    # the lost series: finite before its lost step, its prediction there inf, NaN after
    f = got.filtered if op == "smooth" else got
    lane = (lambda t: t.cpu()) if series == "one" else (lambda t: t[:, 1].cpu())  # noqa: E731
    mean, pred = lane(f.mean), lane(f.pred_cov)
    assert bool(torch.isfinite(mean[:LOST_STEP]).all()) and bool(mean[LOST_STEP:].isnan().all())
    assert bool(torch.isposinf(torch.diagonal(pred[LOST_STEP])).all())
    assert bool(pred[LOST_STEP + 1 :].isnan().all())
    if op == "smooth":
        assert bool(lane(got.mean).isnan().all()) and bool(lane(got.cov).isnan().all())
    if series == "several":
        # the other series: as the fused path gives each alone, bit for bit, and finite
        for j in (0, 2):
            one = {k: (v[j] if k == "F" else v) for k, v in kw.items()}
            alone, none = call(getattr(kd, op), torch.as_tensor(z[:, j], dtype=dtype,
                               device=DEVICE), **tensors(one, dtype, DEVICE))  # fmt: skip
            assert none == [], f"series {j} alone warned: {none}"
            for (name, a), (_, b) in zip(moments(got, op), moments(alone, op), strict=True):
                part = a[j] if name.endswith("loglik") else a[:, j]
                assert torch.equal(part, b), f"series {j}, {name}: not as alone"
                assert bool(torch.isfinite(part).all()), (j, name)
        assert served[1:] == [(op, True)] * 2


@pytest.mark.parametrize("op", ["filter", "smooth"])
def test_trailing_gap(auto_is_triton, served, op):
    # d = 1 (the call's one read of the flags word, after the filter), n = 1 (padded): the
    # steps after the first are missing, the prediction passes the range at step 2 and no
    # observation follows. Before: log-likelihood -231.18 (the first step's term alone), no
    # warning; the smoothed means at steps 0 and 1 finite (0.3, 3e99), the reference's NaN
    z = np.array([[0.3]] + [[np.nan]] * 5)
    kw = dict(F=[[1e100]], Q=[[1.0]], H=[[1.0]], R=[[0.5]], prior_mean=[0.0], prior_cov=[[1.0]])
    dtype = torch.float64
    got, msgs = call(getattr(kd, op), torch.as_tensor(z, device=DEVICE),
                     **tensors(kw, dtype, DEVICE))  # fmt: skip
    assert served == [(op, True)], "the fused path must have served the call"
    ref, ref_msgs = reference(op, z, kw, dtype)
    assert msgs == ref_msgs == [expected_warning(dtype)]
    f = got.filtered if op == "smooth" else got
    assert bool(torch.isnan(f.loglik)), f"log-likelihood {float(f.loglik)}, the reference NaN"
    assert_matches(got, ref, op, dtype)


def test_lost_across_chunks(auto_is_triton, served, monkeypatch):
    # chunks of 2 steps over T = 12 (6 chunks, groups of 4 and 2: the two-level carries
    # forwards and backwards), the lost step (float32, F = 1000 I: variance x1e6 a step over a
    # gap; step 8) in the second group, a chunk after it: NaN flows through the later chunks'
    # carries and group elements, and past the observations after the gap; the other series,
    # in the same launches, as alone (16 steps and F = 60 I before: the same chunks and
    # groups at 4 chunks more). The lost series' variances before the lost step against the
    # exact recursion: 1.8e-2 off before chunk_elements took a step that shrinks its C
    # 1e4-fold in information form (0.7 after a 4e5 prediction at step 1, the next chunk's
    # carried start; tests/test_cuda_dense_f32_accuracy.py), 1.7e-7 now
    L = 2
    monkeypatch.setattr(CD, "chunk_length", lambda T: L)
    monkeypatch.setitem(CD.TUNING, "one_level", 4)
    T, dtype = 12, torch.float32
    NC = CD.cdiv(T, L)
    G = CD.group_size(NC)
    assert (NC, G) == (6, 4)
    rng = np.random.default_rng(8)
    z = rng.normal(size=(T, 2, 2))
    z[2:10, 1] = np.nan  # series 1: prediction ~1e6^k past 3.4e38 inside the gap
    z[rng.random(z.shape) < 0.1] = np.nan
    assert not np.isnan(z[10:, 1]).all()  # observed after the gap
    F = np.stack([np.array([[0.8, 0.1], [0.0, 0.6]]), 1000.0 * np.eye(2)])
    kw = dict(F=F, Q=Q2, H=H2, R=R2, **PRIOR)
    got, msgs = call(kd.smooth, torch.as_tensor(z, dtype=dtype, device=DEVICE),
                     **tensors(kw, dtype, DEVICE))  # fmt: skip
    assert served == [("smooth", True)], "the fused path must have served the call"
    ref, ref_msgs = reference("smooth", z, kw, dtype)
    assert msgs == ref_msgs == [expected_warning(dtype, " at series index (1,)")]
    lost = torch.isnan(ref.filtered.mean[:, 1, 0])
    first = int(lost.nonzero()[0])
    assert G * L <= first < T - L, (
        f"the lost step {first} must lie in the second group of chunks, a chunk after it"
    )
    for (name, a), (_, b) in zip(moments(got, "smooth"), moments(ref, "smooth"), strict=True):
        if name.endswith("loglik"):
            assert bool(a[1].isnan()) and not bool(a[0].isnan()), name
            continue
        a1, b1 = a[:, 1], b[:, 1]
        if name == "pred_cov":
            # the lost step's own prediction: +-inf on the CPU, NaN off the diagonal in the
            # fused products (inf * 0 terms); the same variances past the range in both
            fin = [torch.isfinite(torch.diagonal(p[first])) for p in (a1, b1)]
            assert torch.equal(*fin) and not bool(fin[0].all()), name
            a1, b1 = (
                torch.cat([a1[:first], a1[first + 1 :]]),
                torch.cat([b1[:first], b1[first + 1 :]]),
            )
        # the lost series: NaN where the reference's is (from the lost step on), close before
        assert torch.equal(a1.isnan(), b1.isnan()), name
        assert_close(a1[:first], b1[:first], kind(dtype), dtype, what=name)
        assert bool(torch.isfinite(a[:, 0]).all()), name  # the other series
    # the lost series' model is diagonal: per component the scalar recursion, exact to
    # float64's rounding (positive terms only)
    r, var, pred_var, filt_var = np.diag(R2), np.ones(2), [], []
    for t in range(first):
        var = 1000.0**2 * var + 1.0
        pred_var.append(var)
        var = np.where(np.isnan(z[t, 1]), var, var * r / (var + r))
        filt_var.append(var)
    for what, exact in (("pred_cov", pred_var), ("cov", filt_var)):
        v = torch.diagonal(getattr(got.filtered, what)[:first, 1].cpu(), dim1=-2, dim2=-1)
        err = float(np.abs(v.double().numpy() / np.array(exact) - 1).max())
        assert err <= 2e-6, f"lost series, {what}: variance per-step error {err:.2e}"
    one = {k: (v[0] if k == "F" else v) for k, v in kw.items()}
    alone = kd.smooth(torch.as_tensor(z[:, 0], dtype=dtype, device=DEVICE),
                      **tensors(one, dtype, DEVICE))  # fmt: skip
    for (name, a), (_, b) in zip(moments(got, "smooth"), moments(alone, "smooth"), strict=True):
        assert torch.equal(a[0] if name.endswith("loglik") else a[:, 0], b), f"series 0 {name}"


def test_trace_past_the_range_is_no_loss(auto_is_triton, served, lost_rule):
    # float32 predictions of 1.5e38 on the diagonal of three states, every entry finite: the
    # kernel's trace (4.5e38) passes the range and sets the LOST bit, the host's exact check
    # (every entry) finds none; nothing is NaN and nothing warns, as the float32 reference
    dtype = torch.float32
    # (two steps: one chunk interpreted too; the carry over a 1e38 prior is not float32's)
    z = np.array([[0.3, 0.1, -0.2], [0.2, np.nan, 0.1]])
    kw = dict(F=np.eye(3), Q=1e-3 * np.eye(3), H=np.eye(3), R=np.diag([0.5, 0.7, 0.6]),
              prior_mean=np.zeros(3), prior_cov=1.5e38 * np.eye(3))  # fmt: skip
    got, msgs = call(kd.filter, torch.as_tensor(z, dtype=dtype, device=DEVICE),
                     **tensors(kw, dtype, DEVICE))  # fmt: skip
    assert served == [("filter", True)] and lost_rule == [()], "the LOST bit must have been set"
    ref, ref_msgs = reference("filter", z, kw, dtype)
    assert msgs == ref_msgs == []
    assert bool(torch.isfinite(got.loglik))
    assert_matches(got, ref, "filter", dtype)


def test_screened_and_lost_runs_again(auto_is_triton, served, lost_rule):
    # a singular Q (valid) sets the value screen: the fused outputs of a flagged call with a
    # lost step are not used before the exact checks pass; then one launch more, unscreened,
    # whose outputs follow the rule
    z, F = gap_series(torch.float64)
    kw = dict(F=F, Q=np.diag([1.0, 0.0]), H=H2, R=R2, **PRIOR)
    got, msgs = call(kd.filter, torch.as_tensor(z, device=DEVICE),
                     **tensors(kw, torch.float64, DEVICE))  # fmt: skip
    assert served == [("filter", False), ("filter", True)] and lost_rule == [()]
    ref, ref_msgs = reference("filter", z, kw, torch.float64)
    assert msgs == ref_msgs == [expected_warning(torch.float64)]
    assert_matches(got, ref, "filter", torch.float64)


def test_ordinary_models_leave_the_bit_off(lost_rule):
    # random stable models (tests/test_cuda_dense.py's generator): the kernel's check never
    # fires, the host does nothing more than before
    from tests.test_cuda_dense import laid_out, random_model

    T = 3  # interpreted: 2 chunks of 2 and 1 steps, the carries between them
    assert CUDA or CD.cdiv(T, CD.chunk_length(T)) == 2
    for seed, n, d in [(1, 2, 1), (2, 3, 2)]:
        for dtype in DTYPES:
            z, kw = random_model(seed, n, d, T)
            model, layout = laid_out(z, kw, dtype)
            parts, flagged, gated = CD.run_smooth(model, layout)  # the filter's kernels too
            assert parts is not None and not flagged and not gated, (seed, n, dtype)
    assert lost_rule == [], "the LOST bit was set on an ordinary model"


def test_badly_conditioned_explosive_f_takes_the_torch_rule(auto_is_triton, served):
    # F = diag(1e100, .5): F F' + Q is outside the fused class (the gate: condition number past
    # 1 / (64 eps n^2)); the torch scan answers, with its OverflowError naming the cause (on
    # CUDA its lu_factor raises a plain RuntimeError, which kalmanscan.dense.api._torch reads)
    z, _ = gap_series(torch.float64)
    kw = dict(F=np.diag([1e100, 0.5]), Q=Q2, H=H2, R=R2, **PRIOR)
    with pytest.raises(OverflowError, match="predicted covariance passed float64's range"):
        kd.filter(torch.as_tensor(z, device=DEVICE), **tensors(kw, torch.float64, DEVICE))
    assert served == [("filter", False)]
