"""``kalmanscan filter``'s messages, as a user reads them: thousands separators written with
spaces (French and SI exports: ``1 680,0``, U+00A0, U+202F) refused as commas and points are,
cells quoted as the file holds them (not as a decimal comma's rewrite) with a ``--missing``
option that reads them, log-likelihoods printed with digits float64 holds, numbers in
``fit_ou``'s messages without numpy's repr, and what ``--quiet`` hides (docs/cli.md)."""

from __future__ import annotations

import dataclasses
import pathlib
import re
import shlex

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("xarray")
pytest.importorskip("matplotlib")

import kalmanscan as ks  # noqa: E402
from kalmanscan.timeseries import load_nile  # noqa: E402
from kalmanscan.timeseries.cli import filter_main  # noqa: E402

# (data of a huge scale, PNG drawn; conftest.png_not_rasterized)
PNG_DRAWN = {"test_a_huge_log_likelihood_is_printed_in_scientific_notation"}

REPO = pathlib.Path(__file__).resolve().parents[1]
GIVEN = ["--sigma2", "1", "--obs-var", "1"]
PROG = "kalmanscan filter: "


def _run(tmp_path, capsys, text: str, *args, name="in.csv"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    out = tmp_path / (name + "-out")
    rc = filter_main([str(path), *args, "--out", str(out)])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err, out, str(path)


FR = "annee;debit\n1871;1{s}680,0\n1872;684,0\n1873;1{s}740,5\n1874;900,5\n"


@pytest.mark.parametrize(
    "space,shown,named",
    [(" ", " ", ""),
     ("\u202f", "\\u202f", "; the separator here is U+202F, a narrow no-break space"),
     ("\u00a0", "\\xa0", "; the separator here is U+00A0, a no-break space")],
    ids=["space", "nnbsp-U+202F", "nbsp-U+00A0"],
)  # fmt: skip
def test_space_thousands_in_a_decimal_comma_file_are_refused_quoting_the_cell(
    tmp_path, capsys, space, shown, named
):
    rc, out, err, _, path = _run(tmp_path, capsys, FR.format(s=space), *GIVEN)
    assert rc == 2 and out == ""
    assert err == (
        f"{PROG}{path}: column 'debit' row 2: '1{shown}680,0' is not a number (thousands "
        f"separators are not read: write 1680,0{named}); other cells of the column that are no "
        f"number: '1{shown}740,5' (row 4)\n"
    )
    # the number the message says to write reads, as a decimal comma
    fixed = FR.format(s=space).replace(f"1{space}680,0", "1680,0")
    fixed = fixed.replace(f"1{space}740,5", "1740,5")
    rc, _, err, out_dir, _ = _run(tmp_path, capsys, fixed, "--time-col", "annee", *GIVEN,
                                  name="fixed.csv")  # fmt: skip
    assert rc == 0, err
    got = pd.read_csv(out_dir / "results.csv").query("kind == 'data'")["observed"]
    assert got.tolist() == [1680.0, 684.0, 1740.5, 900.5]


def test_space_thousands_in_a_comma_file_are_refused_with_the_number_to_write(tmp_path, capsys):
    text = "year,flow\n1871,1 120\n1872,1 160\n1873,963\n"
    rc, out, err, _, path = _run(tmp_path, capsys, text, "--time-col", "year", *GIVEN)
    assert rc == 2 and out == ""
    assert err == (
        f"{PROG}{path}: column 'flow' row 2: '1 120' is not a number (thousands separators are "
        "not read: write 1120); other cells of the column that are no number: '1 160' (row 3)\n"
    )
    # a quoted decimal comma in a comma file: the point is the decimal mark to write
    text = 'year,flow\n1871,"1 120,5"\n1872,963.5\n'
    rc, _, err, _, path = _run(tmp_path, capsys, text, "--time-col", "year", *GIVEN)
    assert rc == 2
    assert err == (
        f"{PROG}{path}: column 'flow' row 2: '1 120,5' is not a number (thousands separators "
        "are not read: write 1120.5)\n"
    )


def test_a_column_of_only_grouped_numbers_is_refused_not_skipped_as_labels(tmp_path, capsys):
    text = "t,a,b\n1,1 120,5\n2,2 300,6\n3,4 000,7\n"
    rc, _, err, _, path = _run(tmp_path, capsys, text, "--time-col", "t", *GIVEN)
    assert rc == 2
    assert err == (
        f"{PROG}{path}: column 'a' row 2: '1 120' is not a number (thousands separators are not "
        "read: write 1120); other cells of the column that are no number: '2 300' (row 3); "
        "'4 000' (row 4)\n"
    )


def test_a_cell_in_a_decimal_comma_column_is_quoted_as_written_and_the_option_reads_it(
    tmp_path, capsys
):
    text = "t;v\n1;12,5\n2;12,5*\n3;13,0\n4;12,0\n"
    rc, _, err, _, path = _run(tmp_path, capsys, text, "--time-col", "t", *GIVEN)
    assert rc == 2
    assert err == (
        f"{PROG}{path}: column 'v' row 3: '12,5*' is not a number (leave the cell empty or write "
        "NaN for a missing value, or pass --missing '12,5*' to read every such cell as missing)\n"
    )
    option = re.search(r"pass (--missing .+?) to read", err)[1]
    rc, _, err, out_dir, _ = _run(tmp_path, capsys, text, "--time-col", "t", *GIVEN,
                                  *shlex.split(option))  # fmt: skip
    assert rc == 0, err
    got = pd.read_csv(out_dir / "results.csv").query("kind == 'data'")["observed"]
    assert got.isna().tolist() == [False, True, False, False]
    assert got.dropna().tolist() == [12.5, 13.0, 12.0]


@pytest.mark.parametrize(
    "cell,hint,option",
    [("--", "a missing-value marker of the source; pass --missing=' --'", "--missing=' --'"),
     ("-n/a", "leave the cell empty or write NaN for a missing value, or pass --missing=-n/a",
      "--missing=-n/a")],
    ids=["two-dashes", "dash-word"],
)  # fmt: skip
def test_a_marker_starting_with_a_dash_gets_an_option_that_reads_it(
    tmp_path, capsys, cell, hint, option
):
    text = f"y\n1\n{cell}\n2\n3\n"
    rc, _, err, _, path = _run(tmp_path, capsys, text, *GIVEN)
    assert rc == 2
    assert err == (
        f"{PROG}{path}: column 'y' row 3: {cell!r} is not a number ({hint} to read every such "
        "cell as missing)\n"
    )
    rc, _, err, _, _ = _run(tmp_path, capsys, text, *GIVEN, *shlex.split(option))
    assert rc == 0, err
    assert f"note: --missing {cell!r}: 1 cell read as missing, in column 'y'" in err


def _nile_csv(scale: float = 1.0) -> str:
    years, flow = load_nile()
    return "year,flow\n" + "".join(
        f"{int(y)},{float(v) * scale!r}\n" for y, v in zip(years, flow, strict=True)
    )


def test_a_huge_log_likelihood_is_printed_in_scientific_notation(tmp_path, capsys):
    rc, out, err, out_dir, _ = _run(tmp_path, capsys, _nile_csv(1e200), "--time-col", "year",
                                    "--sigma2", "1e300", "--obs-var", "1e300",
                                    "--quiet")  # fmt: skip
    assert rc == 0, err
    line = "log-likelihood per series: flow=-4.215933651e+105"
    assert line in out.splitlines()
    assert line in (out_dir / "summary.txt").read_text().splitlines()
    # the Nile as docs quote it: four decimals
    rc, out, err, _, _ = _run(tmp_path, capsys, _nile_csv(), "--time-col", "year", "--fit",
                              "--fix", "theta=0", "--fix", "mu=0", "--quiet",
                              name="nile.csv")  # fmt: skip
    assert rc == 0, err
    assert "log-likelihood per series: flow=-632.5456" in out.splitlines()
    assert "total loglik -632.5456 over 100 observations" in out


def test_the_fit_table_prints_a_huge_or_tiny_log_likelihood_in_scientific_notation():
    years, flow = load_nile()
    fit = ks.fit_ou(flow, years, fix={"theta": 0.0, "mu": 0.0})
    table = fit.summary().splitlines()
    assert table[3].split()[-2:] == ["-632.5456", "True"]
    huge = dataclasses.replace(fit, loglik=np.float64(-4.2159336508682555e105)).summary()
    assert huge.splitlines()[3].split()[-2:] == ["-4.215933651e+105", "True"]
    assert "total loglik -4.215933651e+105 over 100 observations" in huge
    tiny = dataclasses.replace(fit, loglik=np.float64(2.5e-7)).summary()
    assert "total loglik 2.500000000e-07 over" in tiny


@pytest.mark.parametrize(
    "kw,message",
    [({"fix": {"theta": -1}}, "fix['theta']: expected values >= 0, got -1.0"),
     ({"fix": {"obs_var": np.float64(0.0)}}, "fix['obs_var']: expected values > 0, got 0.0"),
     ({"init": {"sigma2": np.float32(-2)}}, "init['sigma2']: expected values > 0, got -2.0"),
     ({"tol": np.float64(-1.0)}, "tol: expected a positive finite number, got -1.0")],
    ids=["fix-theta", "fix-obs-var", "init-sigma2", "tol"],
)  # fmt: skip
def test_fit_messages_print_plain_numbers(kw, message):
    y = np.array([1.0, 2.0, 1.5, 1.7])
    with pytest.raises(ValueError) as info:
        ks.fit_ou(y, **kw)
    assert str(info.value) == message


def test_quiet_says_what_it_hides_and_summary_keeps_the_notes(tmp_path, capsys):
    assert filter_main(["--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert (
        "--quiet no progress bar, no line on what was read and no notes on stderr (the notes "
        "stay in summary.txt); warnings and errors still print" in help_text
    )
    text = "q,y\n1959Q1,1\n1959Q2,2\n1959Q3,1.5\n1959Q4,1.7\n"
    rc, _, err, out_dir, _ = _run(tmp_path, capsys, text, "--time-col", "q", *GIVEN,
                                  "--time-unit", "91D", "--quiet")  # fmt: skip
    assert rc == 0 and err == ""
    note = "note: column 'q' holds quarter labels: each time is the first day of its quarter"
    assert note in (out_dir / "summary.txt").read_text().splitlines()
    # the note on --time-unit with numeric times: kept in summary.txt as well
    numeric = "t,y\n1,1\n2,2\n3,1.5\n"
    rc, _, err, out_dir, _ = _run(tmp_path, capsys, numeric, "--time-col", "t", *GIVEN,
                                  "--time-unit", "7D", "--quiet", name="num.csv")  # fmt: skip
    assert rc == 0 and err == ""
    assert (
        "note: --time-unit applies to dates only; numeric times are used as they are"
        in (out_dir / "summary.txt").read_text().splitlines()
    )


def test_cli_docs_say_what_quiet_hides_and_the_grunfeld_panel_size():
    sm = pytest.importorskip("statsmodels.api")
    d = sm.datasets.grunfeld.load_pandas().data
    text = " ".join((REPO / "docs" / "cli.md").read_text().split())
    assert f"Grunfeld panel ({d['firm'].nunique()} firms x {d['year'].nunique()} years" in text
    assert "`--quiet` hides it." not in text
    assert (
        "`--quiet` leaves stderr to warnings and errors: it hides the progress bar, the line "
        "saying what was read" in text
    )
