"""``kalmanscan filter --missing TEXT``: the missing-value markers of data sources read as missing
cells. FRED's ``.``, Eurostat's ``:`` (and ``: c``) in quoted long tables, GHCN's ``-9999`` (a
number: matched by value), several markers at once; the file then filters exactly as the same
file with those cells left empty, and the reading notes count the cells of each marker. A cell
refused as no number names the option with the exact text to pass."""

from __future__ import annotations

import pathlib
import re
import shlex
import subprocess

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("xarray")
pytest.importorskip("matplotlib")

from kalmanscan.cli import main  # noqa: E402
from kalmanscan.timeseries.cli import filter_main, read_csv_series  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
GIVEN = ["--sigma2", "0.01", "--obs-var", "0.001"]
# (the docs' example runs as a user runs it, PNG drawn)
PNG_DRAWN = {"test_cli_page_missing_example_runs_as_written"}


# FRED's DGS10 layout: daily, holidays written '.'
FRED = """DATE,DGS10
2024-01-01,.
2024-01-02,3.95
2024-01-03,3.91
2024-01-04,3.99
2024-01-05,4.05
2024-01-08,4.01
2024-01-09,4.02
2024-01-10,4.04
2024-01-11,3.98
2024-01-12,3.94
2024-01-15,.
2024-01-16,4.07
2024-01-17,4.10
2024-01-18,4.14
2024-01-19,4.15
"""


def _filter(tmp_path, capsys, text: str, *args, name="in.csv"):
    path = tmp_path / name
    path.write_text(text)
    out = tmp_path / (name + "-out")
    rc = filter_main([str(path), *args, "--out", str(out)])
    captured = capsys.readouterr()
    return rc, captured.err, out


def _ok(tmp_path, capsys, text, *args, name="in.csv"):
    rc, err, out = _filter(tmp_path, capsys, text, *args, name=name)
    assert rc == 0, err
    table = pd.read_csv(out / "results.csv")
    return table, err, (out / "summary.txt").read_text()


def _same_results(a, b):
    """Two results.csv tables equal (the timing line of the summary is not in them)."""
    pd.testing.assert_frame_equal(a, b)


def test_fred_dots_refused_with_the_option_to_pass_then_read_as_missing(tmp_path, capsys):
    rc, err, _ = _filter(tmp_path, capsys, FRED, "--time-col", "DATE", *GIVEN)
    assert rc == 2
    assert "column 'DGS10' row 2: '.' is not a number (a missing-value marker of the source; " \
        "pass --missing . to read every such cell as missing)" in err  # fmt: skip
    got, err, summary = _ok(tmp_path, capsys, FRED, "--time-col", "DATE", "--missing", ".", *GIVEN)
    want, _, _ = _ok(tmp_path, capsys, FRED.replace(",.\n", ",\n"), "--time-col", "DATE", *GIVEN,
                     name="empty.csv")  # fmt: skip
    _same_results(got, want)
    data = got.query("kind == 'data'")
    assert data["observed"].isna().tolist() == [True] + [False] * 9 + [True] + [False] * 4
    note = "note: --missing '.': 2 cells read as missing, in column 'DGS10'"
    assert note in err and note in summary
    assert "2 missing values" in err


@pytest.mark.parametrize(
    "cell,option",
    [(".", "."), (":", ":"), ("..", ".."), ("n/a", "n/a"), ("#N/A", "'#N/A'"), ("<1", "'<1'"),
     (": c", "': c'"), ("missing", "missing"), ("x y", "'x y'")],
    ids=["fred-dot", "eurostat-colon", "two-dots", "n/a", "excel-na", "bound", "colon-flag",
         "word", "two-words"],
)  # fmt: skip
def test_the_suggested_option_is_exact_and_reads_the_file(tmp_path, capsys, cell, option):
    text = f'date,v\n2024-01-01,1\n2024-01-02,"{cell}"\n2024-01-03,3\n2024-01-04,2\n'
    rc, err, _ = _filter(tmp_path, capsys, text, "--time-col", "date", *GIVEN)
    assert rc == 2 and f"row 3: {cell!r} is not a number" in err
    m = re.search(r"pass --missing (.+?) to read every such cell as missing", err)
    assert m and m.group(1) == option, err
    # the suggestion, split as a shell splits it, reads the file
    got, err, summary = _ok(tmp_path, capsys, text, "--time-col", "date", *GIVEN,
                            "--missing", *shlex.split(m.group(1)))  # fmt: skip
    assert got.query("kind == 'data'")["observed"].isna().tolist() == [False, True, False, False]
    assert f"--missing {cell!r}: 1 cell read as missing, in column 'v'" in summary


def test_a_flagged_value_keeps_its_hint_and_other_non_numbers_are_listed(tmp_path, capsys):
    text = "date,v\n2024-01-01,12.3 p\n2024-01-02,:\n2024-01-03,:\n2024-01-04,n/a\n2024-01-05,4\n"
    rc, err, _ = _filter(tmp_path, capsys, text, "--time-col", "date", *GIVEN)
    assert rc == 2
    assert "row 2: '12.3 p' is not a number (a value with a flag ('p'): write the number " \
        "alone, 12.3); other cells of the column that are no number: ':' (row 3 and 1 more); " \
        "'n/a' (row 5)" in err  # fmt: skip


# Eurostat's bulk CSV: a long table, every field quoted, ':' for missing, ': c' confidential
EUROSTAT = (
    '"TIME","GEO","UNIT","Value","Flag and Footnotes"\n'
    + "".join(
        f'"{y}","{g}","Percentage","{v}",""\n'
        for g, vals in (
            ("Austria", ["4.9", ":", "5.3", "6.0", "5.2", "4.8", "6.3"]),
            ("Belgium", ["5.8", "5.4", " : ", "6.3", ": c", "5.6", "5.5"]),
        )
        for y, v in zip(range(2015, 2022), vals, strict=True)
    )  # fmt: skip
)


def test_eurostat_long_table_with_quoted_markers_fit_robust_and_forecast(tmp_path, capsys):
    args = ["--time-col", "TIME", "--series-col", "GEO", "--value-col", "Value"]
    fit = ["--fit", "--fix", "theta=0", "--fix", "mu=0", "--robust", "--forecast", "2"]
    rc, err, _ = _filter(tmp_path, capsys, EUROSTAT, *args, *fit, "--quiet")
    assert rc == 2 and "'Value' row 3: ':' is not a number" in err
    assert "other cells of the column that are no number: ': c' (row 13)" in err
    got, err, summary = _ok(tmp_path, capsys, EUROSTAT, *args, *fit, "--missing", ":",
                            "--missing", ": c")  # fmt: skip
    blank = EUROSTAT.replace('" : "', '""').replace('":"', '""').replace('": c"', '""')
    want, _, _ = _ok(tmp_path, capsys, blank, *args, *fit, name="blank.csv")
    _same_results(got, want)
    assert "note: --missing ':': 2 cells read as missing, in column 'Value'" in summary
    assert "note: --missing ': c': 1 cell read as missing, in column 'Value'" in summary
    data = got.query("kind == 'data'").pivot(index="time", columns="series", values="observed")
    assert data["Austria"].isna().tolist() == [False, True] + [False] * 5
    assert data["Belgium"].isna().tolist() == [False, False, True, False, True, False, False]
    assert (got["kind"] == "forecast").sum() == 4  # 2 steps x 2 series
    assert "outlier" in got.columns


def test_a_dot_marker_does_not_hide_decimal_commas(tmp_path, capsys):
    # a semicolon export with decimal commas and FRED's '.': the '.' must not make the column
    # look written with points (which would refuse 12,5 as no number)
    text = "date;v\n2024-01-01;12,5\n2024-01-02;.\n2024-01-03;13,25\n2024-01-04;12,75\n"
    got, err, _ = _ok(tmp_path, capsys, text, "--time-col", "date", "--missing", ".", *GIVEN)
    assert "a comma read as the decimal mark" in err
    observed = got.query("kind == 'data'")["observed"].tolist()
    assert observed[0] == 12.5 and np.isnan(observed[1]) and observed[2:] == [13.25, 12.75]


# GHCN-Daily values in tenths of a degree, -9999 where the station reported nothing
GHCN = """DATE,TMAX,TMIN
20200101,56,-12
20200102,61,-9999
20200103,-9999,-9999
20200104,72,3
20200105,-9999.0,8
20200106,83,11
20200107,-99990,14
20200108,77,-9999.5
"""


def test_ghcn_numeric_code_matches_by_value_and_only_that_value(tmp_path, capsys):
    got, err, summary = _ok(tmp_path, capsys, GHCN, "--time-col", "DATE", "--missing", "-9999",
                            *GIVEN)  # fmt: skip
    obs = got.query("kind == 'data'").pivot(index="time", columns="series", values="observed")
    assert obs["TMAX"].isna().tolist() == [False, False, True, False, True, False, False, False]
    assert obs["TMIN"].isna().tolist() == [False, True, True, False, False, False, False, False]
    # -99990 and -9999.5 are numbers of their own: kept
    assert obs["TMAX"].iloc[6] == -99990 and obs["TMIN"].iloc[7] == -9999.5
    note = ("note: --missing -9999: 4 cells read as missing (matched by value: -9999.0 counts "
            "too), in columns 'TMAX' (2), 'TMIN' (2)")  # fmt: skip
    assert note in err and note in summary


def test_negative_codes_as_arguments_several_markers_and_na(tmp_path, capsys):
    text = "t,a,b\n1,1.5,-99.9\n2,.,2.5\n3,2.0,NA\n4,-99.9,3.5\n5,2.5,:\n"
    got, err, _ = _ok(tmp_path, capsys, text, "--time-col", "t", "--missing=-99.9",
                      "--missing", " . ", "--missing", ":", "--missing", "NA", *GIVEN)  # fmt: skip
    obs = got.query("kind == 'data'").pivot(index="time", columns="series", values="observed")
    assert obs["a"].isna().tolist() == [False, True, False, True, False]
    assert obs["b"].isna().tolist() == [True, False, True, False, True]
    assert "--missing -99.9: 2 cells read as missing (matched by value: -99.90 counts too)" in err
    assert "--missing '.': 1 cell read as missing, in column 'a'" in err
    assert "--missing 'NA': 1 cell read as missing, in column 'b'" in err


def test_markers_leave_times_and_series_names_alone(tmp_path, capsys):
    text = "t,v\n1,10\n2,3\n3,12\n4,11\n"
    got, _, _ = _ok(tmp_path, capsys, text, "--time-col", "t", "--missing", "3", *GIVEN)
    data = got.query("kind == 'data'")
    assert data["time"].tolist() == [1, 2, 3, 4]
    assert data["observed"].isna().tolist() == [False, True, False, False]
    rows = "".join(f"2024-01-0{d},{s},{v}\n" for d in (1, 2, 3) for s, v in (("-", 1), (".", 2)))
    got, _, _ = _ok(tmp_path, capsys, "date,s,v\n" + rows, "--time-col", "date", "--series-col",
                    "s", "--missing", ".", "--missing", "-", *GIVEN, name="long.csv")  # fmt: skip
    assert sorted(set(got["series"])) == ["-", "."]


def test_a_marker_that_matches_nothing_and_a_column_of_markers_only(tmp_path, capsys):
    text = "date,v,flag\n2024-01-01,1,:\n2024-01-02,2,:\n2024-01-03,4,:\n"
    got, err, summary = _ok(tmp_path, capsys, text, "--time-col", "date", "--missing", ":",
                            "--missing", "n/a", *GIVEN)  # fmt: skip
    assert set(got["series"]) == {"v"}
    assert "skipped column(s) ['flag']: no numbers in them" in err
    assert "note: --missing 'n/a': no cell of the value columns holds it" in summary
    assert "note: --missing ':': no cell of the value columns holds it" in summary  # flag skipped
    rc, err, _ = _filter(tmp_path, capsys, "date,v\n2024-01-01,.\n2024-01-02,.\n", "--time-col",
                         "date", "--missing", ".", *GIVEN)  # fmt: skip
    assert rc == 2 and "column 'v' holds --missing markers only" in err


@pytest.mark.parametrize(
    "markers,message",
    [(["  "], "--missing '  ': expected the text of a cell to read as missing (empty cells"),
     (["-9999", "-9999.0"], "--missing -9999.0: the same number as --missing -9999"),
     (["-9999", "-9.999e3"], "--missing -9.999e3: the same number as --missing -9999")],
    ids=["empty", "same-value", "same-value-exponent"],
)  # fmt: skip
def test_bad_markers_are_refused_naming_the_option(tmp_path, capsys, markers, message):
    args = [f"--missing={m}" for m in markers]  # (argparse takes -9.999e3 for an option)
    rc, err, out = _filter(tmp_path, capsys, GHCN, "--time-col", "DATE", *args, *GIVEN)
    assert rc == 2 and message in err and not out.exists()


def test_read_csv_series_takes_the_markers(tmp_path):
    path = tmp_path / "f.csv"
    path.write_text(FRED)
    notes = []
    times, z, names, _ = read_csv_series(str(path), "DATE", missing=["."], notes=notes)
    assert names == ["DGS10"] and z.shape == (15, 1) and np.isnan(z[[0, 10], 0]).all()
    assert np.isfinite(np.delete(z[:, 0], [0, 10])).all()
    assert notes == ["note: --missing '.': 2 cells read as missing, in column 'DGS10'"]


def test_cli_page_missing_example_runs_as_written(tmp_path, monkeypatch):
    """docs/cli.md's --missing example: the shell block writes the file, the command reads it."""
    text = (REPO / "docs" / "cli.md").read_text()
    block = re.search(r"```bash\n(cat > dgs10\.csv <<'EOF'\n.*?\nEOF\n)(kalmanscan [^\n]+)\n```",
                      text, flags=re.S)  # fmt: skip
    assert block, "the --missing example in docs/cli.md"
    monkeypatch.chdir(tmp_path)
    subprocess.run(["bash", "-c", block.group(1)], check=True)
    assert main(shlex.split(block.group(2))[1:] + ["--quiet"]) == 0
    summary = (tmp_path / "dgs10" / "summary.txt").read_text()
    assert "note: --missing '.': 2 cells read as missing, in column 'DGS10'" in summary
    assert "note: --missing '.': 2 cells read as missing" in text  # the page says what it prints
