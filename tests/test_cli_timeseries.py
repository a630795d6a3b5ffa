"""``kalmanscan demo`` and ``kalmanscan filter`` (kalmanscan.timeseries.cli)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

xr = pytest.importorskip("xarray")
pytest.importorskip("matplotlib")
pytest.importorskip("pandas")

from kalmanscan.testing import assert_close, tolerance  # noqa: E402
from kalmanscan.timeseries.cli import demo_main, filter_main  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
SENSORS = REPO / "examples" / "data" / "irregular_sensors.csv"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env["MPLBACKEND"] = "Agg"
    return env


def test_demo_end_to_end_through_the_kalmanscan_command(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "kalmanscan", "demo", "--out", str(out)],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "15098.5" in text and "1469.18" in text and "-632.5456" in text
    assert "  1971  " in text and "798.367" in text  # first forecast year and its mean at the MLE
    for name in ("nile.png", "nile.nc", "nile.csv", "summary.txt"):
        assert (out / name).exists(), name
    assert (out / "nile.png").read_bytes()[:8] == PNG_MAGIC
    ds = xr.load_dataset(out / "nile.nc")
    assert ds.sizes["time"] == 100 and ds.sizes["forecast_time"] == 10
    assert abs(float(ds["loglik"]) + 632.545625) < 1e-5
    assert abs(float(ds["obs_var"]) / 15099 - 1) < 5e-3


def test_demo_default_output_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert demo_main(["--forecast", "3", "--coverage", "0.8"]) == 0
    assert (tmp_path / "kalmanscan-demo" / "nile.nc").exists()
    ds = xr.load_dataset(tmp_path / "kalmanscan-demo" / "nile.nc")
    assert list(ds["coverage"].values) == [0.8] and ds.sizes["forecast_time"] == 3


def test_filter_irregular_csv_with_gaps_and_two_series(tmp_path, capsys):
    out = tmp_path / "results"
    rc = filter_main(
        [
            str(SENSORS),
            "--time-col",
            "t",
            "--value-col",
            "sensor_a",
            "--value-col",
            "sensor_b",
            "--fit",
            "--forecast",
            "10",
            "--out",
            str(out),
        ]
    )
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "fitting" in cap.err and "2/2" in cap.err  # progress bar
    assert "irregular spacing" in cap.out and "sensor_b" in cap.out
    ds = xr.load_dataset(out / "results.nc")
    assert ds["mean"].dims == ("time", "series") and list(ds["series"].values) == [
        "sensor_a",
        "sensor_b",
    ]
    assert ds["time"].dtype.kind == "M" and ds.sizes["time"] == 150
    assert np.isnan(ds["observed"].values).sum() == 28
    assert np.isfinite(ds["smoothed_mean"].values).all()
    assert ds.sizes["forecast_time"] == 10 and ds.attrs["time_unit"] == "1D"
    assert set(ds["converged"].values.tolist()) == {1}
    # the data were simulated with mu = 10 and 12: the fitted long-run means are close
    assert abs(float(ds["mu"].sel(series="sensor_a")) - 10) < 1.0
    assert abs(float(ds["mu"].sel(series="sensor_b")) - 12) < 1.5
    png = (out / "results.png").read_bytes()
    assert png[:8] == PNG_MAGIC and len(png) > 20_000
    assert (out / "summary.txt").read_text().startswith(str(SENSORS))
    import pandas as pd

    table = pd.read_csv(out / "results.csv")
    assert table.columns[:6].tolist() == ["kind", "time", "series", "observed", "mean", "sd"]
    assert (table["kind"] == "data").sum() == 300 and (table["kind"] == "forecast").sum() == 20
    row = table[(table["kind"] == "data") & (table["series"] == "sensor_b")].iloc[7]
    np.testing.assert_allclose(
        row["smoothed_mean"],
        ds["smoothed_mean"].sel(series="sensor_b").values[7],
        rtol=tolerance("csv", "float64"),
    )
    fc = table[table["kind"] == "forecast"]
    assert (fc["predictive_sd"] > fc["sd"]).all() and "upper90" in table


def test_filter_with_given_parameters_and_numeric_times(tmp_path, capsys):
    csv = tmp_path / "d.csv"
    csv.write_text("step,y\n0,1.0\n1,1.4\n2.5,\n4,0.7\n4.5,1.1\n")
    rc = filter_main(
        [
            str(csv),
            "--time-col",
            "step",
            "--sigma2",
            "0.5",
            "--obs-var",
            "0.2",
            "--theta",
            "0.1",
            "--mu",
            "1",
            "--out",
            str(tmp_path / "o"),
            "--quiet",
        ]
    )
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert cap.err == ""
    ds = xr.load_dataset(tmp_path / "o" / "results.nc")
    assert ds["time"].values.tolist() == [0.0, 1.0, 2.5, 4.0, 4.5]
    from kalmanscan.timeseries import OUModel

    ref = OUModel(theta=0.1, sigma2=0.5, mu=1.0, obs_var=0.2).filter(
        np.array([1.0, 1.4, np.nan, 0.7, 1.1]), np.array([0, 1, 2.5, 4, 4.5])
    )
    assert_close(ds["mean"].values[:, 0], ref.mean, "rounding", "float64", what="CLI mean")


def test_filter_local_level_with_fix_and_unsorted_rows(tmp_path, capsys):
    csv = tmp_path / "nile.csv"
    from kalmanscan.timeseries import load_nile

    years, flow = load_nile()
    rows = [f"{int(y)},{f}" for y, f in zip(years, flow, strict=False)]
    rows[3], rows[4] = rows[4], rows[3]
    csv.write_text("year,flow\n" + "\n".join(rows) + "\n")
    rc = filter_main(
        [
            str(csv),
            "--time-col",
            "year",
            "--fit",
            "--fix",
            "theta=0",
            "--fix",
            "mu=0",
            "--out",
            str(tmp_path / "o"),
        ]
    )
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "rows sorted by time" in cap.err
    assert "-632.5456" in cap.out


@pytest.mark.parametrize(
    "content, args, message",
    [
        (None, ["--fit"], "no such file"),
        ("", ["--fit"], "the file is empty"),
        ("t,y\n", ["--time-col", "t", "--fit"], "no data rows"),
        ("t,y\n1,2\n", ["--time-col", "time", "--fit"], "--time-col 'time': no such column"),
        (
            "t,y\n1,2\n",
            ["--time-col", "t", "--value-col", "z", "--fit"],
            "--value-col 'z': no such column",
        ),
        (
            "t,y\n2024-01-01,1\nyesterday,2\n",
            ["--time-col", "t", "--fit"],
            "row 3: cannot parse 'yesterday' as a time",
        ),
        (
            "t,y\n1,2\n2,abc\n",
            ["--time-col", "t", "--value-col", "y", "--fit"],
            "column 'y' row 3: 'abc' is not a number",
        ),
        ("t,y\n1,2\n,3\n", ["--time-col", "t", "--fit"], "empty time at row 3"),
        ("t,label\n1,a\n2,b\n", ["--time-col", "t", "--fit"], "no numeric value columns"),
        ("t,y\n1,2\n2,3\n", ["--time-col", "t", "--no-such-flag"], None),
        (
            "t,y\n1,2\n2,3\n",
            ["--time-col", "t", "--sigma2", "1"],
            "give --fit, or the model parameters",
        ),
        (
            "t,y\n1,2\n2,3\n",
            ["--time-col", "t", "--fit", "--fix", "rate=1"],
            "--fix: expected NAME=VALUE",
        ),
        (
            "t,y\n1,2\n2,3\n",
            ["--time-col", "t", "--fit", "--obs-var", "1"],
            "--fit estimates the parameters",
        ),
        (
            "t,y\n1,2\n2,3\n",
            ["--time-col", "t", "--fit", "--coverage", "1.5"],
            "--coverage: expected probabilities",
        ),
    ],
    ids=[
        "missing-file",
        "empty-file",
        "header-only",
        "bad-time-col",
        "bad-value-col",
        "bad-time",
        "non-numeric",
        "empty-time",
        "no-numeric",
        "bad-flag",
        "no-params",
        "bad-fix",
        "fit-and-params",
        "bad-coverage",
    ],
)
def test_filter_bad_input_gives_a_clear_message_and_exit_2(
    tmp_path, capsys, content, args, message
):
    csv = tmp_path / "in.csv"
    if content is not None:
        csv.write_text(content)
    rc = filter_main([str(csv), *args, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2
    if message is not None:
        assert message in err, err
        assert err.startswith("kalmanscan filter: ")
    assert not (tmp_path / "o" / "results.nc").exists()


def test_filter_directory_instead_of_file(tmp_path, capsys):
    assert filter_main([str(tmp_path), "--fit"]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_help_exits_zero(capsys):
    assert filter_main(["--help"]) == 0
    assert "--value-col" in capsys.readouterr().out
    assert demo_main(["--help"]) == 0


@pytest.mark.parametrize(
    "content",
    ["t,y\n1,2\n", "t,y\n1,\n2,\n3,\n", "t,a,b\n1,1,\n2,2,3\n3,3,\n"],
    ids=["one-row", "all-missing", "one-of-two-series"],
)
def test_filter_fit_with_too_few_observations(tmp_path, capsys, content):
    csv = tmp_path / "few.csv"
    csv.write_text(content)
    rc = filter_main([str(csv), "--time-col", "t", "--fit", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "expected at least 2 observed values in every series" in err
    assert "Traceback" not in err
