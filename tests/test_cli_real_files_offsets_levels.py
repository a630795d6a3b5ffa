"""Files and levels a probe of the command with real data found misread (2026-12-07):

- UTC offsets with seconds. pandas writes a zoned time before the zone's standard offset as the
  local mean time's offset (``Europe/Berlin`` before 1893: ``+00:53:28``; ``Africa/Monrovia``
  to 1972: ``-00:44:30``). Such a file was refused ("has a UTC offset but ... has none", false),
  or, with ``--time-format ...%z``, read with the offset dropped (pandas' ``%z`` keeps only its
  minutes), and the times not converted to UTC.
- Spreadsheets' midnights. Excel writes a datetime cell at midnight as the date alone
  (``13/02/2020`` beside ``13/02/2020 06:00``): a non-ISO column of both could not be read at
  all, with the format given or not (the ISO one could).
- Coverage levels. A repeated ``--coverage`` stopped the command with numpy's "only
  0-dimensional arrays can be converted to Python scalars", and the API built a Dataset whose
  ``coverage`` coordinate repeats; the summary and the plots' legends rounded 0.999 to "100%"
  and 0.975 to "98%" (results.csv's columns say 99.9 and 97.5).
- A long table (``--series-col``) was said to have as many rows as it has times.

Truths: the offsets' arithmetic by hand (a UTC time is the local time minus its offset), and
Python's ``datetime.fromisoformat``, which reads such offsets exactly.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("xarray")
pytest.importorskip("matplotlib")

import kalmanscan as ks  # noqa: E402
from kalmanscan.timeseries.cli import filter_main  # noqa: E402
from kalmanscan.timeseries.time_parse import parse_datetime_strings  # noqa: E402

GIVEN = ["--sigma2", "1", "--obs-var", "1"]


def _run(tmp_path, capsys, text, *args, name="in.csv"):
    path = tmp_path / name
    path.write_text(text)
    out = tmp_path / (name + "-out")
    rc = filter_main([str(path), *args, "--out", str(out)])
    cap = capsys.readouterr()
    return rc, cap.out + cap.err, out


def _utc(texts):
    """The truth: each text read by Python, as naive UTC datetime64[s]."""
    got = [dt.datetime.fromisoformat(t).astimezone(dt.timezone.utc) for t in texts]
    return np.array([g.replace(tzinfo=None) for g in got], dtype="datetime64[s]")


def _zoned_csv(zone, start, periods, freq="D"):
    idx = pd.date_range(start, periods=periods, freq=freq, tz=zone, name="t")
    return pd.Series(np.arange(periods) % 7.0, index=idx, name="y").to_csv()


# --- offsets with seconds -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "texts",
    [
        ["1960-01-01 00:00:00-00:44:30", "1960-01-02 00:00:00-00:44:30"],  # Monrovia
        ["1871-01-01 00:00:00+00:53:28", "1894-01-01 00:00:00+01:00"],  # Berlin, 1893's change
        ["1871-01-01T06:30:00+00:53:28", "1871-01-02T06:30:00Z"],  # with a Z
    ],
)
def test_offsets_with_seconds_read_to_utc(texts):
    got = parse_datetime_strings(texts)
    np.testing.assert_array_equal(got.astype("datetime64[s]"), _utc(texts))
    assert got[0].astype(object).second == _utc(texts)[0].astype(object).second != 0


def test_offsets_with_seconds_and_a_format_keep_the_seconds():
    texts = ["1960-01-01 00:00:00-00:44:30", "1960-01-02 00:00:00-00:44:30"]
    for fmt in ("%Y-%m-%d %H:%M:%S%z", "%Y-%m-%d %H:%M:%S %z"):
        got = parse_datetime_strings([t.replace("-00:44", " -00:44") if " %z" in fmt else t
                                      for t in texts], time_format=fmt)  # fmt: skip
        np.testing.assert_array_equal(got.astype("datetime64[s]"), _utc(texts))
    with pytest.raises(ValueError, match="does not end with: end it with %z"):
        parse_datetime_strings(texts, time_format="%Y-%m-%d %H:%M:%S")


def test_offset_with_seconds_out_of_range_refused():
    with pytest.raises(ValueError, match="position 1.*its UTC offset is no offset"):
        parse_datetime_strings(["1871-01-01 00:00:00+00:53:28", "1871-01-02 00:00:00+00:61:00"])


@pytest.mark.parametrize("zone,start", [("Africa/Monrovia", "1960-01-01"),
                                        ("Europe/Berlin", "1893-03-25 12:00")])  # fmt: skip
def test_cli_reads_pandas_zoned_file_before_standard_time(tmp_path, capsys, zone, start):
    text = _zoned_csv(zone, start, 20)
    rc, said, out = _run(tmp_path, capsys, text, "--time-col", "t", *GIVEN)
    assert rc == 0, said
    got = pd.read_csv(out / "results.csv").query("kind == 'data'")["time"]
    want = pd.read_csv(pd.io.common.StringIO(text))["t"]
    assert [w[-9:] for w in want[:1]] != ["+00:00"]  # (the fixture has offsets with seconds)
    truth = _utc(want)
    assert len(got) == len(truth) == 20
    np.testing.assert_array_equal(np.array([g.rstrip("Z") for g in got], "datetime64[s]"), truth)


def test_fit_ou_times_with_seconds_offsets():
    texts = [f"1960-01-{d:02d} 00:00:00-00:44:30" for d in range(1, 31)]
    y = np.random.default_rng(0).normal(size=30).cumsum() + np.random.default_rng(1).normal(size=30)
    fit = ks.fit_ou(y, times=texts)
    naive = ks.fit_ou(y, times=list(_utc(texts)))
    assert fit.loglik == pytest.approx(naive.loglik, rel=1e-12)


# --- spreadsheets' midnights --------------------------------------------------------------------
EXCEL_DAYFIRST = "Time,Value\n13/02/2020,1.0\n13/02/2020 06:00,1.2\n13/02/2020 12:00,0.9\n" \
                 "14/02/2020,1.1\n14/02/2020 06:00,1.4\n"  # fmt: skip
EXCEL_US = "Time,Value\n2/13/2020,1.0\n2/13/2020 6:00,1.2\n2/13/2020 12:00,0.9\n" \
           "2/14/2020,1.1\n2/14/2020 6:00 PM,1.4\n"  # fmt: skip
WANT = np.array(["2020-02-13T00:00", "2020-02-13T06:00", "2020-02-13T12:00", "2020-02-14T00:00",
                 "2020-02-14T06:00"], dtype="datetime64[s]")  # fmt: skip


@pytest.mark.parametrize("text", [EXCEL_DAYFIRST, EXCEL_US.replace(" PM", "")])
def test_midnights_written_as_the_date_alone(text):
    col = pd.read_csv(pd.io.common.StringIO(text))["Time"]
    np.testing.assert_array_equal(parse_datetime_strings(col).astype("datetime64[s]"), WANT)


def test_midnights_with_the_format_given(tmp_path, capsys):
    col = pd.read_csv(pd.io.common.StringIO(EXCEL_DAYFIRST))["Time"]
    got = parse_datetime_strings(col, time_format="%d/%m/%Y %H:%M")
    np.testing.assert_array_equal(got.astype("datetime64[s]"), WANT)
    rc, said, out = _run(tmp_path, capsys, EXCEL_DAYFIRST, "--time-col", "Time", *GIVEN)
    assert rc == 0, said
    times = pd.read_csv(out / "results.csv").query("kind == 'data'")["time"]
    np.testing.assert_array_equal(np.array(times, dtype="datetime64[s]"), WANT)


def test_a_date_that_is_not_one_still_refused():
    with pytest.raises(ValueError, match=r"'32/02/2020' \(position 1\)"):
        parse_datetime_strings(["13/02/2020 06:00", "32/02/2020", "14/02/2020"])


# --- coverage levels ------------------------------------------------------------------------------
FLOW = [1120, 1160, 963, 1210, 1160, 1160, 813, 1230, 1370, 1140, 995, 935, 1110, 994, 1020]
NILE = "year,flow\n" + "".join(f"{1871 + i},{v}\n" for i, v in enumerate(FLOW))


def test_repeated_coverage_refused(tmp_path, capsys):
    rc, said, _ = _run(tmp_path, capsys, NILE, "--time-col", "year", *GIVEN, "--forecast", "2",
                       "--coverage", "0.5", "0.5")  # fmt: skip
    assert rc == 2
    assert "--coverage: expected distinct levels, got 0.5 more than once among [0.5, 0.5]" in said
    model = ks.OUModel(sigma2=1.0, obs_var=1.0)
    with pytest.raises(ValueError, match="coverage: expected distinct levels"):
        model.to_dataset(np.array([1.0, 2.0, 3.0]), coverage=(0.9, 0.5, 0.9))


@pytest.mark.parametrize("level,label", [(0.999, "99.9%"), (0.975, "97.5%"), (0.9, "90%")])
def test_coverage_labels_in_their_digits(tmp_path, capsys, level, label):
    rc, said, out = _run(tmp_path, capsys, NILE, "--time-col", "year", *GIVEN, "--forecast", "2",
                         "--coverage", str(level))  # fmt: skip
    assert rc == 0, said
    summary = (out / "summary.txt").read_text()
    assert f"{label} predictive interval" in summary
    assert f"lower{label[:-1]}" in (out / "results.csv").read_text().splitlines()[0]


def test_plot_legend_labels_in_their_digits():
    import matplotlib

    matplotlib.use("Agg")
    from kalmanscan.plot import plot_bands

    ax = plot_bands(np.arange(5.0), np.zeros(5), np.ones(5), coverages=(0.975, 0.999))
    labels = ax.get_legend_handles_labels()[1]
    assert "97.5% band" in labels and "99.9% band" in labels


# --- a long table's count -------------------------------------------------------------------------
def test_long_table_counts_times_not_rows(tmp_path, capsys):
    rows = [f"{y},{f},{v}" for y in range(2000, 2010) for f, v in (("a", 1.0), ("b", 2.0))]
    text = "year,firm,v\n" + "\n".join(rows) + "\n"
    opts = ["--time-col", "year", "--series-col", "firm", "--value-col", "v"]
    rc, said, _ = _run(tmp_path, capsys, text, *opts, *GIVEN)
    assert rc == 0, said
    assert "10 times, 2 series (a, b), 0 missing values on that grid" in said
