"""Issue 22, the CLI on users' files: the right row blamed (item 5), non-numeric columns (6), the
units trap (7), CLI polish (9), never writing over an input or outside --out (10), every listed
error as one line with exit status 2 (15, and 3 through the CLI), and the round-trip property."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("xarray")
pytest.importorskip("matplotlib")

from kalmanscan.testing import tolerance  # noqa: E402
from kalmanscan.timeseries.cli import filter_main  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
GIVEN = ["--sigma2", "1", "--obs-var", "1", "--quiet"]
# drawn (tests/conftest.py's png_not_rasterized): dates before 1000 and times of day, UTC
# times, values of 1e200 and 1e300 that fit (listed errors), replaced links, and the round
# trip's generated tables (1-12 rows, all values missing, dates over 9000 years)
PNG_DRAWN = {
    "test_results_csv_writes_four_digit_years_and_times_of_day",
    "test_times_with_utc_offsets_are_written_as_utc_and_marked",
    "test_listed_errors_exit_2_with_one_line",
    "test_a_link_in_out_pointing_elsewhere_is_replaced_not_followed",
    "test_accepted_csvs_round_trip_in_sorted_unique_time_order",
}


def _csv(tmp_path, text, name="in.csv"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _walk(n=50, seed=1, scale=1.0):
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.normal(size=n)) * scale + rng.normal(size=n) * scale


def _series_csv(tmp_path, z, name="in.csv", header="t,y"):
    return _csv(
        tmp_path, header + "\n" + "".join(f"{i},{float(v)!r}\n" for i, v in enumerate(z)), name
    )


def _one_line_exit_2(rc, err):
    assert rc == 2, err
    assert err.startswith("kalmanscan filter: ") and err.count("\n") == 1, err
    assert "Traceback" not in err


# --- item 5: the right row ------------------------------------------------------------------------
def test_numeric_times_with_a_word_blame_its_row(tmp_path, capsys):
    path = _csv(tmp_path, "t,y\n1,2\n2,3\nyesterday,4\n4,5\n")
    rc = filter_main([path, "--time-col", "t", *GIVEN, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    _one_line_exit_2(rc, err)
    assert "column 't' row 4: cannot parse 'yesterday' as a time" in err


def test_rows_count_comment_lines_as_in_the_file(tmp_path, capsys):
    path = _csv(tmp_path, "# station 7\n# units: m\nt,y\n1,2\n2,abc\n")
    rc = filter_main([path, "--time-col", "t", *GIVEN, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    _one_line_exit_2(rc, err)
    assert "column 'y' row 5: 'abc' is not a number" in err


# --- item 6: non-numeric columns without --value-col ----------------------------------------------
def test_a_word_in_a_column_of_numbers_is_an_error_not_a_dropped_column(tmp_path, capsys):
    path = _csv(tmp_path, "t,y,z\n1,2,5\n2,abc,6\n3,4,7\n")
    rc = filter_main([path, "--time-col", "t", *GIVEN, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    _one_line_exit_2(rc, err)
    assert "column 'y' row 3: 'abc' is not a number" in err


def test_a_label_column_is_skipped_with_a_note(tmp_path, capsys):
    path = _csv(tmp_path, "t,station,y\n1,a,2\n2,a,3\n3,a,4\n")
    rc = filter_main(
        [path, "--time-col", "t", "--sigma2", "1", "--obs-var", "1", "--out", str(tmp_path / "o")]
    )
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "skipped column(s) ['station']" in err
    assert set(pd.read_csv(tmp_path / "o" / "results.csv")["series"]) == {"y"}


def test_the_only_column_holding_words_gives_the_documented_message(tmp_path, capsys):
    path = _csv(tmp_path, "t,y\n1,abc\n2,def\n")
    rc = filter_main([path, "--time-col", "t", *GIVEN, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    _one_line_exit_2(rc, err)
    # docs/cli.md's error table: "column 'y' row 3: 'abc' is not a number (leave the cell empty"
    assert "column 'y' row 2: 'abc' is not a number (leave the cell empty" in err
    assert "no numeric value columns" in err


# --- item 7: rates per --time-unit ----------------------------------------------------------------
def test_given_rates_on_annual_dates_warn_that_they_are_per_time_unit(tmp_path, capsys):
    z = 1000 + _walk(30, scale=100)
    text = "date,flow\n" + "".join(f"{1871 + i}-01-01,{v}\n" for i, v in enumerate(z))
    path = _csv(tmp_path, text)
    args = [path, "--time-col", "date", "--sigma2", "1469.1", "--obs-var", "15099", "--quiet"]
    assert filter_main([*args, "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert "rates per --time-unit (1D)" in err and "median 365" in err
    assert "--time-unit 365" in err
    summary = (tmp_path / "o" / "summary.txt").read_text()
    assert "rates per --time-unit" in summary
    assert filter_main([*args, "--time-unit", "365D", "--out", str(tmp_path / "p")]) == 0
    assert "rates per" not in capsys.readouterr().err


# --- item 9: CLI polish ---------------------------------------------------------------------------
def test_help_shows_each_default_once_and_version_is_there(capsys):
    assert filter_main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "(default: None)" not in out and "(default: 1D)" in out
    assert out.count("default: kalmanscan-results") == 1
    assert filter_main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("kalmanscan filter ")
    from kalmanscan.cli import main

    assert main(["--version"]) == 0
    import kalmanscan

    assert capsys.readouterr().out.strip() == f"kalmanscan {kalmanscan.__version__}"


# --- item 10: never write over an input, never outside --out --------------------------------------
def test_an_input_inside_out_named_like_an_output_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    path = _series_csv(out, _walk(), name="results.csv")
    before = pathlib.Path(path).read_bytes()
    rc = filter_main([path, "--time-col", "t", *GIVEN, "--out", str(out)])
    err = capsys.readouterr().err
    _one_line_exit_2(rc, err)
    assert "would overwrite the input" in err
    assert pathlib.Path(path).read_bytes() == before
    assert sorted(os.listdir(out)) == ["results.csv"]


def test_summary_txt_as_input_with_out_dot_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _series_csv(tmp_path, _walk(), name="summary.txt")
    before = (tmp_path / "summary.txt").read_bytes()
    rc = filter_main(["summary.txt", "--time-col", "t", *GIVEN, "--out", "."])
    _one_line_exit_2(rc, capsys.readouterr().err)
    assert (tmp_path / "summary.txt").read_bytes() == before


def test_hard_and_symbolic_links_to_the_input_are_refused(tmp_path, capsys):
    data = _series_csv(tmp_path, _walk(), name="data.csv")
    before = pathlib.Path(data).read_bytes()
    for kind in ("hard", "sym"):
        out = tmp_path / kind
        out.mkdir()
        (os.link if kind == "hard" else os.symlink)(data, out / "results.nc")
        rc = filter_main([data, "--time-col", "t", *GIVEN, "--out", str(out)])
        _one_line_exit_2(rc, capsys.readouterr().err)
        assert pathlib.Path(data).read_bytes() == before


def test_a_link_in_out_pointing_elsewhere_is_replaced_not_followed(tmp_path, capsys):
    outside = tmp_path / "elsewhere.txt"
    outside.write_text("keep me\n")
    out = tmp_path / "o"
    out.mkdir()
    os.symlink(outside, out / "summary.txt")
    data = _series_csv(tmp_path, _walk())
    assert filter_main([data, "--time-col", "t", *GIVEN, "--out", str(out)]) == 0
    assert outside.read_text() == "keep me\n"
    assert not (out / "summary.txt").is_symlink()
    assert "log-likelihood" in (out / "summary.txt").read_text()
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]


# --- item 15 (and 3 through the CLI): one line, exit status 2 -------------------------------------
def _cases(tmp_path):
    z = _walk()
    good = _series_csv(tmp_path, z, "good.csv")
    huge = z.copy()
    huge[10] = 1e300
    (tmp_path / "a_file").write_text("x")
    return [
        (
            "out-is-a-file",
            [good, "--time-col", "t", "--fit", "--out", str(tmp_path / "a_file")],
            "exists and is not a directory",
        ),
        (
            "fix-obs-var-0",
            [good, "--time-col", "t", "--fit", "--fix", "obs_var=0"],
            "--fix obs_var: expected a finite number > 0",
        ),
        (
            "all-fixed",
            [
                good,
                "--time-col",
                "t",
                "--fit",
                "--fix",
                "theta=0",
                "--fix",
                "mu=0",
                "--fix",
                "sigma2=1",
                "--fix",
                "obs_var=1",
            ],
            "every parameter is fixed",
        ),
        ("fix-mu-1e308", [good, "--time-col", "t", "--fit", "--fix", "mu=1e308"], None),
        (
            "mixed-tz",
            [
                _csv(tmp_path, "t,y\n2024-01-01T00:00+01:00,1\n2024-01-02T00:00,2\n", "tz.csv"),
                "--time-col",
                "t",
                *GIVEN,
            ],
            "UTC offset",
        ),
        (
            "times-1e308",
            [_csv(tmp_path, "t,y\n-1e308,1\n1e308,2\n", "big.csv"), "--time-col", "t", *GIVEN],
            "span is finite",
        ),
        (
            "values-1e200-fit",
            [_series_csv(tmp_path, z * 1e200, "e200.csv"), "--time-col", "t", "--fit"],
            None,
        ),
        (
            "one-cell-1e300",
            [_series_csv(tmp_path, huge, "huge.csv"), "--time-col", "t", "--fit"],
            None,
        ),
        (
            "forecast-1e8",
            [good, "--time-col", "t", *GIVEN, "--forecast", "100000000"],
            "--forecast: expected a number of steps from 0 to",
        ),
        (
            "time-1e400",
            [_csv(tmp_path, "t,y\n1,1\n1e400,2\n", "inf.csv"), "--time-col", "t", *GIVEN],
            "row 3: '1e400' is not a finite time",
        ),
    ]


CASE_IDS = [
    "out-is-a-file",
    "fix-obs-var-0",
    "all-fixed",
    "fix-mu-1e308",
    "mixed-tz",
    "times-1e308",
    "values-1e200-fit",
    "one-cell-1e300",
    "forecast-1e8",
    "time-1e400",
]


@pytest.mark.parametrize("case", CASE_IDS)
def test_listed_errors_exit_2_with_one_line(tmp_path, capsys, case):
    name, args, message = next(c for c in _cases(tmp_path) if c[0] == case)
    if "--out" not in args:
        args = [*args, "--out", str(tmp_path / "o")]
    rc = filter_main([*args, "--quiet"])
    err = capsys.readouterr().err
    if rc == 0:  # a fit that succeeds (scale-free fitting) must not warn in many lines either
        assert "Traceback" not in err
        return
    lines = [line for line in err.splitlines() if "warning:" not in line]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("kalmanscan filter: "), err
    if message:
        assert message in lines[0], err


def test_the_entry_point_exits_2_in_a_fresh_interpreter(tmp_path):
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    data = _series_csv(tmp_path, _walk())
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kalmanscan",
            "filter",
            data,
            "--time-col",
            "t",
            "--fit",
            "--fix",
            "obs_var=0",
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr


def _written_times(tmp_path, rows, name):
    """``kalmanscan filter`` on a CSV of ``rows`` (a header ``t,y`` first): results.csv's times."""
    path = _csv(tmp_path, "\n".join(["t,y", *rows]) + "\n", f"{name}.csv")
    assert filter_main([path, *GIVEN, "--time-col", "t", "--out", str(tmp_path / name)]) == 0
    text = (tmp_path / name / "results.csv").read_text().splitlines()
    return [line.split(",")[1] for line in text[1 : len(rows) + 1]]


def test_results_csv_writes_four_digit_years_and_times_of_day(tmp_path):
    """Dates before the year 1000 keep their zero padding (ISO 8601 readers refuse '548-08-01'),
    times of day keep the seconds they have."""
    rows = ["0548-08-01,1.0", "0548-08-02,2.0", "0548-08-04,1.5"]
    assert _written_times(tmp_path, rows, "a") == ["0548-08-01", "0548-08-02", "0548-08-04"]
    rows = ["2024-05-07 10:00:00,1.0", "2024-05-07 10:00:30.5,2.0"]
    want = ["2024-05-07 10:00:00.000", "2024-05-07 10:00:30.500"]
    assert _written_times(tmp_path, rows, "b") == want


def test_times_with_utc_offsets_are_written_as_utc_and_marked(tmp_path, capsys):
    """Offsets are applied (the docs: times become UTC); every output says so, so that 10:00+02:00
    does not come back as an unmarked 08:00."""
    pytest.importorskip("xarray")
    rows = ["t,y", "2024-05-07T10:00:00+02:00,1.0", "2024-05-07T11:00:00+02:00,2.0",
            "2024-05-07T12:30:00+02:00,1.5"]  # fmt: skip
    out = tmp_path / "o"
    args = [_csv(tmp_path, "\n".join(rows) + "\n"), "--sigma2", "1", "--obs-var", "1"]
    assert filter_main([*args, "--time-col", "t", "--forecast", "1", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "column 't' gives UTC offsets: the times are converted to UTC" in captured.err
    table = pd.read_csv(out / "results.csv", keep_default_na=False)
    assert table["time"].tolist() == [
        "2024-05-07 08:00:00Z", "2024-05-07 09:00:00Z", "2024-05-07 10:30:00Z",
        "2024-05-07 11:45:00Z",
    ]  # fmt: skip
    assert pd.Timestamp(table["time"][0]) == pd.Timestamp("2024-05-07T10:00:00+02:00")
    assert "times in UTC (the input's offsets applied)" in (out / "summary.txt").read_text()
    import xarray as xr

    with xr.open_dataset(out / "results.nc") as ds:
        assert ds["time"].attrs["time_zone"] == "UTC"


# --- the property: accepted CSVs round-trip through results.csv -----------------------------------
hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies


@st.composite
def _tables(draw):
    n = draw(st.integers(1, 12))
    kind = draw(st.sampled_from(["int", "float", "date", "dayfirst", "none"]))
    pool = st.integers(-(10**6), 10**6)
    if kind == "float":
        pool = st.floats(-1e12, 1e12, allow_nan=False).map(lambda x: round(x, 3))
    if kind in ("date", "dayfirst"):
        pool = st.integers(-200_000, 2_900_000)  # days from 0001-01-01 (9000 years)
    keys = draw(st.lists(pool, min_size=n, max_size=n, unique=True))
    values = draw(
        st.lists(
            st.one_of(st.none(), st.floats(-1e6, 1e6, allow_nan=False)), min_size=n, max_size=n
        )
    )
    return kind, keys, values


def _render(kind, keys):
    if kind in ("int", "none"):
        return [str(k) for k in keys]
    if kind == "float":
        return [repr(float(k)) for k in keys]
    base = (
        np.datetime64("0001-01-01")
        + np.array(keys) * np.timedelta64(1, "D")
        + 200_000 * np.timedelta64(1, "D")
    )
    d = [str(x) for x in base.astype("datetime64[D]")]
    if kind == "date":
        return d
    return [f"{x[8:10]}/{x[5:7]}/{x[:4]}" for x in d]


@hypothesis.settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture],
)
@hypothesis.given(table=_tables())
def test_accepted_csvs_round_trip_in_sorted_unique_time_order(tmp_path_factory, table):
    kind, keys, values = table
    tmp = tmp_path_factory.mktemp("prop")
    stamps = _render(kind, keys)
    # a missing value is an empty cell; alone on its line that would be a blank line (no row)
    cells = [("NaN" if kind == "none" else "") if v is None else repr(v) for v in values]
    header = "y" if kind == "none" else "t,y"
    rows = [c if kind == "none" else f"{s},{c}" for s, c in zip(stamps, cells, strict=True)]
    path = _csv(tmp, header + "\n" + "\n".join(rows) + "\n")
    args = [path, *GIVEN, "--out", str(tmp / "o")]
    if kind != "none":
        args += ["--time-col", "t"]
    rc = filter_main(args)
    if rc != 0:
        return  # refused (e.g. ambiguous day-first dates): nothing is written
    table_out = pd.read_csv(tmp / "o" / "results.csv", keep_default_na=False)
    data = table_out[table_out["kind"] == "data"]
    order = np.argsort(np.array(keys), kind="stable") if kind != "none" else np.arange(len(keys))
    assert len(data) == len(keys)
    if kind in ("int", "float"):
        np.testing.assert_array_equal(data["time"].astype(float), np.sort(np.array(keys, float)))
    elif kind in ("date", "dayfirst"):
        got = data["time"].astype(str).tolist()  # ISO 8601 dates exactly (four-digit years)
        want = [_render("date", [keys[i]])[0] for i in order]
        assert got == want
    observed = np.array([np.nan if c == "" else float(c) for c in data["observed"]])
    want_obs = np.array([np.nan if values[i] is None else values[i] for i in order], float)
    np.testing.assert_allclose(observed, want_obs, rtol=tolerance("csv", "float64"))


# --- separate fits of many series: notes and warnings name the series they concern --------------
def _wide_csv(tmp_path, columns: dict, n: int):
    header = "t," + ",".join(columns)
    rows = [f"{i}," + ",".join(repr(float(v[i])) for v in columns.values()) for i in range(n)]
    return _csv(tmp_path, header + "\n" + "\n".join(rows) + "\n")


@pytest.mark.parametrize("n_series", [3, 52])  # one series a block; two a block
def test_block_fits_name_the_series_of_their_notes(tmp_path, capsys, n_series):
    rng = np.random.default_rng(3)
    n = 80
    noisy = lambda: 0.3 * np.cumsum(rng.normal(size=n)) + 3 * rng.normal(size=n)  # noqa: E731
    cols = {f"noisy{k}": noisy() for k in range(n_series - 1)}
    # an integrated walk, smooth without noise: obs_var on its bound
    cols["walk"] = np.cumsum(np.cumsum(rng.normal(size=n)))
    path = _wide_csv(tmp_path, cols, n)
    out = tmp_path / "o"
    fix = ["--fix", "theta=0", "--fix", "mu=0"]  # local level: white noise is obs_var's alone
    rc = filter_main([path, "--time-col", "t", "--fit", *fix, "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 0, err
    ds = __import__("xarray").load_dataset(out / "results.nc")
    at_bound = [str(s) for s in ds["series"].values if float(ds["obs_var"].sel(series=s)) < 1e-6]
    assert at_bound == ["walk"]
    bound = [ln for ln in err.splitlines() if "obs_var is at its lower bound" in ln]
    assert len(bound) == 1 and "'walk'" in bound[0] and "noisy" not in bound[0], bound
    assert " in series 0" not in err and "series 0," not in err
    summary = (out / "summary.txt").read_text()
    for line in summary.splitlines():
        if "obs_var is at its lower bound" in line:
            assert "'walk'" in line and "noisy" not in line, line


def test_a_constant_column_is_named_before_fitting(tmp_path, capsys):
    cols = {"a": _walk(40, seed=1), "flat": np.full(40, 40.0), "b": _walk(40, seed=2)}
    rc = filter_main([_wide_csv(tmp_path, cols, 40), "--time-col", "t", "--fit", "--quiet",
                      "--out", str(tmp_path / "o")])  # fmt: skip
    err = capsys.readouterr().err
    _one_line_exit_2(rc, err)
    assert "column(s) 'flat' (40) hold one value only" in err
    huge = {"a": _walk(40, seed=1), "big": _walk(40, seed=2, scale=1e200)}
    rc = filter_main([_wide_csv(tmp_path, huge, 40), "--time-col", "t", "--fit", "--quiet",
                      "--out", str(tmp_path / "o")])  # fmt: skip
    err = capsys.readouterr().err
    _one_line_exit_2(rc, err)
    assert "--fit: series 'big': the data's scale" in err


def test_outputs_get_the_permissions_of_any_new_file(tmp_path, capsys):
    old = os.umask(0o022)
    try:
        out = tmp_path / "o"
        args = [_series_csv(tmp_path, _walk()), "--time-col", "t", *GIVEN]
        rc = filter_main([*args, "--out", str(out)])
    finally:
        os.umask(old)
    assert rc == 0, capsys.readouterr().err
    for p in out.iterdir():
        assert (p.stat().st_mode & 0o777) == 0o644, p
