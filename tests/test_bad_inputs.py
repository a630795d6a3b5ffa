"""Bad input at every user entry point: a clear exception (or a CLI exit code and message), never a
silent NaN, a hang or a crash.

One table per kind of entry point. Each row: a readable id, the call, the exception type(s) and the
substrings the message must contain — the argument's name, what was expected and, where it has a
printable form, the value received. Every call runs under an alarm, so a hang fails the test.

Entry points: ``filter``, ``smooth``, ``discretize_ou``, ``fit_ou``, ``OUModel``, ``forecast``, the
xarray ``.kalman`` accessor, ``KLAConfig``/``KLALayer``, the KLA op, checkpoint loading (corrupt,
truncated and mismatched files) and the ``kalmanscan filter`` / ``inspect`` commands (bad CSVs).
"""

# ruff: noqa: E501  (the tables below keep one bad input per line)
from __future__ import annotations

import json
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

import kalmanscan as ks
from kalmanscan.timeseries import OUModel, fit_ou, forecast

ROOT = Path(__file__).resolve().parents[1]
TIME_LIMIT_S = 120
Z = np.array([1.0, 2.0, np.nan, 1.5, 1.2])
Z2 = np.random.default_rng(0).normal(size=(5, 2))
TIMES = np.arange(5.0)


@contextmanager
def time_limit(seconds=TIME_LIMIT_S):
    """Fail instead of hanging (SIGALRM; a no-op where it is unavailable)."""
    if not hasattr(signal, "SIGALRM"):
        yield
        return

    def boom(signum, frame):
        raise TimeoutError(f"call did not return within {seconds} s")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def case(id_, fn, exc, *needles, xfail=None):
    marks = [pytest.mark.xfail(strict=True, reason=xfail)] if xfail else []
    return pytest.param(fn, exc, needles, id=id_, marks=marks)


def check_raises(fn, exc, needles, *args):
    with time_limit():
        with pytest.raises(exc) as info:
            out = fn(*args)
            # reaching here means no exception: show what came back (a silent NaN, typically)
            print("returned without error:", out)
    msg = str(info.value)
    for needle in needles:
        assert needle in msg, f"message {msg!r} lacks {needle!r}"


def filt(**kw):
    args = dict(z=Z, obs_var=1.0, decay=0.9, process_var=0.1)
    args.update(kw)
    return ks.filter(
        args.pop("z"), args.pop("obs_var"), args.pop("decay"), args.pop("process_var"), **args
    )


def smoo(**kw):
    args = dict(z=Z, obs_var=1.0, decay=0.9, process_var=0.1)
    args.update(kw)
    return ks.smooth(
        args.pop("z"), args.pop("obs_var"), args.pop("decay"), args.pop("process_var"), **args
    )


# ------------------------------------------------------------------------------ core filter/smooth
# fmt: off
CORE = [
    case("filter-z-ragged-list", lambda: filt(z=[[1.0, 2.0], [3.0]]), TypeError, "z:", "expected"),
    case("filter-z-datetime", lambda: filt(z=np.array(["2020-01-01"], "datetime64[D]")), TypeError, "z:", "expected", "datetime64"),
    case("filter-z-minus-inf", lambda: filt(z=np.array([1.0, -np.inf, 2.0, 0.0, 1.0])), ValueError, "z:", "expected", "-inf", "(1,)"),
    case("filter-z-no-steps-many-lanes", lambda: filt(z=np.ones((0, 3))), ValueError, "z:", "expected", "(0, 3)"),
    case("filter-z-complex-tensor", lambda: filt(z=torch.ones(5, dtype=torch.complex64)), TypeError, "z:", "expected", "complex64"),
    case("filter-obs_var-minus-inf", lambda: filt(obs_var=-np.inf), ValueError, "obs_var:", "expected", "-inf"),
    case("filter-obs_var-int-tensor", lambda: filt(z=torch.tensor(Z), obs_var=torch.ones(5, dtype=torch.int32)), TypeError, "obs_var:", "expected", "int32"),
    case("filter-obs_var-zero-at-one-step", lambda: filt(obs_var=np.array([1.0, 1.0, 1.0, 0.0, 1.0])), ValueError, "obs_var:", "expected", "0.0", "(3,)"),
    case("filter-decay-bool", lambda: filt(decay=True), TypeError, "decay:", "expected", "True"),
    case("filter-decay-complex", lambda: filt(decay=0.5 + 1j), TypeError, "decay:", "expected", "complex"),
    case("filter-z-longdouble", lambda: filt(z=np.ones(5, dtype=np.longdouble)), TypeError, "z:", "expected float16, float32 or float64", "extended precision", "np.asarray(z, dtype=np.float64)"),
    case("filter-obs_var-longdouble", lambda: filt(obs_var=np.longdouble(0.5)), TypeError, "obs_var:", "expected float16, float32 or float64", "longdouble"),
    case("filter-decay-nan-in-time", lambda: filt(decay=np.array([0.9, 0.9, np.nan, 0.9, 0.9])), ValueError, "decay:", "expected", "NaN", "(2,)"),
    case("filter-process_var-minus-inf", lambda: filt(process_var=-np.inf), ValueError, "process_var:", "expected", "-inf"),
    case("filter-process_var-negative-tensor", lambda: filt(z=torch.tensor(Z), process_var=torch.tensor([0.1, -1e-9, 0.1, 0.1, 0.1], dtype=torch.float64)), ValueError, "process_var:", "expected", "(1,)"),
    case("filter-loading-inf", lambda: filt(loading=np.inf), ValueError, "loading:", "expected", "inf"),
    case("filter-offset-nan", lambda: filt(offset=np.nan), ValueError, "offset:", "expected", "NaN"),
    case("filter-time-varying-wrong-length", lambda: filt(decay=np.full(4, 0.9)), ValueError, "decay:", "expected", "(5,)", "(4,)"),
    case("filter-param-too-many-dims", lambda: filt(obs_var=np.ones((5, 1, 1, 2))), ValueError, "obs_var:", "expected", "(5, 1, 1, 2)"),
    case("filter-lanes-mismatch", lambda: filt(z=Z2, obs_var=np.ones(3)), ValueError, "obs_var:", "expected", "(5, 2)", "(3,)"),
    case("filter-prior_var-minus-inf", lambda: filt(prior_var=-np.inf), ValueError, "prior_var:", "expected", "-inf"),
    case("filter-prior_mean-inf", lambda: filt(prior_mean=np.inf), ValueError, "prior_mean:", "expected", "inf"),
    case("filter-prior-with-time-axis", lambda: filt(z=Z2, prior_var=np.ones((5, 2))), ValueError, "prior_var:", "expected", "lane shape", "(5, 2)"),
    case("filter-init-three-fields", lambda: filt(init=(1.0, 0.0, 0.0)), TypeError, "init:", "expected", "InfoState"),
    case("filter-init-lam-nan", lambda: filt(init=ks.InfoState(np.nan, 0.0)), ValueError, "init.lam:", "expected", "NaN"),
    case("filter-init-lam-inf", lambda: filt(init=ks.InfoState(np.inf, 0.0)), ValueError, "init.lam:", "expected", "inf"),
    case("filter-init-lane-shape", lambda: filt(z=Z2, init=ks.InfoState(np.ones(3), np.zeros(3))), ValueError, "init.lam:", "expected", "(2,)", "(3,)"),
    case("filter-init-eta-nan", lambda: filt(init=ks.InfoState(1.0, np.nan)), ValueError, "init.eta:", "expected", "NaN"),
    case("filter-axis-bool", lambda: filt(axis=True), TypeError, "axis:", "expected an int", "True"),
    case("filter-axis-none", lambda: filt(axis=None), TypeError, "axis:", "expected an int", "None"),
    case("filter-axis-negative-range", lambda: filt(z=Z2, axis=-3), ValueError, "axis:", "expected", "-3"),
    case("filter-backend-none", lambda: filt(backend=None), ValueError, "backend:", "expected", "None"),
    case("filter-backend-case", lambda: filt(backend="Torch"), ValueError, "backend:", "expected", "'Torch'"),
    case("filter-mismatched-devices", lambda: filt(z=torch.tensor(Z), obs_var=torch.ones(5, dtype=torch.float64, device="meta")), ValueError, "obs_var:", "expected a tensor on cpu", "meta"),
    case("filter-obs_var-subnormal", lambda: filt(obs_var=1e-310), ValueError, "obs_var:", "expected", "1e-310"),
    case("filter-obs_var-subnormal-f32", lambda: filt(z=Z.astype(np.float32), obs_var=np.float32(1e-39)), ValueError, "obs_var:", "expected"),
    case("filter-loading-overflows-precision", lambda: filt(loading=1e200), ValueError, "loading", "expected", "1e+200"),
    case("smooth-obs_var-nan", lambda: smoo(obs_var=np.array([1.0, np.nan, 1.0, 1.0, 1.0])), ValueError, "obs_var:", "expected", "NaN"),
    case("smooth-z-string", lambda: smoo(z="1,2,3"), TypeError, "z:", "expected", "'1,2,3'"),
    case("smooth-triton-on-cpu", lambda: smoo(backend="triton"), ValueError, "backend:", "'triton'", "cpu"),
    case("smooth-z-bool-tensor", lambda: smoo(z=torch.ones(5, dtype=torch.bool)), TypeError, "z:", "expected", "torch.bool"),
    # discretize_ou
    case("discretize-theta-minus-inf", lambda: ks.discretize_ou(-np.inf, 1.0, 1.0), ValueError, "theta:", "expected", "-inf"),
    case("discretize-sigma2-negative", lambda: ks.discretize_ou(1.0, -2.0, 1.0), ValueError, "sigma2:", "expected", "-2.0"),
    case("discretize-dt-nan", lambda: ks.discretize_ou(1.0, 1.0, np.array([1.0, np.nan])), ValueError, "dt:", "expected", "NaN"),
    case("discretize-theta-int-tensor", lambda: ks.discretize_ou(torch.tensor([1, 2]), 1.0, 1.0), TypeError, "theta:", "expected", "int64"),
    case("discretize-dt-strings", lambda: ks.discretize_ou(1.0, 1.0, ["1s", "2s"]), TypeError, "dt:", "expected"),
    case("discretize-shapes", lambda: ks.discretize_ou(np.ones(2), np.ones(3), 1.0), ValueError, "theta, sigma2, dt:", "expected", "(2,)", "(3,)"),
]
# fmt: on


@pytest.mark.parametrize("fn,exc,needles", CORE)
def test_core_bad_input(fn, exc, needles):
    check_raises(fn, exc, needles)


# ------------------------------------------------------------------ time series: fit, model, forecast
MODEL = OUModel(theta=0.1, sigma2=1.0, mu=0.0, obs_var=0.5)
# fmt: off
TS = [
    case("fit-times-non-monotonic", lambda: fit_ou(Z, np.array([0.0, 1.0, 3.0, 2.0, 4.0])), ValueError, "times:", "expected non-decreasing", "2.0 after 3.0"),
    case("fit-times-length", lambda: fit_ou(Z, np.arange(4.0)), ValueError, "times:", "expected 5 timestamps", "(4,)"),
    case("fit-times-nan", lambda: fit_ou(Z, np.array([0.0, 1.0, np.nan, 3.0, 4.0])), ValueError, "times:", "expected finite", "nan"),
    case("fit-times-nat", lambda: fit_ou(Z, np.array(["2024-01-01", "NaT", "2024-01-03", "2024-01-04", "2024-01-05"], "datetime64[D]")), ValueError, "times:", "expected valid datetimes", "NaT"),
    case("fit-times-strings-garbage", lambda: fit_ou(Z, np.array(["a", "b", "c", "d", "e"], dtype=object)), (TypeError, ValueError), "times:"),
    case("fit-too-few-observations", lambda: fit_ou(np.array([np.nan, 1.0, np.nan, np.nan])), ValueError, "z:", "expected at least 2 observed", "1"),
    case("fit-fix-unknown-key", lambda: fit_ou(Z, fix={"rate": 1.0}), ValueError, "fix:", "expected", "'rate'"),
    case("fit-fix-negative", lambda: fit_ou(Z, fix={"obs_var": -1.0}), ValueError, "fix['obs_var']:", "expected", "-1.0"),
    case("fit-fix-not-dict", lambda: fit_ou(Z, fix=[("theta", 0.0)]), TypeError, "fix:", "expected a dict", "list"),
    case("fit-fix-everything", lambda: fit_ou(Z, fix=dict(theta=0.0, sigma2=1.0, mu=0.0, obs_var=1.0)), ValueError, "fix:", "nothing to fit"),
    case("fit-init-negative", lambda: fit_ou(Z, init={"sigma2": -1.0}), ValueError, "init['sigma2']:", "expected", "-1.0"),
    case("fit-z-inf", lambda: fit_ou(np.array([1.0, np.inf, 2.0, 3.0])), ValueError, "z:", "expected finite", "inf"),
    case("fit-z-strings", lambda: fit_ou(["a", "b", "c"]), TypeError, "z:", "expected"),
    case("fit-time_unit-with-numbers", lambda: fit_ou(Z, TIMES, time_unit="1D"), ValueError, "time_unit:", "numeric times", "'1D'"),
    case("fit-time_unit-garbage", lambda: fit_ou(Z, np.arange(5).astype("datetime64[D]"), time_unit="fortnightly"), ValueError, "time_unit:", "expected a duration", "'fortnightly'"),
    case("fit-time_unit-negative", lambda: fit_ou(Z, np.arange(5).astype("datetime64[D]"), time_unit="-1D"), ValueError, "time_unit:", "expected a positive duration", "-1D"),
    case("fit-axis-range", lambda: fit_ou(Z2, axis=2), ValueError, "axis:", "expected an int", "2"),
    case("model-theta-negative", lambda: OUModel(theta=-0.1), ValueError, "theta:", "expected", "-0.1"),
    case("model-obs_var-zero", lambda: OUModel(obs_var=0.0), ValueError, "obs_var:", "expected", "0.0"),
    case("model-sigma2-nan", lambda: OUModel(sigma2=np.nan), ValueError, "sigma2:", "expected", "nan"),
    case("model-prior_var-negative", lambda: OUModel(prior_var=-1.0), ValueError, "prior_var:", "expected", "-1.0"),
    case("model-mu-string", lambda: OUModel(mu="zero"), TypeError, "mu:", "expected", "'zero'"),
    case("model-filter-times-decreasing", lambda: MODEL.filter(Z, np.array([4.0, 3.0, 2.0, 1.0, 0.0])), ValueError, "times:", "expected non-decreasing"),
    case("forecast-steps-negative", lambda: forecast(MODEL, Z, steps=-1), ValueError, "steps:", "expected", "-1"),
    case("forecast-steps-float", lambda: forecast(MODEL, Z, steps=2.5), ValueError, "steps:", "expected", "2.5"),
    case("forecast-steps-and-at", lambda: forecast(MODEL, Z, steps=2, at=[10.0]), ValueError, "steps, at:", "exactly one"),
    case("forecast-neither", lambda: forecast(MODEL, Z), ValueError, "steps, at:", "exactly one"),
    case("forecast-at-in-the-past", lambda: forecast(MODEL, Z, TIMES, at=[1.0]), ValueError, "at:", "expected timestamps at or after", "1.0"),
    case("forecast-at-datetime-for-numbers", lambda: forecast(MODEL, Z, TIMES, at=np.array(["2030-01-01"], "datetime64[D]")), TypeError, "at:", "expected numbers"),
    case("forecast-coverage-one", lambda: forecast(MODEL, Z, steps=2, coverage=1.0), ValueError, "coverage:", "expected probabilities", "1.0"),
    case("forecast-model-type", lambda: forecast("ou", Z, steps=2), TypeError, "model_or_fit:", "expected an OUModel", "str"),
    case("forecast-z-none", lambda: forecast(MODEL, None, steps=2), ValueError, "z:", "expected"),
]
# fmt: on


@pytest.mark.parametrize("fn,exc,needles", TS)
def test_timeseries_bad_input(fn, exc, needles):
    check_raises(fn, exc, needles)


# ------------------------------------------------------------------------------------- xarray
def _da(times=None, series=3):
    import xarray as xr

    import kalmanscan.xarray  # noqa: F401  (registers .kalman)

    times = np.arange(6.0) if times is None else times
    data = np.random.default_rng(1).normal(size=(len(times), series))
    return xr.DataArray(
        data, dims=("time", "sensor"), coords={"time": times, "sensor": list("abc")[:series]}
    )


# fmt: off
XR = [
    case("xr-time_dim-missing", lambda: _da().kalman.filter(sigma2=1.0, obs_var=1.0, time_dim="t"), ValueError, "time_dim:", "expected one of", "'t'"),
    case("xr-params-missing", lambda: _da().kalman.filter(theta=0.1), ValueError, "sigma2, obs_var:", "required"),
    case("xr-unknown-param", lambda: _da().kalman.filter(sigma2=1.0, obs_var=1.0, rate=2.0), TypeError, "rate", "expected some of"),
    case("xr-model-and-params", lambda: _da().kalman.filter(MODEL, sigma2=1.0), ValueError, "model", "not both"),
    case("xr-model-type", lambda: _da().kalman.filter("ou"), TypeError, "model:", "expected an OUModel", "str"),
    case("xr-coverage-zero", lambda: _da().kalman.filter(sigma2=1.0, obs_var=1.0, coverage=(0.0, 0.9)), ValueError, "coverage:", "expected probabilities", "0.0"),
    case("xr-time-non-monotonic", lambda: _da(np.array([0.0, 2.0, 1.0, 3.0, 4.0, 5.0])).kalman.filter(sigma2=1.0, obs_var=1.0), ValueError, "expected non-decreasing", "1.0 after 2.0"),
    case("xr-obs_var-negative", lambda: _da().kalman.filter(sigma2=1.0, obs_var=-1.0), ValueError, "obs_var:", "expected", "-1.0"),
    case("xr-param-shape", lambda: _da().kalman.filter(sigma2=np.ones(7), obs_var=1.0), ValueError, "sigma2:", "expected", "(7,)"),
    case("xr-forecast-steps-and-at", lambda: _da().kalman.forecast(MODEL, steps=2, at=[9.0]), ValueError, "steps, at:", "exactly one"),
    case("xr-fit-bad-fix", lambda: _da().kalman.fit_ou(fix={"rate": 0.0}), ValueError, "fix:", "expected", "'rate'"),
    case("xr-filter_dataarray-numpy", lambda: __import__("kalmanscan.xarray").xarray.filter_dataarray(np.ones(3), MODEL), TypeError, "da:", "expected an xarray.DataArray", "ndarray"),
]
# fmt: on


@pytest.mark.parametrize("fn,exc,needles", XR)
def test_xarray_bad_input(fn, exc, needles):
    pytest.importorskip("xarray")
    check_raises(fn, exc, needles)


# ---------------------------------------------------------------------------------- KLA layer, op
def _kla_layer():
    from kalmanscan.kla import KLAConfig, KLALayer

    return KLALayer(8, KLAConfig(d_state=2, backend="sequential"))


def _kla_op(**over):
    from kalmanscan.core.kla_op import kla_filter

    B, L, M, S = 1, 4, 3, 2
    g = torch.Generator().manual_seed(0)
    args = dict(
        v=torch.randn(B, L, M, generator=g),
        Lv=torch.rand(B, L, M, generator=g) + 0.1,
        k=torch.randn(B, L, S, generator=g),
        q=torch.randn(B, L, S, generator=g),
        decay=torch.full((M, S), 0.9),
        process_var=torch.full((M, S), 0.1),
    )
    backend = over.pop("backend", "sequential")
    args.update(over)
    return kla_filter(**args, backend=backend)


def _cfg(**kw):
    from kalmanscan.kla import KLAConfig

    return KLAConfig(**kw)


# fmt: off
KLA = [
    case("klaconfig-d_state-zero", lambda: _cfg(d_state=0), ValueError, "d_state:", "expected a positive int", "0"),
    case("klaconfig-d_state-float", lambda: _cfg(d_state=2.5), ValueError, "d_state:", "expected a positive int", "2.5"),
    case("klaconfig-expand-negative", lambda: _cfg(expand=-1.0), ValueError, "expand:", "expected a positive number", "-1.0"),
    case("klaconfig-discretization", lambda: _cfg(discretization="euler"), ValueError, "discretization:", "expected one of", "'euler'"),
    case("klaconfig-gate", lambda: _cfg(gate_activation="tanh"), ValueError, "gate_activation:", "expected one of", "'tanh'"),
    case("klaconfig-dt-order", lambda: _cfg(dt_min=0.5, dt_max=0.1), ValueError, "dt_min, dt_max:", "expected dt_min <= dt_max", "0.5"),
    case("klaconfig-obs_var_min-nan", lambda: _cfg(obs_var_min=float("nan")), ValueError, "obs_var_min:", "expected a positive number", "nan"),
    case("klaconfig-backend-unknown", lambda: _cfg(backend="cuda"), ValueError, "backend:", "expected", "'cuda'"),
    case("klalayer-backend-unknown-forward", lambda: __import__("kalmanscan.kla").kla.KLALayer(8, _cfg(d_state=2, backend="cuda"))(torch.randn(1, 2, 8)), ValueError, "backend:", "expected", "'cuda'"),
    case("klalayer-d_model-zero", lambda: __import__("kalmanscan.kla").kla.KLALayer(0), ValueError, "d_model:", "expected a positive int", "0"),
    case("klalayer-config-dict", lambda: __import__("kalmanscan.kla").kla.KLALayer(8, {"d_state": 2}), TypeError, "config:", "expected a KLAConfig", "dict"),
    case("klalayer-x-2d", lambda: _kla_layer()(torch.randn(4, 8)), ValueError, "x:", "expected shape [B, L, 8]", "(4, 8)"),
    case("klalayer-x-width", lambda: _kla_layer()(torch.randn(1, 4, 7)), ValueError, "x:", "expected shape [B, L, 8]", "(1, 4, 7)"),
    case("klalayer-x-int", lambda: _kla_layer()(torch.ones(1, 4, 8, dtype=torch.int64)), TypeError, "x:", "expected a floating dtype", "int64"),
    case("klalayer-x-numpy", lambda: _kla_layer()(np.ones((1, 4, 8))), TypeError, "x:", "expected a torch.Tensor", "ndarray"),
    case("klalayer-x-empty-time", lambda: _kla_layer()(torch.randn(1, 0, 8)), ValueError, "expected non-empty"),
    case("klalayer-state-type", lambda: _kla_layer()(torch.randn(1, 1, 8), state=(1.0, 0.0)), TypeError, "state:", "expected a KLALayerState", "tuple"),
    case("klaop-k-shape", lambda: _kla_op(k=torch.randn(1, 5, 2)), ValueError, "k:", "expected shape [B, L, S]", "(1, 5, 2)"),
    case("klaop-v-int", lambda: _kla_op(v=torch.ones(1, 4, 3, dtype=torch.int32)), TypeError, "v:", "expected", "int32"),
    case("klaop-decay-shape", lambda: _kla_op(decay=torch.full((4, 2), 0.9)), ValueError, "decay:", "expected", "(4, 2)"),
    case("klaop-backend-unknown", lambda: _kla_op(backend="fast"), ValueError, "backend:", "expected", "'fast'"),
    case("klaop-process_var-negative", lambda: _kla_op(process_var=torch.full((3, 2), -0.1)), ValueError, "process_var:", "expected", "-0.1"),
    case("klaop-decay-nan", lambda: _kla_op(decay=torch.full((3, 2), float("nan"))), ValueError, "decay:", "expected", "NaN"),
    case("klaop-Lv-negative", lambda: _kla_op(Lv=-torch.ones(1, 4, 3)), ValueError, "Lv:", "expected", "-1"),
]
# fmt: on


@pytest.mark.parametrize("fn,exc,needles", KLA)
def test_kla_bad_input(fn, exc, needles):
    check_raises(fn, exc, needles)


# ------------------------------------------------------------------------------------ checkpoints
@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A valid tiny checkpoint plus one broken variant per case (name -> directory or path)."""
    from safetensors.torch import load_file, save_file

    from kalmanscan.kla import KLAConfig, KLALanguageModel, ModelConfig, save_checkpoint

    base = tmp_path_factory.mktemp("ckpt")
    cfg = ModelConfig(d_model=16, n_layers=1, kla=KLAConfig(d_state=2))
    good = save_checkpoint(KLALanguageModel(cfg), base / "good")
    weights = (good / "model.safetensors").read_bytes()
    config = json.loads((good / "config.json").read_text())
    state = load_file(str(good / "model.safetensors"))
    out = {"good": good}

    config_json = json.dumps(config)

    def variant(name, *, weights_bytes=weights, config_text=config_json, tensors=None):
        d = base / name
        d.mkdir()
        if tensors is not None:
            save_file(tensors, str(d / "model.safetensors"))
        elif weights_bytes is not None:
            (d / "model.safetensors").write_bytes(weights_bytes)
        if config_text is not None:
            (d / "config.json").write_text(config_text)
        out[name] = d
        return d

    out["missing"] = base / "does-not-exist"
    (base / "a-file").write_text("not a directory")
    out["file"] = base / "a-file"
    variant("no-weights", weights_bytes=None)
    d = variant("pickle-only", weights_bytes=None)
    torch.save(state, d / "model.pt")
    variant("no-config", config_text=None)
    variant("config-invalid-json", config_text="{'format': broken")
    variant(
        "config-wrong-format", config_text=json.dumps({"format": "other", "model": config["model"]})
    )
    variant(
        "config-unknown-key",
        config_text=json.dumps({**config, "model": {**config["model"], "depth": 3}}),
    )
    variant(
        "config-bad-value",
        config_text=json.dumps({**config, "model": {**config["model"], "d_model": -16}}),
    )
    variant("config-list", config_text="[1, 2, 3]")
    variant("weights-truncated", weights_bytes=weights[: len(weights) // 2])
    variant("weights-random-bytes", weights_bytes=np.random.default_rng(0).bytes(4096))
    variant("weights-empty", weights_bytes=b"")
    variant("weights-header-only", weights_bytes=weights[:8])
    variant(
        "shape-mismatch",
        config_text=json.dumps({**config, "model": {**config["model"], "d_model": 32}}),
    )
    missing = dict(state)
    missing.pop(sorted(missing)[0])
    variant("missing-key", tensors=missing)
    variant("extra-key", tensors={**state, "extra.weight": torch.zeros(2)})
    first = sorted(state)[0]
    variant("int-tensor", tensors={**state, first: state[first].to(torch.int32)})
    return out


def ck(id_, name, *needles, xfail=None):
    marks = [pytest.mark.xfail(strict=True, reason=xfail)] if xfail else []
    return pytest.param(name, needles, id=id_, marks=marks)


# fmt: off
CKPT = [
    ck("ckpt-missing-directory", "missing", "expected a directory", "does-not-exist"),
    ck("ckpt-path-is-a-file", "file", "expected a directory", "a-file"),
    ck("ckpt-no-weights", "no-weights", "expected weights", "model.safetensors"),
    ck("ckpt-pickle-only", "pickle-only", "pickle", "model.pt"),
    ck("ckpt-no-config", "no-config", "expected a config file", "config.json"),
    ck("ckpt-config-invalid-json", "config-invalid-json", "not valid JSON"),
    ck("ckpt-config-wrong-format", "config-wrong-format", "expected", "'format'"),
    ck("ckpt-config-list", "config-list", "expected", "list"),
    ck("ckpt-config-unknown-key", "config-unknown-key", "unknown model keys", "depth"),
    ck("ckpt-config-bad-value", "config-bad-value", "d_model:", "expected a positive int", "-16"),
    ck("ckpt-weights-truncated", "weights-truncated", "cannot read", "model.safetensors"),
    ck("ckpt-weights-random-bytes", "weights-random-bytes", "cannot read", "model.safetensors"),
    ck("ckpt-weights-empty", "weights-empty", "cannot read", "model.safetensors"),
    ck("ckpt-weights-header-only", "weights-header-only", "cannot read", "model.safetensors"),
    ck("ckpt-shape-mismatch", "shape-mismatch", "expected shape", "got [16"),
    ck("ckpt-missing-key", "missing-key", "missing keys (1)"),
    ck("ckpt-extra-key", "extra-key", "unexpected keys (1)", "extra.weight"),
    ck("ckpt-int-tensor", "int-tensor", "expected a floating-point tensor", "int32"),
]
# fmt: on


@pytest.mark.parametrize("name,needles", CKPT)
def test_checkpoint_bad_file(checkpoints, name, needles):
    from kalmanscan.kla import CheckpointError, load_checkpoint

    check_raises(lambda: load_checkpoint(checkpoints[name]), CheckpointError, needles)


def test_checkpoint_good_file_loads(checkpoints):
    """The broken variants above differ from a checkpoint that loads: the failures are theirs."""
    from kalmanscan.kla import load_checkpoint

    model = load_checkpoint(checkpoints["good"])
    assert not model.training


# -------------------------------------------------------------------------------------------- CLI
# fmt: off
CLI = [
    # (id, csv text or None for no file, extra args, needles in stderr[, xfail reason])
    ("cli-missing-file", None, ["--fit"], ["no such file"]),
    ("cli-empty-file", "", ["--fit"], ["the file is empty"]),
    ("cli-header-only", "t,y\n", ["--time-col", "t", "--fit"], ["no data rows"]),
    ("cli-missing-time-column", "t,y\n1,2\n2,3\n", ["--time-col", "time", "--fit"], ["--time-col 'time'", "no such column", "columns are ['t', 'y']"]),
    ("cli-missing-value-column", "t,y\n1,2\n2,3\n", ["--time-col", "t", "--value-col", "flow", "--fit"], ["--value-col 'flow'", "no such column"]),
    ("cli-unparseable-time", "t,y\n2024-01-01,1\n2024-13-45,2\n", ["--time-col", "t", "--fit"], ["column 't' row 3", "cannot parse '2024-13-45' as a time"]),
    ("cli-non-numeric-value", "t,y\n1,2\n2,two\n3,4\n", ["--time-col", "t", "--value-col", "y", "--fit"], ["column 'y' row 3", "'two' is not a number"]),
    ("cli-infinite-value", "t,y\n1,2\n2,inf\n3,4\n", ["--time-col", "t", "--value-col", "y", "--fit"], ["column 'y' row 3", "is infinite"]),
    ("cli-binary-garbage", "\x00\x01\x02\xff\xfe garbage \x00\n\x00\x00", ["--fit"], ["kalmanscan filter: "]),
    ("cli-sigma2-negative", "t,y\n1,2\n2,3\n3,4\n", ["--time-col", "t", "--sigma2", "-1", "--obs-var", "1"], ["--sigma2", "expected", "-1"]),
    ("cli-obs-var-zero", "t,y\n1,2\n2,3\n3,4\n", ["--time-col", "t", "--sigma2", "1", "--obs-var", "0"], ["--obs-var", "expected", "0"]),
    ("cli-theta-nan", "t,y\n1,2\n2,3\n3,4\n", ["--time-col", "t", "--sigma2", "1", "--obs-var", "1", "--theta", "nan"], ["theta", "expected", "nan"]),
    ("cli-forecast-negative", "t,y\n1,2\n2,3\n3,4\n", ["--time-col", "t", "--sigma2", "1", "--obs-var", "1", "--forecast", "-2"], ["--forecast", "expected", "-2"]),
    ("cli-fit-one-row", "t,y\n1,2\n", ["--time-col", "t", "--fit"], ["expected at least 2 observed"]),
    ("cli-fit-all-missing", "t,y\n1,\n2,\n3,\n", ["--time-col", "t", "--value-col", "y", "--fit"], ["expected at least 2 observed"]),
    ("cli-empty-time-cell", "t,y\n1,2\n,3\n", ["--time-col", "t", "--fit"], ["empty time at row 3"]),
    ("cli-fix-value-not-number", "t,y\n1,2\n2,3\n3,4\n", ["--time-col", "t", "--fit", "--fix", "theta=fast"], ["--fix theta", "expected a number", "'fast'"]),
]
# fmt: on


@pytest.mark.parametrize(
    "content,args,needles",
    [
        pytest.param(
            c[1],
            c[2],
            c[3],
            id=c[0],
            marks=[pytest.mark.xfail(strict=True, reason=c[4])] if len(c) > 4 else [],
        )
        for c in CLI
    ],
)
def test_cli_filter_bad_csv(tmp_path, capsys, content, args, needles):
    from kalmanscan.timeseries.cli import filter_main

    csv = tmp_path / "in.csv"
    if content is not None:
        csv.write_text(content, encoding="latin-1")
    out = tmp_path / "out"
    with time_limit():
        try:
            rc = filter_main([str(csv), *args, "--out", str(out)])
        except Exception as exc:  # an uncaught exception is a traceback for the user
            raise AssertionError(f"the command raised {type(exc).__name__}: {exc}") from exc
    err = capsys.readouterr().err
    assert rc != 0, "a bad input must give a non-zero exit status"
    for needle in needles:
        assert needle in err, f"stderr {err!r} lacks {needle!r}"
    assert "Traceback" not in err
    assert not (out / "results.nc").exists()


def test_cli_unsorted_rows_are_sorted_and_reported(tmp_path, capsys):
    """Non-monotonic timestamps in a CSV are not an error for the command: it sorts the rows and says so
    (the library functions, which take arrays, reject them: see fit-times-non-monotonic)."""
    from kalmanscan.timeseries.cli import filter_main

    csv = tmp_path / "in.csv"
    csv.write_text("t,y\n1,2\n3,4\n2,5\n4,6\n5,7\n")
    with time_limit():
        rc = filter_main(
            [
                str(csv),
                "--time-col",
                "t",
                "--sigma2",
                "1",
                "--obs-var",
                "1",
                "--out",
                str(tmp_path / "o"),
            ]
        )
    captured = capsys.readouterr()
    assert rc == 0
    assert "rows sorted by time" in captured.out + captured.err


@pytest.mark.slow  # one subprocess (a torch import) per command: 8 s
def test_commands_exit_nonzero_with_a_message(tmp_path):
    """The installed entry point itself (a fresh interpreter): unknown command, bad CSV, bad checkpoint."""
    csv = tmp_path / "bad.csv"
    csv.write_text("t,y\n1,2\n2,abc\n")
    runs = [
        (["frobnicate"], "unknown command 'frobnicate'"),
        (
            ["filter", str(csv), "--time-col", "t", "--value-col", "y", "--fit"],
            "'abc' is not a number",
        ),
        (["inspect", "hello", "--checkpoint", str(tmp_path / "nowhere")], "expected a directory"),
    ]
    for argv, needle in runs:
        proc = subprocess.run(
            [sys.executable, "-m", "kalmanscan", *argv],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=TIME_LIMIT_S,
        )
        assert proc.returncode != 0, argv
        assert needle in proc.stderr, (argv, proc.stderr)
        assert "Traceback" not in proc.stderr, (argv, proc.stderr)


def test_table_size():
    """The issue asks for at least 60 distinct bad inputs across the entry points."""
    n = len(CORE) + len(TS) + len(XR) + len(KLA) + len(CKPT) + len(CLI)
    assert n >= 60
    ids = [p.id for p in CORE + TS + XR + KLA + CKPT] + [c[0] for c in CLI]
    assert len(ids) == len(set(ids))


def test_ranges_ok_reads_back_once(monkeypatch):
    # the one-readback summary behind discretize_ou's and kla_filter's checks: right answers, and
    # a single host read however many inputs (a GPU synchronizes once per call, not per input)
    import torch

    from kalmanscan.core._args import ranges_ok

    reads = []
    tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: reads.append(1) or tolist(self))
    one = torch.tensor([1.0, 2.0])
    assert ranges_ok([(one, 0.0, False), (one, 1.0, False), (one, None, False)])
    assert len(reads) == 1
    assert not ranges_ok([(one, 1.0, True)])  # 1 is not > 1
    assert not ranges_ok([(torch.tensor([1.0, float("inf")]), None, False)])
    assert not ranges_ok([(torch.tensor([float("nan")], dtype=torch.bfloat16), None, False)])
    assert not ranges_ok([(one, None, False)], flags=[torch.tensor(False), torch.tensor(True)])
    assert ranges_ok([(one, None, False)], flags=[torch.tensor(False)])
    assert ranges_ok([(torch.empty(0), 0.0, False)]) and ranges_ok([])
