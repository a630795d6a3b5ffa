"""``kalmanscan filter``'s messages where a probe of the command found them blaming the wrong
cell or suggesting the wrong fix (its report's problems 7-13): a point among decimal commas,
percent and currency signs, units, brackets, dashes and apostrophes named as such (never
``--missing``), decimal commas in a one-column file, year and quarter in two columns, options
given twice, which "row" a warning counts, all-``NA`` columns, names in Unicode NFD, and the
command's options named as the command line writes them. Fixtures are a few rows of the probe's
files, written inline (docs/cli.md)."""

from __future__ import annotations

import unicodedata

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("xarray")
pytest.importorskip("matplotlib")

from kalmanscan.timeseries import load_nile  # noqa: E402
from kalmanscan.timeseries.cli import filter_main  # noqa: E402

GIVEN = ["--sigma2", "1", "--obs-var", "1"]
PROG = "kalmanscan filter: "
# (a real series with two gross values, PNG drawn)
PNG_DRAWN = {"test_the_gross_value_warning_says_how_it_counts_rows_and_gives_the_file_lines"}


def _run(tmp_path, capsys, text, *args, name="in.csv"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    out = tmp_path / (name + "-out")
    rc = filter_main([str(path), *args, "--out", str(out)])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err, out, str(path)


# --- 7. the cell at fault, and what is wrong with it ---------------------------------------------
def test_a_point_among_decimal_commas_is_the_cell_named(tmp_path, capsys):
    # before: the valid '1,0' (row 2) was blamed, with --missing 1,0 to pass
    text = "t;y\n1;1,0\n2;5.2\n3;1,5\n4;1,2\n"
    rc, _, err, _, path = _run(tmp_path, capsys, text, "--time-col", "t", *GIVEN)
    assert rc == 2
    assert err == (
        f"{PROG}{path}: column 'y' row 3: '5.2' has a decimal point where the column's other "
        "numbers have decimal commas ('1,0', row 2); write 5,2\n"
    )
    # one decimal comma among points: that one is named
    text = "t;y\n1;1.5\n2;2.25\n3;1,5\n4;1.2\n"
    rc, _, err, _, _ = _run(tmp_path, capsys, text, "--time-col", "t", *GIVEN)
    assert rc == 2
    assert "row 4: '1,5' has a decimal comma where the column's other numbers have decimal " in err


@pytest.mark.parametrize(
    "text,time,hint",
    [("quarter,unemp\n1959Q1,5.8%\n1959Q2,5.1%\n", "quarter",
      "'5.8%' is not a number (a percent sign is not read: write the number alone, 5.8)"),
     ("year,volume\n1871,1120 m3\n1872,1160 m3\n", "year",
      "'1120 m3' is not a number (a number with a unit ('m3') is not read: write the number "
      "alone, 1120 (the unit can go in the column's name))"),
     ('date,value\n2020-01-01,"12,5"\n2020-01-02,"13,25"\n', "date",
      "'12,5' is not a number (a decimal comma in a file separated by commas: write 12.5, or "
      "pass --decimal , to read commas as the decimal mark)"),
     ("date;value\n2020-01-01;1'120.5\n2020-01-02;1'125.0\n2020-01-03;999.0\n", "date",
      "\"1'120.5\" is not a number (thousands separators are not read: write 1120.5; the "
      "separator here is an apostrophe)"),
     ("t;y\n1;1,0\n2;(5,2)\n3;1,5\n", "t",
      "'(5,2)' is not a number (a negative number in brackets is not read: write -5,2)"),
     ("t;y\n1;1,0\n2;5,2 €\n3;1,5\n", "t",
      "'5,2 €' is not a number (a currency sign is not read: write the number alone, 5,2)"),
     ("t,y\n1,1.0\n2,\u20135.2\n3,1.5\n", "t",
      "'\u20135.2' is not a number (the dash before the number is U+2013, not the minus sign "
      "'-': write -5.2)")],
    ids=["percent", "unit", "quoted-decimal-comma", "apostrophe", "brackets", "euro", "en-dash"],
)  # fmt: skip
def test_numbers_as_no_reader_reads_them_are_named_never_missing(tmp_path, capsys, text, time,
                                                                 hint):  # fmt: skip
    # before: "... (leave the cell empty ..., or pass --missing 5.8% to read every such cell as
    # missing)": following it made one cell missing and failed on the next
    rc, _, err, _, _ = _run(tmp_path, capsys, text, "--time-col", time, *GIVEN)
    assert rc == 2
    assert hint in err
    assert "--missing" not in err


def test_the_unicode_minus_sign_is_read_with_a_note(tmp_path, capsys):
    text = "t,y\n1,1.0\n2,\u22125.2\n3,1.5\n4,1.2\n"
    rc, _, err, out, _ = _run(tmp_path, capsys, text, "--time-col", "t", *GIVEN)
    assert rc == 0, err
    assert "note: column(s) ['y']: 1 number written with the minus sign U+2212" in err
    got = pd.read_csv(out / "results.csv").query("kind == 'data'")["observed"].tolist()
    assert got == [1.0, -5.2, 1.5, 1.2]


def test_decimal_commas_in_a_file_of_one_column(tmp_path, capsys):
    # before: "lines before the header (a title or notes)?"
    text = "Wert\n1,5\n2,25\n3,0\n2,75\n"
    rc, _, err, _, path = _run(tmp_path, capsys, text, *GIVEN)
    assert rc == 2
    assert err == (
        f"{PROG}{path}: row 2 ('1,5') has 2 fields but the header (row 1: 'Wert') has one: "
        "numbers with a decimal comma in a file of one column? the comma reads as the field "
        "separator; write decimal points (1.5), or pass --decimal , to read the commas as the "
        "decimal mark\n"
    )
    rc, _, err, out, _ = _run(tmp_path, capsys, text, "--decimal", ",", *GIVEN)
    assert rc == 0, err
    got = pd.read_csv(out / "results.csv").query("kind == 'data'")["observed"].tolist()
    assert got == [1.5, 2.25, 3.0, 2.75]


# --- 8. year and quarter in two columns ---------------------------------------------------------
def test_year_and_quarter_in_two_columns_are_named_as_a_split_time(tmp_path, capsys):
    text = "year,quarter,realgdp,unemp\n" + "".join(
        f"{1959 + k // 4}.0,{k % 4 + 1}.0,{2700 + 10 * k:.3f},{5 + 0.1 * k:.1f}\n" for k in range(8)
    )
    rc, _, err, _, path = _run(tmp_path, capsys, text, "--time-col", "year", "--fit")
    assert rc == 2
    assert err == (
        f"{PROG}{path}: column 'year' rows 2 and 3 have the same time 1959, told apart by column "
        "'quarter' (1 to 4): the time is split over two columns (year and quarter); write them "
        "as one time column (1959Q1) and pass it to --time-col\n"
    )
    assert "--repeated-times keep" not in err  # (it would fit the quarters as a series)


# --- 9. options given twice ---------------------------------------------------------------------
NILE = "year,volume\n" + "".join(
    f"{int(y)},{v}\n" for y, v in zip(*load_nile(), strict=True)
)  # fmt: skip


@pytest.mark.parametrize(
    "args,says",
    [(["--time-col", "year", "--value-col", "volume", "--value-col", "volume", *GIVEN],
      "--value-col 'volume': given twice; name each value column once (each is a series)"),
     (["--time-col", "year", "--fit", "--fix", "theta=0", "--fix", "theta=1"],
      "--fix theta: given twice (theta=0 and theta=1); give it once"),
     (["--time-col", "year", "--time-col", "volume", *GIVEN],
      "--time-col: given twice (--time-col year and --time-col volume); give it once"),
     (["--time-col", "year", *GIVEN, "--sigma2", "2"],
      "--sigma2: given twice (--sigma2 1.0 and --sigma2 2.0); give it once")],
    ids=["value-col", "fix", "time-col", "sigma2"],
)  # fmt: skip
def test_an_option_given_twice_differently_is_refused(tmp_path, capsys, args, says):
    # before: two series both named volume; theta fixed at 1; the last --time-col used
    rc, out, err, _, _ = _run(tmp_path, capsys, NILE, *args)
    assert rc == 2 and out == ""
    assert err == f"{PROG}{says}\n"


# --- 11. which row a warning names ----------------------------------------------------------------
def test_the_gross_value_warning_says_how_it_counts_rows_and_gives_the_file_lines(tmp_path, capsys):
    years, flow = load_nile()
    flow = flow.copy()
    flow[40:42] = -9999.0  # 1911 and 1912
    order = np.random.default_rng(3).permutation(years.size)
    text = "year,volume\n" + "".join(f"{int(years[k])},{flow[k]}\n" for k in order)
    lines = [2 + int(np.flatnonzero(order == k)[0]) for k in (40, 41)]
    rc, _, err, _, _ = _run(tmp_path, capsys, text, "--time-col", "year", "--sigma2", "1469",
                            "--obs-var", "15099")  # fmt: skip
    assert rc == 0, err
    warning = next(ln for ln in err.splitlines() if "typical steps" in ln)
    assert (
        "from the values around them (rows from 0 in time order; lines "
        f"{lines[0]}, {lines[1]} of the file): series 'volume': row 40 (time 1911, z = -9999), "
        "row 41 (time 1912, z = -9999)" in warning
    )


# --- 12. a column of NA is a column of empty cells; a time column read as a series ----------------
def test_a_column_of_na_reads_as_a_column_of_empty_cells(tmp_path, capsys):
    values = [1120.0, 1160.0, 963.0, 1210.0]
    empty = "year,volume,flow2\n" + "".join(f"{1871 + k},{v},\n" for k, v in enumerate(values))
    rc, _, err, want, _ = _run(tmp_path, capsys, empty, "--time-col", "year", *GIVEN)
    assert rc == 0, err
    rc, _, err, got, _ = _run(tmp_path, capsys, empty.replace(",\n", ",NA\n"), "--time-col",
                              "year", *GIVEN, name="na.csv")  # fmt: skip
    assert rc == 0, err
    assert "skipped" not in err  # before: skipped as a column of labels, "no numbers in them"
    pd.testing.assert_frame_equal(pd.read_csv(got / "results.csv"),
                                  pd.read_csv(want / "results.csv"))  # fmt: skip
    # --fit names the option that leaves such a column out
    rc, _, err, _, _ = _run(tmp_path, capsys, empty, "--time-col", "year", "--fit")
    assert rc == 2 and "too few in 'flow2' (0); name the columns to fit with --value-col" in err


def test_a_column_of_years_read_as_a_series_gets_a_note(tmp_path, capsys):
    rc, _, err, _, _ = _run(tmp_path, capsys, NILE, *GIVEN)
    assert rc == 0, err
    assert (
        "note: column 'year' is read as a series; if it holds the times, pass --time-col year "
        "(without it the row number is the time)" in err
    )


# --- 13. names in Unicode NFD; the options named as the command line writes them --------------
def test_a_header_in_nfd_matches_the_option_typed_in_nfc(tmp_path, capsys):
    nfd = unicodedata.normalize("NFD", "Année")
    text = f"{nfd},volume\n1871,1120.0\n1872,1160.0\n1873,963.0\n"
    # before: "no such column 'Année'; columns are ['Année', 'volume']"
    rc, _, err, out, _ = _run(tmp_path, capsys, text, "--time-col", "Année", *GIVEN)
    assert rc == 0, err
    assert pd.read_csv(out / "results.csv")["time"].tolist() == [1871, 1872, 1873]


def test_messages_name_the_command_line_options(tmp_path, capsys):
    dates = "date,v\n2024-01-01,1\n2024-02-01,2\n2024-03-01,4\n"
    rc, _, err, _, _ = _run(tmp_path, capsys, dates, "--time-col", "date", "--time-unit", "1Y",
                            *GIVEN)  # fmt: skip
    assert rc == 2
    assert err == (
        f"{PROG}--time-unit: expected a duration such as '1D', '12h' or '365.25D', got '1Y'\n"
    )
    ambiguous = "date,v\n03/04/1958,1\n04/05/1958,2\n"
    rc, _, err, _, _ = _run(tmp_path, capsys, ambiguous, "--time-col", "date", *GIVEN)
    assert rc == 2 and err.endswith("; choose one with --time-format or --dayfirst\n")
    rc, _, err, _, _ = _run(tmp_path, capsys, dates, "--time-col", "date", "--forecast", "2.5",
                            *GIVEN)  # fmt: skip
    assert rc == 2
    assert err == f"{PROG}--forecast: expected a number of steps from 0 to 1000000, got '2.5'\n"


def test_a_fit_note_gives_the_option_not_the_python_argument(tmp_path, capsys):
    rc, out, err, _, _ = _run(tmp_path, capsys, NILE, "--time-col", "year", "--fit", "--fix",
                              "sigma2=1469", "--fix", "obs_var=15099", "--fix", "theta=0",
                              "--quiet")  # fmt: skip
    assert rc == 0, err
    note = next(ln for ln in out.splitlines() if "mu is not estimated" in ln)
    assert "fix it too (--fix theta=0 --fix mu=0) for the local level model" in note
    assert "fix={" not in out


def test_the_log_likelihood_line_is_shortened_for_many_series(tmp_path, capsys):
    # before: every series on one line (about 30 kB for 2,000 series)
    cols = [f"s{j:02d}" for j in range(25)]
    text = (
        "t,"
        + ",".join(cols)
        + "\n"
        + "".join(
            f"{k}," + ",".join(f"{(j + 1) * np.sin(k + j):.3f}" for j in range(25)) + "\n"
            for k in range(6)
        )
    )
    rc, out, err, out_dir, _ = _run(tmp_path, capsys, text, "--time-col", "t", *GIVEN, "--quiet")
    assert rc == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("log-likelihood per series"))
    assert "s19=" in line and "s20=" not in line
    assert line.endswith(", ... 5 more series in results.nc ('loglik')")
