"""CSV files as statistical offices and spreadsheets write them: quarter and month labels
(``1959Q1``, ``1959M01``), fields separated by semicolons, tabs or bars, decimal commas in files
not separated by commas, numbers with thousands separators (refused with a hint), Excel's exports
(``sep=`` line, Windows-1252, UTF-16, trailing empty columns), and long tables with a column
naming each row's series (``--series-col``). Each accepted form filters exactly like the same
data written as a plain comma CSV with ISO dates, one column a series."""

from __future__ import annotations

import contextlib
import functools
import io
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("xarray")
pytest.importorskip("matplotlib")

from kalmanscan.timeseries import as_time_axis  # noqa: E402
from kalmanscan.timeseries.cli import filter_main  # noqa: E402
from kalmanscan.timeseries.times import (  # noqa: E402
    TimeParseError,
    parse_datetime_strings,
    period_starts,
)

GIVEN = ["--sigma2", "4", "--obs-var", "1"]
# (millisecond times and forecasts, PNG drawn)
PNG_DRAWN = {"test_millisecond_forecasts_and_notes_kept_in_the_summary"}


def _run(tmp_path, capsys, text, name, *extra):
    path = tmp_path / name
    path.write_text(text)
    out = tmp_path / (name + "-out")
    rc = filter_main([str(path), "--time-col", "date", *GIVEN, *extra, "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 0, err
    return pd.read_csv(out / "results.csv"), err


@functools.cache
def _reference(text, name, *extra):
    """:func:`_run` of a reference file (the plain comma CSV with ISO dates) that several cases
    compare against: run once (in its own directory, its stderr captured) and shared. Returns a
    copy of the results' frame and the stderr text."""
    tmp = Path(tempfile.mkdtemp(prefix="kalmanscan-csv-ref-"))
    try:
        path, out = tmp / name, tmp / (name + "-out")
        path.write_text(text)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = filter_main([str(path), "--time-col", "date", *GIVEN, *extra, "--out", str(out)])
        assert rc == 0, err.getvalue()
        return pd.read_csv(out / "results.csv"), err.getvalue()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run_reference(text, name, *extra):
    frame, err = _reference(text, name, *extra)
    return frame.copy(), err


@functools.cache
def _macro():
    sm = pytest.importorskip("statsmodels.api")
    d = sm.datasets.macrodata.load_pandas().data
    return d.year.astype(int).to_numpy(), d.quarter.astype(int).to_numpy(), d.infl.to_numpy()


@pytest.mark.parametrize("style", ["{y}Q{q}", "{y}-Q{q}", "{y} q{q}", "Q{q} {y}", "Q{q}-{y}"])
def test_quarter_labels_filter_like_iso_dates(tmp_path, capsys, style):
    years, quarters, infl = _macro()  # statsmodels' macrodata: 1959Q1-2009Q3
    labels = [style.format(y=y, q=q) for y, q in zip(years, quarters, strict=True)]
    iso = [f"{y}-{3 * q - 2:02d}-01" for y, q in zip(years, quarters, strict=True)]
    rows = lambda ts: zip(ts, infl.tolist(), strict=True)  # noqa: E731
    body = lambda ts: "date,infl\n" + "".join(f"{t},{v!r}\n" for t, v in rows(ts))  # noqa: E731
    got, err = _run(tmp_path, capsys, body(labels), "q.csv", "--time-unit", "91D")
    want, err_iso = _run_reference(body(iso), "iso.csv", "--time-unit", "91D")
    assert "column 'date' holds quarter labels: each time is the first day of its quarter" in err
    assert "quarter labels" not in err_iso
    pd.testing.assert_frame_equal(got, want)
    assert got["time"].iloc[0] == "1959-01-01" and got["time"].iloc[-1] == "2009-07-01"


def test_month_labels_and_quarters_outside_the_nanosecond_window():
    got = parse_datetime_strings(["1998M1", "1998M02", "1998m12"])
    assert got.astype("datetime64[D]").astype(str).tolist() == [
        "1998-01-01",
        "1998-02-01",
        "1998-12-01",
    ]
    old = parse_datetime_strings(["1500Q4", "2300Q1"])
    assert old.astype("datetime64[D]").astype(str).tolist() == ["1500-10-01", "2300-01-01"]
    # the Python API reads them the same way
    ax = as_time_axis(["2020Q1", "2020Q2", "2020Q3"], 3)
    assert ax.t.tolist() == [0.0, 91.0, 182.0]  # days: 2020 is a leap year
    assert period_starts(["2020Q1", "2020M01"]) is None  # one kind per column


@pytest.mark.parametrize(
    "values,bad,kind",
    [(["2001Q1", "2001Q2", "2001Q5"], "2001Q5", "quarter"),
     (["1990M1", "1990M2", "1990M13"], "1990M13", "month")],
)  # fmt: skip
def test_a_value_among_period_labels_that_is_none_is_named(values, bad, kind):
    with pytest.raises(
        TimeParseError, match=f"cannot parse '{bad}'.*other values are {kind} labels"
    ):
        parse_datetime_strings(values)


def test_the_cli_names_the_row_of_a_bad_period_label(tmp_path, capsys):
    path = tmp_path / "bad.csv"
    path.write_text("date,x\n1959Q1,1\n1959Q2,2\nsoon,3\n")
    assert filter_main([str(path), "--time-col", "date", *GIVEN, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "row 4: cannot parse 'soon' as a time (the other values are quarter labels" in err
    assert "2024Q1" in err and err.count("expected") == 1


@functools.cache
def _sunspots():
    sm = pytest.importorskip("statsmodels.api")
    d = sm.datasets.sunspots.load_pandas().data
    return d.YEAR.astype(int).to_numpy(), d.SUNACTIVITY.to_numpy()


@pytest.mark.parametrize("sep,name", [(";", "semicolons"), ("\t", "tabs"), ("|", "vertical bars")])
@pytest.mark.parametrize("decimal", [".", ","])
def test_other_separators_and_decimal_commas_filter_like_a_plain_csv(
    tmp_path, capsys, sep, name, decimal
):
    years, spots = _sunspots()  # statsmodels' sunspots: 1700-2008, one decimal
    rows = list(zip(years.tolist(), spots.tolist(), strict=True))
    plain = "date,spots\n" + "".join(f"{y},{v!r}\n" for y, v in rows)
    text = f"date{sep}spots\n" + "".join(f"{y}{sep}{v!r}\n".replace(".", decimal) for y, v in rows)
    want, _ = _run_reference(plain, "plain.csv", "--quiet")
    got, err = _run(tmp_path, capsys, text, "other.csv")
    assert f"fields separated by {name}" in err
    assert ("a comma read as the decimal mark" in err) == (decimal == ",")
    pd.testing.assert_frame_equal(got, want)


def test_a_comma_is_no_decimal_mark_beside_points_or_in_a_comma_csv(tmp_path, capsys):
    # a column with points and commas (1.234,5) is not rewritten: its cells are refused as written
    path = tmp_path / "mixed.csv"
    path.write_text("date;x\n1;1.234,5\n2;2,5\n")
    assert filter_main([str(path), "--time-col", "date", *GIVEN, "--quiet"]) == 2
    assert "column 'x' row 2: '1.234,5' is not a number" in capsys.readouterr().err
    # in a comma CSV a quoted "1,120" is a thousands-separated number: refused with the fix
    path = tmp_path / "thousands.csv"
    path.write_text('date,volume\n1871,"1,120"\n1872,"1,160"\n1873,963\n')
    assert filter_main([str(path), "--time-col", "date", *GIVEN, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "'1,120' is not a number (thousands separators are not read: write 1120)" in err


def _filter(tmp_path, capsys, raw: bytes, *extra):
    path = tmp_path / "in.csv"
    path.write_bytes(raw)
    out = tmp_path / "out"
    rc = filter_main([str(path), "--time-col", "date", *GIVEN, *extra, "--out", str(out)])
    return rc, capsys.readouterr().err, out


def test_a_spreadsheet_export_excel_sep_line_cp1252_bom_crlf_trailing_columns(tmp_path, capsys):
    # Excel's "sep=;" first line, a Windows-1252 header, CRLF line ends, empty trailing columns
    raw = "sep=;\r\ndate;Température;;\r\n2024-01-01;1,5;;\r\n2024-01-02;2,25;;\r\n"
    rc, err, out = _filter(tmp_path, capsys, raw.encode("cp1252"))
    assert rc == 0, err
    assert "not UTF-8; read as Windows-1252" in err
    assert "fields separated by semicolons (the first line's 'sep=;')" in err
    assert "a comma read as the decimal mark" in err
    assert "skipped column(s) ['Unnamed: 2', 'Unnamed: 3']: no header and no values" in err
    got = pd.read_csv(out / "results.csv")
    assert got["series"].unique().tolist() == ["Température"]
    assert got["observed"].tolist() == [1.5, 2.25]
    # a UTF-8 byte-order mark (Excel's "CSV UTF-8") does not hide the first column's name
    rc, err, out = _filter(
        tmp_path, capsys, b"\xef\xbb\xbfdate,x\r\n2024-01-01,1\r\n2024-01-02,2\r\n"
    )
    assert rc == 0 and "UTF-8" not in err, err
    assert pd.read_csv(out / "results.csv")["observed"].tolist() == [1.0, 2.0]


def test_rows_count_the_sep_line_and_empty_columns_are_named(tmp_path, capsys):
    raw = b"sep=;\ndate;x\n2024-01-01;1,5\n2024-01-02;zz\n"
    rc, err, _ = _filter(tmp_path, capsys, raw, "--quiet")
    assert rc == 2 and "column 'x' row 4: 'zz' is not a number" in err
    rc, err, _ = _filter(tmp_path, capsys, b"date,\n2024-01-01,\n2024-01-02,\n", "--quiet")
    assert rc == 2 and "column(s) ['Unnamed: 1'] have no header and no values" in err
    # a named column without values is a series without observations, as before
    rc, err, out = _filter(tmp_path, capsys, b"date,x,y\n2024-01-01,1,\n2024-01-02,2,\n", "--quiet")
    assert rc == 0, err
    assert pd.read_csv(out / "results.csv")["series"].unique().tolist() == ["x", "y"]


def test_excel_unicode_text_reads_and_workbooks_and_binary_files_are_refused(tmp_path, capsys):
    # Excel's "Unicode text": UTF-16 with a byte-order mark, tab-separated
    text = "date\tlevel\n2024-01-01\t1,5\n2024-01-02\t2,5\n"
    rc, err, out = _filter(tmp_path, capsys, text.encode("utf-16"))
    assert rc == 0, err
    assert "fields separated by tabs" in err
    assert pd.read_csv(out / "results.csv")["observed"].tolist() == [1.5, 2.5]
    # a workbook (a zip archive) and a file with NUL bytes: named, not parsed as text
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("xl/worksheets/sheet1.xml", "<worksheet/>")
    rc, err, _ = _filter(tmp_path, capsys, buf.getvalue(), "--quiet")
    assert rc == 2 and "is a spreadsheet workbook (.xlsx, .xls or .ods), not a CSV" in err
    rc, err, _ = _filter(tmp_path, capsys, b"date,x\n2024-01-01,1\x00\n", "--quiet")
    assert rc == 2 and "is a binary file (it holds NUL bytes)" in err


# --- long (tidy) tables: --series-col -------------------------------------------------------------
def _grunfeld():
    sm = pytest.importorskip("statsmodels.api")
    d = sm.datasets.grunfeld.load_pandas().data  # 11 firms x 20 years, long form
    d["year"] = d["year"].astype(int)
    return d


def test_a_long_table_filters_like_its_wide_form(tmp_path, capsys):
    d = _grunfeld()
    long = d[["firm", "year", "invest", "value"]].to_csv(index=False)
    wide = d.pivot(index="year", columns="firm", values=["invest", "value"])
    firms = list(dict.fromkeys(d["firm"]))
    wide = pd.DataFrame(
        {f"{f}/{v}": wide[(v, f)] for f in firms for v in ("invest", "value")}, index=wide.index
    )
    args = ("--time-col", "year", *GIVEN)
    path = tmp_path / "long.csv"
    path.write_text(long)
    rc = filter_main([str(path), *args, "--series-col", "firm", "--out", str(tmp_path / "l")])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert f"column 'firm' names each row's series: {len(firms)} series x 2 value columns" in err
    path = tmp_path / "wide.csv"
    wide.reset_index().to_csv(path, index=False)
    assert filter_main([str(path), *args, "--quiet", "--out", str(tmp_path / "w")]) == 0
    got, want = (pd.read_csv(tmp_path / o / "results.csv") for o in ("l", "w"))
    pd.testing.assert_frame_equal(got, want)
    assert got["series"].unique().tolist()[:2] == ["General Motors/invest", "General Motors/value"]
    # without --series-col the repeated years are refused, naming the column to pass
    path = tmp_path / "long.csv"
    assert filter_main([str(path), *args, "--quiet"]) == 2
    assert "pass --series-col firm" in capsys.readouterr().err


def test_a_long_table_with_different_times_a_series(tmp_path, capsys):
    text = "t,station,temp\n1,a,10\n2,a,11\n2,b,20\n3,b,21\n5,a,12\n"
    rc, err, out = _filter_long(tmp_path, capsys, text)
    assert rc == 0, err
    got = pd.read_csv(out / "results.csv").query("kind == 'data'")
    a = got[got.series == "a"]["observed"].tolist()
    b = got[got.series == "b"]["observed"].tolist()
    assert got.time.unique().tolist() == [1, 2, 3, 5]
    assert a[:2] + a[3:] == [10.0, 11.0, 12.0] and pd.isna(a[2])
    assert b[1:3] == [20.0, 21.0] and pd.isna(b[0]) and pd.isna(b[3])


def _filter_long(tmp_path, capsys, text, *extra):
    path = tmp_path / "long.csv"
    path.write_text(text)
    out = tmp_path / "out"
    rc = filter_main(
        [str(path), "--time-col", "t", "--series-col", "station", *GIVEN, "--quiet", *extra]
        + ["--out", str(out)]
    )
    return rc, capsys.readouterr().err, out


@pytest.mark.parametrize(
    "text,message",
    [("t,station,x\n1,a,1\n2,a,2\n1,a,3\n", "series 'a' (column 'station') has two rows at the "
      "time 1: rows 2 and 4; expected one row per series and time"),
     ("t,station,x\n1,a,1\n2,,2\n", "column 'station' row 3: no series name")],
    ids=["repeated-time", "no-name"],
)  # fmt: skip
def test_a_long_table_refuses_repeats_and_rows_without_a_series(tmp_path, capsys, text, message):
    rc, err, _ = _filter_long(tmp_path, capsys, text)
    assert rc == 2 and message in err, err


def test_series_col_needs_a_time_col_and_another_column(tmp_path, capsys):
    path = tmp_path / "long.csv"
    path.write_text("t,station,x\n1,a,1\n")
    assert filter_main([str(path), "--series-col", "station", *GIVEN]) == 2
    assert "--series-col 'station': needs --time-col" in capsys.readouterr().err
    assert filter_main([str(path), "--time-col", "t", "--series-col", "t", *GIVEN]) == 2
    assert "--series-col 't': that is the time column" in capsys.readouterr().err
    assert filter_main([str(path), "--time-col", "t", "--series-col", "nope", *GIVEN]) == 2
    assert "--series-col 'nope': no such column" in capsys.readouterr().err


def test_results_csv_text_equals_pandas_writer():
    """results.csv's writer gives pandas' ``to_csv(index=False, float_format="%.10g")`` text
    (it is 2-7 times faster): floats of every size, NaN, inf, -0.0, booleans, integers, None and
    text needing quotes."""
    from kalmanscan.timeseries.outputs import _csv_text

    rng = np.random.default_rng(5)
    n = 3000
    x = rng.normal(size=n) * 10.0 ** rng.integers(-320, 308, size=n)
    x[::7], x[::11], x[::13] = np.nan, np.inf, -0.0
    names = np.array(["a", 'b "q"', "c,d", "e\nf", "g"], dtype=object)[rng.integers(0, 5, n)]
    names[::17] = None
    with np.errstate(over="ignore"):
        f32 = x.astype(np.float32)
    frame = pd.DataFrame(
        {"kind": "data", "name": names, "x": x, "f32": f32, "k": x > 0,
         "i": rng.integers(-5, 5, n), "t": [f"{1900 + i % 100}-01-01" for i in range(n)]}
    )  # fmt: skip
    assert _csv_text(frame) == frame.to_csv(index=False, float_format="%.10g")


def test_a_bar_in_a_column_name_does_not_make_it_the_separator(tmp_path, capsys):
    # the header holds more "|" than ",", but the data line splits only on ","
    rc, err, out = _filter(tmp_path, capsys, b"date,a|b|c\n2024-01-01,1\n2024-01-02,2\n")
    assert rc == 0 and "separated by" not in err, err
    assert pd.read_csv(out / "results.csv")["series"].unique().tolist() == ["a|b|c"]


# --- cells and headers as spreadsheets write them: '#' inside text, NA as a name, repeated names
def _fails(tmp_path, capsys, text, *args):
    path = tmp_path / "f.csv"
    path.write_text(text)
    rc = filter_main([str(path), *args, *GIVEN, "--out", str(tmp_path / "fo")])
    err = capsys.readouterr().err
    assert rc == 2, err
    return err


def test_hash_inside_a_line_is_text_not_a_comment(tmp_path, capsys):
    body = "".join(f"2024-01-{d:02d},{d},{2 * d}\n" for d in range(1, 6))
    got, err = _run(tmp_path, capsys, "# a comment line\ndate,GDP #1,cpi\n" + body, "h.csv")
    want, _ = _run(tmp_path, capsys, "date,GDP,cpi\n" + body, "plain.csv")
    assert "2 series (GDP #1, cpi)" in err
    assert sorted(set(got["series"])) == ["GDP #1", "cpi"]
    pd.testing.assert_frame_equal(got.replace("GDP #1", "GDP"), want)
    # Excel's #N/A is refused where it stands, not taken for the rest of the row
    text = "date,a,b\n2024-01-01,#N/A,2\n2024-01-02,3,4\n"
    err = _fails(tmp_path, capsys, text, "--time-col", "date")
    assert "column 'a' row 2: '#N/A' is not a number (a spreadsheet error value" in err


def test_na_is_a_name_and_only_na_nan_and_empty_are_missing(tmp_path, capsys):
    rows = [(c, 2000 + y, 10 * i + y) for i, c in enumerate(["NA", "DE"]) for y in range(4)]
    text = "date,country,v\n" + "".join(f"{y}-01-01,{c},{v}\n" for c, y, v in rows)
    _run(tmp_path, capsys, text, "cc.csv", "--series-col", "country")
    got = pd.read_csv(tmp_path / "cc.csv-out" / "results.csv", keep_default_na=False)
    assert sorted(set(got["series"])) == ["DE", "NA"]
    got, _ = _run(tmp_path, capsys, "date,v\n2024-01-01,1\n2024-01-02,NA\n2024-01-03,\n"
                  "2024-01-04,NaN\n2024-01-05,5\n", "m.csv")  # fmt: skip
    missing = got.query("kind == 'data'")["observed"].isna().tolist()
    assert missing == [False, True, True, True, False]
    err = _fails(tmp_path, capsys, "date,v\n2024-01-01,1\n2024-01-02,null\n", "--time-col", "date")
    assert "'null' is not a number" in err


def test_repeated_column_names_refused(tmp_path, capsys):
    text = "date,rate,rate\n2024-01-01,1,2\n2024-01-02,3,4\n"
    err = _fails(tmp_path, capsys, text, "--time-col", "date")
    assert "duplicate column names ['rate']" in err


def test_thousands_points_in_a_semicolon_file_refused(tmp_path, capsys):
    text = "Jahr;Abfluss\n1871;1.120\n1872;1.160\n1873;963\n"
    err = _fails(tmp_path, capsys, text, "--time-col", "Jahr")
    assert "column 'Abfluss' row 2: '1.120' has a point as a thousands separator" in err
    assert "write 1120" in err
    err = _fails(tmp_path, capsys, "Jahr;Abfluss\n1871;1.120,0\n1872;963,0\n", "--time-col", "Jahr")
    assert "'1.120,0' is not a number (thousands separators are not read: write 1120,0)" in err
    # points before three digits and nothing else: 1.125 or 1125, which the file does not tell
    # (a German export's 13.415 is 13415; read as decimals, its fit came out 1e6 too small):
    # refused, naming --decimal, which reads either
    text = "date;v\n2024-01-01;1.125\n2024-01-02;2.250\n"
    err = _fails(tmp_path, capsys, text, "--time-col", "date")
    assert "--decimal" in err
    got, _ = _run(tmp_path, capsys, text, "d.csv", "--decimal", ".")
    assert got.query("kind == 'data'")["observed"].tolist() == [1.125, 2.25]
    got, _ = _run(tmp_path, capsys, text, "d2.csv", "--decimal", ",")
    assert got.query("kind == 'data'")["observed"].tolist() == [1125.0, 2250.0]


def test_separator_inside_a_quoted_header_name(tmp_path, capsys):
    text = 'date;"Abfluss; 10^8 m3"\n' + "".join(f"2024-01-0{d};{d}\n" for d in range(1, 5))
    got, err = _run(tmp_path, capsys, text, "q.csv")
    assert "fields separated by semicolons" in err
    assert set(got["series"]) == {"Abfluss; 10^8 m3"}


def test_month_names_with_years_read_as_their_first_day():
    got = parse_datetime_strings(["Jan 1950", "Feb 1950", "Dec 1950"])
    np.testing.assert_array_equal(
        got.astype("datetime64[D]"), np.array(["1950-01-01", "1950-02-01", "1950-12-01"], "M8[D]")
    )
    assert parse_datetime_strings(["March 2001"])[0] == np.datetime64("2001-03-01")


def test_two_digit_years_need_the_format_and_say_the_century(tmp_path, capsys):
    with pytest.raises(TimeParseError, match="two-digit years are not guessed: give the format, "
                       "e.g. %d/%m/%y"):  # fmt: skip
        parse_datetime_strings(["29/03/58", "30/03/58"])
    text = "date,v\n29/03/58,1\n30/03/58,2\n31/03/58,3\n"
    got, err = _run(tmp_path, capsys, text, "y2.csv", "--time-format", "%d/%m/%y")
    assert "two-digit years read as 2000-2068 (00-68) and 1969-1999 (69-99)" in err
    assert got["time"].iloc[0] == "2058-03-29"


def test_pandas_index_column_skipped_and_options_named(tmp_path, capsys):
    text = ",date,v\n" + "".join(f"{i},2024-01-0{i + 1},{i * i}\n" for i in range(5))
    got, err = _run(tmp_path, capsys, text, "idx.csv")
    assert "skipped the first column: no header and the row numbers 0, 1, 2, ..." in err
    assert set(got["series"]) == {"v"}
    path = tmp_path / "neg.csv"
    path.write_text("date,v\n2024-01-01,1\n2024-01-02,2\n")
    rc = filter_main([str(path), "--time-col", "date", "--sigma2", "-1", "--obs-var", "1",
                      "--out", str(tmp_path / "n")])  # fmt: skip
    assert rc == 2
    assert "--sigma2: expected values >= 0.0 and finite, got -1.0" in capsys.readouterr().err


def test_a_decimal_comma_in_the_time_column_is_explained(tmp_path, capsys):
    path = tmp_path / "tc.csv"
    path.write_text("t;v\n1871,5;1120,0\n1872,5;1160,0\n")
    rc = filter_main([str(path), "--time-col", "t", *GIVEN, "--out", str(tmp_path / "o")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "a decimal comma is read in value columns only: write 1871.5 in the time column" in err


# --- files as public sources publish them (FRED, GHCN, Eurostat, R, Excel in other locales) ------
def test_dates_written_as_numbers_read_as_dates(tmp_path, capsys):
    days = pd.date_range("2020-01-25", periods=12, freq="D")
    vals = [f"{v:.1f}" for v in np.sin(np.arange(12)) * 5 + 20]
    packed = "DATE,TMAX\n" + "".join(f"{d:%Y%m%d},{v}\n" for d, v in zip(days, vals, strict=True))
    iso = "DATE,TMAX\n" + "".join(f"{d:%Y-%m-%d},{v}\n" for d, v in zip(days, vals, strict=True))
    got, err = _run(tmp_path, capsys, packed.replace("DATE", "date"), "ghcn.csv")
    want, _ = _run(tmp_path, capsys, iso.replace("DATE", "date"), "iso.csv")
    assert "holds dates written as numbers (%Y%m%d: 20200125 is 2020-01-25), read as dates" in err
    pd.testing.assert_frame_equal(got, want)
    months = "date,v\n" + "".join(f"{2000 + k // 12}{k % 12 + 1:02d},{k}\n" for k in range(15))
    got, err = _run(tmp_path, capsys, months, "ym.csv", "--forecast", "2")
    assert "(%Y%m: 200001 is 2000-01-01)" in err
    assert got.query("kind == 'forecast'")["time"].tolist() == ["2001-04-01", "2001-05-01"]


def test_rows_wider_than_the_header(tmp_path, capsys):
    body = "".join(f"2024-01-0{d},{d}," + ("p" if d == 3 else "") + "\n" for d in range(1, 6))
    got, err = _run(tmp_path, capsys, "date,v\n" + body, "trail.csv")
    assert set(got["series"]) == {"v"} and got["observed"].tolist()[:5] == [1, 2, 3, 4, 5]
    assert "skipped column(s) ['Unnamed: 2']: no numbers in them" in err  # the flag column
    err = _fails(tmp_path, capsys, '"a","b"\n"2024-01-01",1,2\n"2024-01-02",3,4\n')
    assert "row 2 has 3 fields but the header (row 1) names 2" in err and "write.csv" in err
    err = _fails(tmp_path, capsys, "Category: All\ndate,v\n2024-01-01,1\n2024-01-02,2\n")
    assert "row 2 has 2 fields but row 1, taken as the header, has one" in err
    assert "lines before the header" in err


def test_thousands_that_read_both_ways_are_refused(tmp_path, capsys):
    text = "Year\tVolume\n1871\t2,120\n1872\t2,160\n"
    err = _fails(tmp_path, capsys, text, "--time-col", "Year")
    assert "'2,120' reads as 2120 (a thousands separator) and as 2.120 (a decimal comma)" in err
    text = "Jahr;Abfluss;Anteil\n1871;2.120;11,2\n1872;2.160;11,6\n"
    err = _fails(tmp_path, capsys, text, "--time-col", "Jahr")
    assert "'2.120' has a point as a thousands separator" in err and "'Anteil' writes" in err


def test_millisecond_forecasts_and_notes_kept_in_the_summary(tmp_path, capsys):
    stamps = pd.date_range("2024-03-01T12:00:00", periods=20, freq="250ms")
    text = "t;v\n" + "".join(f"{s:%Y-%m-%dT%H:%M:%S.%f}Z;{k},5\n" for k, s in enumerate(stamps))
    path = tmp_path / "ms.csv"
    path.write_text(text)
    out = tmp_path / "o"
    args = [str(path), "--time-col", "t", *GIVEN, "--forecast", "2", "--quiet", "--out", str(out)]
    assert filter_main(args) == 0, capsys.readouterr().err
    fc = pd.read_csv(out / "results.csv").query("kind == 'forecast'")["time"].tolist()
    assert fc == ["2024-03-01 12:00:05.000Z", "2024-03-01 12:00:05.250Z"]
    summary = (out / "summary.txt").read_text()
    assert "fields separated by semicolons" in summary and "a comma read as the decimal" in summary


def test_weeks_and_half_years_read_as_the_days_they_start():
    got = parse_datetime_strings(["2020-W01", "2020-W02", "2020-W53"])
    np.testing.assert_array_equal(
        got.astype("datetime64[D]"), np.array(["2019-12-30", "2020-01-06", "2020-12-28"], "M8[D]")
    )
    halves = parse_datetime_strings(["2007-S1", "2007-S2", "2008-S1"])
    assert [str(d)[:10] for d in halves] == ["2007-01-01", "2007-07-01", "2008-01-01"]
    assert period_starts(["1990-M01", "1990-M02"])[0] == ["1990-01-01", "1990-02-01"]
    with pytest.raises(TimeParseError, match="'2021-W53'"):  # 2021 has 52 ISO weeks
        parse_datetime_strings(["2021-W52", "2021-W53"])


def test_a_table_of_times_as_columns_and_title_lines_are_refused(tmp_path, capsys):
    wide = "Country Name,1960,1961,1962,1963\nAruba,4.8,4.7,4.5,4.4\nChad,6.2,6.2,6.3,6.3\n"
    err = _fails(tmp_path, capsys, wide)
    assert "the columns are named by times (1960, 1961, 1962, ...)" in err
    assert "transpose the table first" in err
    quoted = "".join('"' + ln.replace(",", '","') + '",\n' for ln in wide.splitlines())
    meta = '"Data Source","WDI",\n\n"Last Updated","2024-01-01",\n\n' + quoted
    err = _fails(tmp_path, capsys, meta)
    assert "lines before the header (a title or notes)?" in err


def test_source_markers_and_flags_get_their_own_hints(tmp_path, capsys):
    cases = [
        (".", "a missing-value marker of the source"),
        (":", "a missing-value marker of the source"),
        ("12.3 p", "a value with a flag ('p'): write the number alone, 12.3"),
        ("<1", "a bound, not a value"),
    ]
    for cell, hint in cases:
        err = _fails(tmp_path, capsys, f"date,v\n2024-01-01,1\n2024-01-02,{cell}\n", "--time-col",
                     "date")  # fmt: skip
        assert f"row 3: {cell!r} is not a number ({hint}" in err


def test_a_date_column_without_time_col_is_pointed_at(tmp_path, capsys):
    text = "Date,v\n2024-01-01,1\n2024-01-02,2\n2024-01-03,4\n"
    path = tmp_path / "d.csv"
    path.write_text(text)
    out = tmp_path / "o"
    assert filter_main([str(path), *GIVEN, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "column 'Date' holds dates: pass --time-col 'Date' to use them as the times" in err
    assert "pass --time-col 'Date'" in (out / "summary.txt").read_text()


def test_the_series_col_hint_names_a_column_that_tells_rows_apart(tmp_path, capsys):
    rows = [("ESTAT:PRC", g, y, v) for g, v0 in (("AT", 1), ("DE", 5)) for y, v in
            ((2020, v0), (2021, v0 + 1), (2022, v0 + 3))]  # fmt: skip
    text = "DATAFLOW,geo,TIME_PERIOD,OBS_VALUE\n" + "".join(
        f"{d},{g},{y}-01-01,{v}\n" for d, g, y, v in rows
    )
    err = _fails(tmp_path, capsys, text, "--time-col", "TIME_PERIOD")
    assert "pass --series-col geo" in err and "DATAFLOW" not in err
