"""Forecasts of business-daily records (trading days) fall on business days, not weekends."""

import numpy as np
import pytest

import kalmanscan as ks
from kalmanscan.timeseries import as_time_axis

pd = pytest.importorskip("pandas")


def _days(ax_labels):
    return [str(x)[:10] for x in ax_labels]


def test_trading_days_skip_weekends():
    t = pd.bdate_range("2024-01-01", periods=60)  # ends Friday 2024-03-22
    z = pd.Series(np.random.default_rng(0).normal(size=60).cumsum(), index=t)
    fc = ks.forecast(ks.OUModel(sigma2=1.0, obs_var=1.0), z, steps=6)
    assert _days(fc.times) == [
        "2024-03-25", "2024-03-26", "2024-03-27", "2024-03-28", "2024-03-29", "2024-04-01",
    ]  # fmt: skip
    assert np.is_busday(np.asarray(fc.times, dtype="datetime64[D]")).all()
    # the level's variance grows with the calendar time to each date (Monday: 3 days)
    v = fc.var
    assert v[5] - v[4] == pytest.approx(3 * (v[1] - v[0]), rel=1e-9)


def test_time_of_day_and_holidays_kept():
    t = pd.bdate_range("2024-01-01", periods=30).delete([10, 11]) + pd.Timedelta(hours=16)
    ax = as_time_axis(t.values, len(t))
    got = ax.future(2)
    assert [str(x) for x in got.astype("datetime64[s]")] == [
        "2024-02-12T16:00:00", "2024-02-13T16:00:00",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "times",
    [
        pd.date_range("2024-01-01", periods=30, freq="D"),  # every day: by the median step
        pd.bdate_range("2024-01-01", periods=5),  # Monday to Friday: no weekend seen
        pd.bdate_range("2024-01-01", periods=30, freq="8h"),  # several a day
        pd.date_range("2024-01-01", periods=30, freq="W-MON"),  # weekly
    ],
)
def test_other_records_by_their_step(times):
    ax = as_time_axis(times.values, len(times))
    step = ax.step()
    want = ax.labels[-1] + np.arange(1, 4) * step
    np.testing.assert_array_equal(ax.future(3), want)


def test_cli_fred_export(tmp_path):
    from kalmanscan.cli import main
    from tests.test_cli_missing_markers import FRED

    path = tmp_path / "dgs10.csv"
    path.write_text(FRED)
    out = tmp_path / "out"
    rc = main(
        ["filter", str(path), "--time-col", "DATE", "--missing", ".", "--sigma2", "0.003",
         "--obs-var", "0.0005", "--forecast", "3", "--quiet", "--out", str(out)]
    )  # fmt: skip
    assert rc == 0
    table = pd.read_csv(out / "results.csv")
    fc = table[table["kind"] == "forecast"]["time"].tolist()
    assert fc == ["2024-01-22", "2024-01-23", "2024-01-24"]  # Friday 19th, then Monday on
