"""``kalmanscan filter`` reading the CSV files a probe of the command found misread (its report's
problems 1-6): points as thousands separators in a file separated by semicolons (German
spreadsheets' ``13.415``), a file without a header row, R's ``write.csv`` row names and other
columns without a name, year.month and year.quarter numbers as times, a spreadsheet's trailing
rows of separators, and ``--missing`` with a decimal comma. Each fixture is a few rows of the
probe's file, written inline (docs/cli.md)."""

from __future__ import annotations

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("xarray")
pytest.importorskip("matplotlib")

from kalmanscan.timeseries.cli import filter_main  # noqa: E402
from kalmanscan.timeseries.csvfile import read_csv_series  # noqa: E402

# (weekly periods read as their starts, PNG drawn; conftest.png_not_rasterized)
PNG_DRAWN = {"test_weekly_period_intervals_read_as_their_starts"}

GIVEN = ["--sigma2", "1", "--obs-var", "1"]
PROG = "kalmanscan filter: "


def _run(tmp_path, capsys, text, *args, name="in.csv", encoding="utf-8"):
    path = tmp_path / name
    path.write_bytes(text.encode(encoding))
    out = tmp_path / (name + "-out")
    rc = filter_main([str(path), *args, "--out", str(out)])
    cap = capsys.readouterr()
    return rc, cap.err, out, str(path)


def _observed(out) -> list:
    got = pd.read_csv(out / "results.csv").query("kind == 'data'")
    return got["observed"].tolist()


# --- 1. points as thousands separators in a file separated by semicolons --------------------------
# macrodata's realgdp and population as German Excel writes them ("#.##0"), in Windows-1252
MAC_DE = (
    "Quartal;BIP real (Mrd. $);Bevölkerung (Tsd.)\r\n"
    "01.01.1959;2.710;177.146\r\n01.04.1959;2.779;177.830\r\n01.07.1959;2.775;178.657\r\n"
    "01.10.1959;2.785;179.386\r\n01.01.1960;2.848;180.007\r\n01.04.1960;2.834;180.671\r\n"
)
SEMI_POINTS = "Datum;Wert\n2020-01-01;1.250\n2020-01-02;2.375\n2020-01-03;1.125\n" \
    "2020-01-04;1.500\n2020-01-05;2.000\n"  # fmt: skip


def test_points_followed_by_three_digits_in_a_semicolon_file_are_refused(tmp_path, capsys):
    # before: read as 1.25, 2.375, ... with no message (the comma analogue was refused)
    rc, err, _, path = _run(tmp_path, capsys, SEMI_POINTS, "--time-col", "Datum", *GIVEN)
    assert rc == 2
    assert err == (
        f"{PROG}{path}: column 'Wert' row 2: '1.250' reads as 1.25 (a decimal point) and as 1250 "
        "(a point as the thousands separator, as spreadsheets write where the comma is the "
        "decimal mark), and every point in the column is followed by three digits, in a file "
        "separated by semicolons; pass --decimal . to read the points as decimal points, or "
        "--decimal , to read them as thousands separators (and commas as the decimal mark)\n"
    )
    # the German export: refused naming its first column, not read 1000 times too small
    rc, err, _, _ = _run(tmp_path, capsys, MAC_DE, "--time-col", "Quartal", "--dayfirst", *GIVEN,
                         name="de.csv", encoding="cp1252")  # fmt: skip
    assert rc == 2 and "column 'BIP real (Mrd. $)' row 2: '2.710' reads as 2.71" in err
    # a point not followed by three digits, or 0.125, can only be a decimal point: read
    rc, err, out, _ = _run(tmp_path, capsys, "t;y\n1;1.250\n2;2.5\n3;0.125\n", "--time-col", "t",
                           *GIVEN, name="decimals.csv")  # fmt: skip
    assert rc == 0, err
    assert _observed(out) == [1.25, 2.5, 0.125]


@pytest.mark.parametrize(
    "mark,want",
    [(",", [1250.0, 2375.0, 1125.0, 1500.0, 2000.0]), (".", [1.25, 2.375, 1.125, 1.5, 2.0])],
    ids=["comma", "point"],
)
def test_decimal_option_states_the_convention(tmp_path, capsys, mark, want):
    rc, err, out, _ = _run(tmp_path, capsys, SEMI_POINTS, "--time-col", "Datum", "--decimal",
                           mark, *GIVEN)  # fmt: skip
    assert rc == 0, err
    assert _observed(out) == want
    assert ("read with --decimal ," in err) == (mark == ",")


def test_german_export_reads_exactly_with_decimal_comma(tmp_path, capsys):
    path = tmp_path / "de.csv"
    path.write_bytes(MAC_DE.encode("cp1252"))
    times, z, names, _ = read_csv_series(str(path), "Quartal", dayfirst=True, decimal=",")
    assert names == ["BIP real (Mrd. $)", "Bevölkerung (Tsd.)"]
    assert z[:, 0].tolist() == [2710.0, 2779.0, 2775.0, 2785.0, 2848.0, 2834.0]
    assert z[:, 1].tolist() == [177146.0, 177830.0, 178657.0, 179386.0, 180007.0, 180671.0]
    # a point that separates no thousands is refused with --decimal , (not read as 5.2 or 52)
    bad = tmp_path / "bad.csv"
    bad.write_text("t;y\n1;1.250,5\n2;5.2\n3;963\n")
    with pytest.raises(Exception, match=r"row 3: '5.2' has a point that is no thousands separator"):
        read_csv_series(str(bad), "t", decimal=",")
    # 1.250,5 and 963 with --decimal ,
    bad.write_text("t;y\n1;1.250,5\n2;963\n")
    assert read_csv_series(str(bad), "t", decimal=",")[1][:, 0].tolist() == [1250.5, 963.0]


@pytest.mark.parametrize(
    "text,says",
    [("t;y\n1;1.250\n2;2,5\n", "(the column writes decimals with commas: '2,5', row 3)"),
     ("t;y\n1;1.250\n2;1.250.000\n", "(as in '1.250.000', row 3)")],
    ids=["comma-decimal-beside", "two-points"],
)  # fmt: skip
def test_points_the_file_shows_are_thousands_are_refused_naming_the_evidence(
    tmp_path, capsys, text, says
):
    rc, err, _, path = _run(tmp_path, capsys, text, "--time-col", "t", *GIVEN)
    assert rc == 2
    assert f"column 'y' row 2: '1.250' has a point as a thousands separator {says}" in err
    assert "write 1250, or pass --decimal , to read points as thousands separators" in err


# --- 2. a file without a header row -----------------------------------------------------------
NILE_NOHEADER = "1871,1120.0\n1872,1160.0\n1873,963.0\n1874,1210.0\n1875,1160.0\n"


def test_a_header_of_numbers_is_refused_not_dropped(tmp_path, capsys):
    # before: "99 rows, 2 series (1871, 1120.0)": the first observation became the names
    rc, err, _, path = _run(tmp_path, capsys, NILE_NOHEADER, *GIVEN)
    assert rc == 2
    assert err == (
        f"{PROG}{path}: the header (row 1: '1871,1120.0') holds numbers and dates only, no column "
        "names: a file without a header row? its first row would be taken for the names and "
        "lost; add a header line naming the columns (e.g. time,value) before it, or, if these "
        "are the names, pass them to --time-col or --value-col\n"
    )
    # a date and a number in a file separated by semicolons: the same
    rc, err, _, _ = _run(tmp_path, capsys, "29.03.1958;12\n30.03.1958;14\n", *GIVEN)
    assert rc == 2 and "holds numbers and dates only, no column names" in err
    # the header, written: every row read
    rc, err, out, _ = _run(tmp_path, capsys, "year,volume\n" + NILE_NOHEADER, "--time-col",
                           "year", *GIVEN)  # fmt: skip
    assert rc == 0, err
    assert _observed(out) == [1120.0, 1160.0, 963.0, 1210.0, 1160.0]
    # names that are numbers, meant so: an option names one
    rc, err, out, _ = _run(tmp_path, capsys, NILE_NOHEADER, "--value-col", "1120.0", *GIVEN)
    assert rc == 0, err


# --- 3. columns without a name: R's write.csv row names, an empty header field -----------------
NILE_R = '"","year","volume"\r\n' + "".join(
    f'"{k}",{y},{v}\r\n'
    for k, (y, v) in enumerate(
        zip(range(1871, 1877), [1120.0, 1160.0, 963.0, 1210.0, 1160.0, 1160.0], strict=True), 1
    )  # fmt: skip
)


def test_r_write_csv_row_names_are_skipped_with_a_note(tmp_path, capsys):
    # before: a series "Unnamed: 0" of the row numbers 1..n fitted beside volume
    rc, err, out, _ = _run(tmp_path, capsys, NILE_R, "--time-col", "year", *GIVEN)
    assert rc == 0, err
    assert (
        "note: skipped the first column: no header and the row numbers 1, 2, 3, ... in it (the "
        "row names R's write.csv writes)" in err
    )
    assert pd.read_csv(out / "results.csv")["series"].unique().tolist() == ["volume"]


def test_an_unnamed_column_of_numbers_is_refused_naming_its_position(tmp_path, capsys):
    text = "year,,volume\n1871,1121.0,1120.0\n1872,1161.0,1160.0\n1873,964.0,963.0\n"
    rc, err, _, path = _run(tmp_path, capsys, text, "--time-col", "year", *GIVEN)
    assert rc == 2
    assert err == (
        f"{PROG}{path}: column 2 (after 'year') has no name in the header but holds numbers "
        "('1121.0', row 2): every column needs a name; name it in the header, or name the value "
        "columns to use with --value-col\n"
    )
    # the named column alone reads
    rc, err, out, _ = _run(tmp_path, capsys, text, "--time-col", "year", "--value-col", "volume",
                           *GIVEN)  # fmt: skip
    assert rc == 0, err
    assert _observed(out) == [1120.0, 1160.0, 963.0]
    # a header naming a column "Unnamed: 1" (as pandas would) is a name; the empty one is not
    text = "year,Unnamed: 1,\n1871,1120.0,1121.0\n1872,1160.0,1161.0\n"
    rc, err, _, _ = _run(tmp_path, capsys, text, "--time-col", "year", *GIVEN)
    assert rc == 2 and "column 3 (after 'Unnamed: 1') has no name in the header" in err


# --- 4. year.month and year.quarter numbers as times -------------------------------------------
MONTHS = "month,sst\n" + "".join(
    f"{1950 + k // 12}.{k % 12 + 1:02d},{20 + np.sin(k):.2f}\n" for k in range(15)
)
QUARTERS = "period,unemp\n" + "".join(
    f"{1959 + k // 4}.{k % 4 + 1},{5 + 0.1 * k:.1f}\n" for k in range(8)
)


def test_year_month_numbers_are_refused_and_time_format_reads_them(tmp_path, capsys):
    # before: decimal years, steps of 0.01 and 0.89, forecast at 1951.04, 1951.05
    rc, err, _, path = _run(tmp_path, capsys, MONTHS, "--time-col", "month", *GIVEN)
    assert rc == 2
    assert err == (
        f"{PROG}{path}: column 'month' holds year.month numbers (1950.01 to 1951.03): the part "
        "after the point counts the periods of each year and starts again at the next year, so "
        "read as numbers (decimal years) the steps would be 0.01 within a year and 0.89 from .12 "
        "to the next year's .01; pass --time-format %Y.%m to read them as months (or write them "
        "as dates, 1950-01)\n"
    )
    rc, err, out, _ = _run(tmp_path, capsys, MONTHS, "--time-col", "month", "--time-format",
                           "%Y.%m", "--forecast", "2", *GIVEN)  # fmt: skip
    assert rc == 0, err
    got = pd.read_csv(out / "results.csv")
    assert got["time"].tolist()[:2] == ["1950-01-01", "1950-02-01"]
    assert got.query("kind == 'forecast'")["time"].tolist() == ["1951-04-01", "1951-05-01"]
    # decimal years (1950.25, 1950.5) stay numbers
    text = "t,y\n" + "".join(f"{1950 + k / 4:g},{k}\n" for k in range(9))
    rc, err, out, _ = _run(tmp_path, capsys, text, "--time-col", "t", *GIVEN, name="dec.csv")
    assert rc == 0, err
    assert pd.read_csv(out / "results.csv")["time"].tolist()[:3] == [1950.0, 1950.25, 1950.5]


def test_year_quarter_numbers_are_refused_and_percent_q_reads_them(tmp_path, capsys):
    rc, err, _, _ = _run(tmp_path, capsys, QUARTERS, "--time-col", "period", *GIVEN)
    assert rc == 2
    assert "column 'period' holds year.quarter numbers (1959.1 to 1960.4)" in err
    assert "steps would be 0.1 within a year and 0.7 from .4 to the next year's .1" in err
    assert "pass --time-format %Y.%q to read them as quarters" in err
    rc, err, out, _ = _run(tmp_path, capsys, QUARTERS, "--time-col", "period", "--time-format",
                           "%Y.%q", "--time-unit", "91D", *GIVEN)  # fmt: skip
    assert rc == 0, err
    assert "note: column 'period' holds quarters (--time-format %Y.%q)" in err
    # the same quarters as labels (1959Q1, as statistics offices write them): the same results
    labels = "period,unemp\n" + "".join(
        f"{1959 + k // 4}Q{k % 4 + 1},{5 + 0.1 * k:.1f}\n" for k in range(8)
    )
    rc, err, want, _ = _run(tmp_path, capsys, labels, "--time-col", "period", "--time-unit",
                            "91D", *GIVEN, name="labels.csv")  # fmt: skip
    assert rc == 0, err
    pd.testing.assert_frame_equal(pd.read_csv(out / "results.csv"),
                                  pd.read_csv(want / "results.csv"))  # fmt: skip


# --- 5. a spreadsheet's trailing rows of separators ------------------------------------------
TRAILING = "year,volume\n1871,1120.0\n1872,1160.0\n1873,963.0\n,\n,\n,\n"


@pytest.mark.parametrize("time", [[], ["--time-col", "year"]], ids=["row-number", "time-col"])
def test_trailing_rows_of_separators_are_skipped_with_a_note(tmp_path, capsys, time):
    # before: 3 more time steps of missing values (a "1-step" forecast 4 steps ahead), or
    # with --time-col "column 'year' has an empty time at row 5"
    rc, err, out, path = _run(tmp_path, capsys, TRAILING, "--value-col", "volume", *time,
                              "--forecast", "1", *GIVEN)  # fmt: skip
    assert rc == 0, err
    assert (
        f"note: {path}: skipped the last 3 rows: separators only, no values (rows a spreadsheet "
        "exports after the data)" in err
    )
    got = pd.read_csv(out / "results.csv")
    assert got.query("kind == 'data'")["observed"].tolist() == [1120.0, 1160.0, 963.0]
    assert got.query("kind == 'forecast'")["time"].tolist() == [3.0 if not time else 1874]


def test_a_row_of_separators_between_rows_is_refused_with_a_time_column(tmp_path, capsys):
    text = "year,volume\n1871,1120.0\n,\n1873,963.0\n"
    rc, err, _, path = _run(tmp_path, capsys, text, "--time-col", "year", *GIVEN)
    assert rc == 2
    assert err == (
        f"{PROG}{path}: row 3 holds separators only, no time and no value: remove the row (or "
        "start it with #)\n"
    )


# --- 6. --missing with a decimal comma ------------------------------------------------------
def test_a_decimal_comma_marker_matches_by_value(tmp_path, capsys):
    # before: only the cell written -99,9 was missing; -99,90 stayed in the data as -99.9
    text = "t;y\n1;1,5\n2;-99,9\n3;1,25\n4;-99,90\n5;1,0\n"
    rc, err, out, _ = _run(tmp_path, capsys, text, "--time-col", "t", "--missing=-99,9", *GIVEN)
    assert rc == 0, err
    assert (
        "note: --missing -99,9: 2 cells read as missing (matched by value: -99,90 counts too), in "
        "column 'y'" in err
    )
    got = _observed(out)
    assert np.isnan(got).tolist() == [False, True, False, True, False]
    text = "Datum;Temp\n01.01.2020;1,5\n02.01.2020;-9999,0\n03.01.2020;1,25\n04.01.2020;-9999\n"
    rc, err, out, _ = _run(tmp_path, capsys, text, "--time-col", "Datum", "--dayfirst",
                           "--missing=-9999,0", *GIVEN)  # fmt: skip
    assert rc == 0, err
    assert np.isnan(_observed(out)).tolist() == [False, True, False, True]
    # one number given twice, with a comma and with a point: refused as other numbers are
    rc, err, _, _ = _run(tmp_path, capsys, text, "--time-col", "Datum", "--dayfirst",
                         "--missing=-9999,0", "--missing=-9999", *GIVEN)  # fmt: skip
    assert rc == 2 and "the same number as --missing" in err


# --- pandas' to_csv of a PeriodIndex: labels 1959Q1, 1998M1, and an unnamed index of years ----
def _pandas_csv(index, column: str, values: list, name: str | None) -> str:
    """``DataFrame.to_csv`` of one column on ``index`` (named ``name``; None: unnamed, as
    pandas writes an index without a name)."""
    frame = pd.DataFrame({column: values}, index=index)
    frame.index.name = name
    return frame.to_csv()


def _macro_quarters(named: bool) -> str:
    index = pd.period_range("1959Q1", periods=6, freq="Q")
    return _pandas_csv(index, "unemp", [5.8, 5.1, 5.3, 5.6, 5.2, 5.2], "date" if named else None)


@pytest.mark.parametrize("named", [True, False])
def test_a_column_of_period_labels_is_skipped_with_a_time_col_hint(tmp_path, capsys, named):
    # before: refused as numbers with a unit 'Q1' ("write the number alone, 1959"), and an
    # unnamed index of them as "holds numbers": advice that loses the quarter
    text = _macro_quarters(named)
    col = "date" if named else "Unnamed: 0"
    rc, err, out, _ = _run(tmp_path, capsys, text, *GIVEN)
    assert rc == 0, err
    assert (
        f"note: skipped column(s) [{col!r}]: no numbers in them (name value columns with "
        f"--value-col to use them; column {col!r} holds dates: pass --time-col {col!r} to use "
        "them as the times)" in err
    )
    assert "unit" not in err
    assert _observed(out) == [5.8, 5.1, 5.3, 5.6, 5.2, 5.2]
    # and the hint's option reads them as quarters
    rc, err, out, _ = _run(tmp_path, capsys, text, "--time-col", col, *GIVEN)
    assert rc == 0, err
    assert "holds quarter labels" in err
    times = pd.read_csv(out / "results.csv").query("kind == 'data'")["time"].tolist()
    assert times == ["1959-01-01", "1959-04-01", "1959-07-01", "1959-10-01", "1960-01-01",
                     "1960-04-01"]  # fmt: skip


def test_month_labels_are_not_numbers_with_a_unit(tmp_path, capsys):
    text = "period,y\n1998M1,1.0\n1998M2,2.0\n1998M3,1.5\n"
    rc, err, _, _ = _run(tmp_path, capsys, text, *GIVEN)
    assert rc == 0, err
    assert "column 'period' holds dates: pass --time-col 'period'" in err
    # a unit after a number is still refused as such
    rc, err, _, _ = _run(tmp_path, capsys, "t,y\n1,1.5 m3\n2,2.5 m3\n", "--time-col", "t", *GIVEN)
    assert rc == 2 and "a number with a unit ('m3') is not read" in err


def test_an_unnamed_first_column_of_numbers_names_the_time_col_option(tmp_path, capsys):
    # pandas' to_csv of a yearly PeriodIndex (or of float times) leaves the first name empty
    years = pd.period_range("2000", periods=3, freq="Y")
    text = pd.DataFrame({"y": [1.0, 2.0, 1.5]}, index=years).to_csv()
    rc, err, _, path = _run(tmp_path, capsys, text, *GIVEN)
    assert rc == 2
    assert err == (
        f"{PROG}{path}: column 1 (the first) has no name in the header but holds numbers "
        "('2000', row 2): every column needs a name; name it in the header, or name the value "
        "columns to use with --value-col, or pass --time-col 'Unnamed: 0' if they are the times "
        "(pandas' to_csv writes its index without a name)\n"
    )
    rc, err, out, _ = _run(tmp_path, capsys, text, "--time-col", "Unnamed: 0", *GIVEN)
    assert rc == 0, err
    assert _observed(out) == [1.0, 2.0, 1.5]


# --- pandas' to_csv of a weekly PeriodIndex: ISO 8601 intervals start/end ---------------------
def _weeks(named: bool) -> str:
    index = pd.period_range("2000-01-03", periods=5, freq="W")
    return _pandas_csv(index, "sales", [1.0, 2.0, 1.5, 1.75, 2.25], "week" if named else None)


@pytest.mark.parametrize("named", [True, False])
def test_weekly_period_intervals_read_as_their_starts(tmp_path, capsys, named):
    # before: "cannot parse '2000-01-03/2000-01-09' as a time", and no --time-col hint
    text = _weeks(named)
    assert "\n2000-01-03/2000-01-09," in text
    col = "week" if named else "Unnamed: 0"
    rc, err, out, _ = _run(tmp_path, capsys, text, *GIVEN)
    assert rc == 0, err
    assert f"column {col!r} holds dates: pass --time-col {col!r} to use them as the times" in err
    rc, err, out, _ = _run(tmp_path, capsys, text, "--time-col", col, "--forecast", "2", *GIVEN)
    assert rc == 0, err
    assert (
        f"note: column {col!r} holds intervals (start/end, as pandas writes weekly periods): "
        "each time is the start of its interval" in err
    )
    got = pd.read_csv(out / "results.csv")
    assert got.query("kind == 'data'")["time"].tolist() == [
        "2000-01-03", "2000-01-10", "2000-01-17", "2000-01-24", "2000-01-31"
    ]  # fmt: skip
    assert got.query("kind == 'forecast'")["time"].tolist() == ["2000-02-07", "2000-02-14"]
    assert _observed(out) == [1.0, 2.0, 1.5, 1.75, 2.25]


@pytest.mark.parametrize(
    "cell, why",
    [
        ("2000-01-17", "the other values are intervals (start/end) like '2000-01-03/2000-01-09'"),
        ("2000-01-17/", "not an interval of two dates or datetimes start/end, like the others: "
         "'2000-01-03/2000-01-09')"),
        ("2000-01-17/P1W", "not an interval of two dates or datetimes"),
        ("2000-01-17/2000-13-23", "an interval start/end, its end '2000-13-23' no date or time"),
        ("2000-01-23/2000-01-17", "an interval start/end that ends before it starts"),
    ],
)  # fmt: skip
def test_mixed_or_malformed_intervals_are_refused(tmp_path, capsys, cell, why):
    rows = ["2000-01-03/2000-01-09", "2000-01-10/2000-01-16", cell, "2000-01-24/2000-01-30"]
    text = "week,y\n" + "".join(
        f"{r},{v}\n" for r, v in zip(rows, [1.0, 2.0, 1.5, 1.8], strict=True)
    )
    rc, err, _, path = _run(tmp_path, capsys, text, "--time-col", "week", *GIVEN)
    assert rc == 2
    assert f"{path}: column 'week' row 4: cannot parse {cell!r} as a time ({why}" in err


def test_datetime_intervals_and_offsets_read_as_their_starts():
    from kalmanscan.timeseries.times import as_time_axis

    ax = as_time_axis(["2024-03-01T06:00/2024-03-01T12:00", "2024-03-01T12:00/2024-03-01T18:00"], 2)
    assert [str(t) for t in ax.labels] == ["2024-03-01T06:00:00", "2024-03-01T12:00:00"]
    zoned = as_time_axis(["2024-03-01T06:00+01:00/2024-03-01T12:00+01:00"], 1)
    assert zoned.utc and str(zoned.labels[0]) == "2024-03-01T05:00:00"
