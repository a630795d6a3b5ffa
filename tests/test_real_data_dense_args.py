"""Issue 22 item 13, the dense filter: ``kalmanscan.dense`` goes through the one argument layer
(kalmanscan/core/_args.py), so complex numbers, datetimes, strings and booleans are refused with
``ks.filter``'s messages instead of being coerced (imaginary part dropped, dates as day counts),
masked elements are missing data, and reversed or big-endian arrays read by value."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import kalmanscan as ks
import kalmanscan.dense as kd

T = 6
Z = np.array([[1.0], [2.0], [1.5], [2.5], [3.0], [2.0]])  # [T, d=1]
MODEL = dict(F=np.eye(1), Q=np.eye(1) * 0.2, H=np.eye(1), R=np.eye(1) * 0.5)

BAD_Z = {
    "complex": Z + 1j,
    "datetime": np.arange(T).reshape(T, 1).astype("datetime64[D]"),
    "timedelta": np.arange(T).reshape(T, 1).astype("timedelta64[s]"),
    "strings": Z.astype(str),
    "string-list": [[str(v)] for v in Z[:, 0]],
    "bool": Z > 2,
    "object": Z.astype(object),
}


def _message(fn, *args, **kw) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("error", np.exceptions.ComplexWarning)  # a coercion would warn
        with pytest.raises(TypeError) as info:
            fn(*args, **kw)
    return str(info.value)


@pytest.mark.parametrize("bad", list(BAD_Z))
@pytest.mark.parametrize("fn", ["filter", "smooth"])
def test_bad_observations_are_refused_with_ks_filter_message(fn, bad):
    got = _message(getattr(kd, fn), BAD_Z[bad], **MODEL)
    want = _message(ks.filter, BAD_Z[bad], obs_var=0.5, decay=1.0, process_var=0.2)
    assert got == want
    assert got.startswith("z: expected a real number or array of real numbers, got ")


@pytest.mark.parametrize("name", ["F", "Q", "H", "R", "offset", "prior_mean", "prior_cov"])
@pytest.mark.parametrize("bad", ["complex", "datetime", "strings", "bool"])
def test_bad_model_arrays_are_refused_by_name(name, bad):
    good = dict(MODEL, offset=np.zeros(1), prior_mean=np.zeros(1), prior_cov=np.eye(1))
    value = np.asarray(good[name])
    value = {
        "complex": value + 1j,
        "datetime": value.astype(np.int64).astype("datetime64[D]"),
        "strings": value.astype(str),
        "bool": value > 0,
    }[bad]
    msg = _message(kd.filter, Z, **dict(good, **{name: value}))
    assert msg.startswith(f"{name}: expected a real number or array of real numbers, got ")
    # the same words as ks.filter gives a parameter
    want = _message(ks.filter, Z[:, 0], obs_var=value.reshape(-1)[:1], decay=1.0, process_var=1.0)
    assert msg.split(", got ")[0].split(": ", 1)[1] == want.split(", got ")[0].split(": ", 1)[1]


@pytest.mark.parametrize("dtype", [torch.complex128, torch.int64, torch.bool])
def test_bad_tensors_are_refused_with_ks_filter_message(dtype):
    zt = torch.as_tensor(Z).to(dtype)
    params = {k: torch.as_tensor(v) for k, v in MODEL.items()}
    got = _message(kd.filter, zt, **params)
    want = _message(
        ks.filter, zt[:, 0], obs_var=torch.tensor(0.5, dtype=torch.float64), decay=1.0,
        process_var=0.2,
    )  # fmt: skip
    assert got == want == f"z: expected a floating-point tensor (float32 or float64), got {dtype}"


def test_masked_observations_are_missing():
    filled = Z.copy()
    filled[2] = -999.0
    masked = np.ma.masked_array(filled, mask=filled == -999.0)
    nan = Z.copy()
    nan[2] = np.nan
    for backend in ("torch", "sequential"):
        got = kd.filter(masked, **MODEL, backend=backend)
        want = kd.filter(nan, **MODEL, backend=backend)
        np.testing.assert_array_equal(got.mean, want.mean)
        assert got.loglik == want.loglik
        assert abs(got.mean[2, 0]) < 10  # -999 would pull the level far below


@pytest.mark.parametrize("how", ["reversed", "big-endian", "both"])
def test_reversed_and_big_endian_arrays_equal_their_native_copies(how):
    z = np.arange(12.0).reshape(T, 2) ** 1.5
    view = {"reversed": z[::-1], "big-endian": z.astype(">f8"), "both": z.astype(">f8")[::-1]}[how]
    native = np.ascontiguousarray(view, dtype=np.float64)
    m = dict(F=np.eye(2), Q=np.eye(2) * 0.3, H=np.eye(2), R=np.eye(2) * 0.5)
    got, want = kd.filter(view, **m), kd.filter(native, **m)
    np.testing.assert_array_equal(got.mean, want.mean)
    np.testing.assert_array_equal(got.cov, want.cov)


def test_a_negative_view_tensor_is_read_by_value():
    base = torch.as_tensor(Z)
    neg = torch._neg_view(base)
    assert neg.is_neg()
    params = {k: torch.as_tensor(v) for k, v in MODEL.items()}
    got = kd.filter(neg, **params, backend="torch")
    want = kd.filter(-base.clone(), **params, backend="torch")
    torch.testing.assert_close(got.mean, want.mean, rtol=0, atol=0)


def test_integer_and_float32_input_still_work():
    got = kd.filter(Z.astype(np.int64), **MODEL)
    want = kd.filter(Z.astype(np.int64).astype(np.float64), **MODEL)
    np.testing.assert_array_equal(got.mean, want.mean)
    assert kd.filter(Z.astype(np.float32), **MODEL).mean.dtype == np.float32
