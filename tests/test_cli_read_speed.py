"""The CSV reader's single pass over the bytes (``_scan_file``: encoding, NUL bytes, comment and
blank lines) against its line-by-line reference (``_scan_lines``), with blocks of a few bytes so
that lines, CRLF pairs and UTF-8 sequences straddle them; and the checks it replaced still
catch what they caught anywhere in a file, past the first block. Also the parsing shortcuts of
the value and time columns: cells are read as before."""

from __future__ import annotations

import codecs
import itertools

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("xarray")
pytest.importorskip("matplotlib")

from kalmanscan.timeseries import csv_layout, csvfile  # noqa: E402
from kalmanscan.timeseries.cli import filter_main  # noqa: E402
from kalmanscan.timeseries.csvfile import InputError, read_csv_series  # noqa: E402

GIVEN = ["--sigma2", "1", "--obs-var", "1"]


def _reference(path):
    """What the reader did before the single pass: the encoding by decoding the whole file,
    then the text-mode line scan."""
    raw = path.read_bytes()
    encoding = "utf-8"
    for enc in ("utf-8-sig", "cp1252"):
        try:
            codecs.decode(raw, enc)
        except UnicodeDecodeError:
            continue
        encoding = "utf-8" if enc == "utf-8-sig" else enc
        break
    return (encoding, *csvfile._scan_lines(str(path), encoding))


PIECES = [
    b"t,v", b"1,2", b"# a comment", b"  # indented comment", b"\t#tab comment", b"", b"   ",
    b"\t \x0c", b"\x1f", b"x,GDP #1", b"2,#N/A", b"\xc2\xa0# after a no-break space (utf-8)",
    b"\xa0# after a no-break space (cp1252)", b"\xef\xbb\xbf# after a byte-order mark",
    b"caf\xc3\xa9,1", b"caf\xe9,1", b"\xe2\x80\x83", b"\xc2\x85", b"\x85# cp1252 ellipsis",
    b"3," + b"9" * 40, b"\x81bad", b"x\xc3", b"\xa9y",
]  # fmt: skip
ENDS = [b"\n", b"\r\n"]


@pytest.mark.parametrize("block", [1, 2, 3, 7, 64, 1 << 20])
def test_single_pass_equals_the_line_by_line_reference(tmp_path, monkeypatch, block):
    monkeypatch.setattr(csv_layout, "_BLOCK", block)
    rng = np.random.default_rng(block)
    path = tmp_path / "f.csv"
    for k in range(60):
        n = int(rng.integers(0, 12))
        picks = [PIECES[i] for i in rng.integers(0, len(PIECES), size=n)]
        ends = [ENDS[i] for i in rng.integers(0, 2, size=n)]
        raw = b"".join(p + e for p, e in zip(picks, ends, strict=True))
        if n and rng.random() < 0.3:  # no line end after the last line
            raw = raw[: -len(ends[-1])]
        path.write_bytes(raw)
        got = csvfile._scan_file(str(path))
        assert (got[0], got[1], list(got[2])) == _reference(path), (k, raw)


@pytest.mark.parametrize("block", [1, 2, 3, 4, 5])
def test_a_utf8_sequence_cut_by_ascii_bytes_is_not_utf8(tmp_path, monkeypatch, block):
    # a lead byte, a line end, then a continuation byte: no character, whatever the blocks
    monkeypatch.setattr(csv_layout, "_BLOCK", block)
    path = tmp_path / "f.csv"
    path.write_bytes(b"t,v\nx\xc3\n\xa9y\n")
    encoding, comments, rows = csvfile._scan_file(str(path))
    assert (encoding, comments, list(rows)) == _reference(path) == ("cp1252", [], [1, 2, 3])


@pytest.mark.parametrize("raw", [b"t,v\r1,2\r# c\r3,4\r", b"t,v\n1,2\r# c\n"], ids=["cr", "mixed"])
def test_lone_carriage_returns_are_scanned_line_by_line(tmp_path, monkeypatch, raw):
    monkeypatch.setattr(csv_layout, "_BLOCK", 3)
    path = tmp_path / "f.csv"
    path.write_bytes(raw)
    got = csvfile._scan_file(str(path))
    assert (got[0], got[1], list(got[2])) == _reference(path)


def test_utf16_is_scanned_line_by_line(tmp_path):
    path = tmp_path / "f.csv"
    path.write_bytes("t\tv\n# c\n1\t2\n".encode("utf-16"))
    assert csvfile._scan_file(str(path)) == ("utf-16", [1], [1, 3])


def _big(tmp_path, rows=30000, tail=b""):
    """A CSV of more than one block (about 0.6 MB at 30000 rows x 20 bytes), ``tail`` last."""
    body = "".join(f"{i},{(i * 7) % 13 + 0.25}\n" for i in range(rows)).encode()
    path = tmp_path / "big.csv"
    path.write_bytes(b"t,v\n" + body + tail)
    return path


@pytest.mark.parametrize("block", [4096, 1 << 20])
def test_checks_still_see_the_end_of_a_large_file(tmp_path, capsys, monkeypatch, block):
    monkeypatch.setattr(csv_layout, "_BLOCK", block)
    # a NUL byte in the last line
    path = _big(tmp_path, tail=b"30000,1\x00\n")
    with pytest.raises(InputError, match="is a binary file"):
        read_csv_series(str(path), "t")
    # a Windows-1252 byte in the last line: read as cp1252, with the note
    path = _big(tmp_path, tail=b"# r\xe9sum\xe9\n30000,1\n")
    notes = []
    times, z, _, _ = read_csv_series(str(path), "t", notes=notes)
    assert "not UTF-8; read as Windows-1252 (cp1252)" in notes[0]
    assert z.shape == (30001, 1) and times[-1] == 30000
    # a comment line and blank lines near the end are skipped, and rows after them keep the
    # line a user sees: the bad value on line 30006 is named there
    path = _big(tmp_path, tail=b"# a comment\n\n   \n30000,1\n30001,abc\n")
    with pytest.raises(InputError, match=r"column 'v' row 30006: 'abc' is not a number"):
        read_csv_series(str(path), "t")


def test_value_cells_read_as_before():
    col = pd.Series([" 1.5", "1.5 ", "\t2", "2.5\xa0", "\xa03", "", "  ", "NA", " nan ", "NaN",
                     "-0", "1e5", None], dtype=str)  # fmt: skip
    got = csvfile._parse_values(col, "f.csv", "v")
    want = [1.5, 1.5, 2, 2.5, 3, np.nan, np.nan, np.nan, np.nan, np.nan, 0, 1e5, np.nan]
    np.testing.assert_array_equal(got, want)
    bad = pd.Series(["1", "x\xa0", "2", "y", "x"], dtype=str)
    with pytest.raises(InputError) as err:
        csvfile._parse_values(bad, "f.csv", "v")
    assert "row 3: 'x\\xa0' is not a number" in str(err.value)
    assert "no number: 'y' (row 5)" in str(err.value)  # 'x' stripped is the first text again
    with pytest.raises(InputError, match="row 3: '1e400' is infinite"):
        csvfile._parse_values(pd.Series(["1", "1e400"], dtype=str), "f.csv", "v")


@pytest.mark.parametrize(
    "cells,kind",
    [(["2024-01-01", "2024-01-02", "2024-01-03", "4", "5"], "dates"),  # numbers only at the end
     (["1", "2024-01-02", "3", "4"], "numbers"),  # half and more: numbers, the date is named
     (["1", "2", "1e400"], "not finite")],
)  # fmt: skip
def test_time_columns_decide_numbers_or_dates_as_before(cells, kind):
    col = pd.Series(cells, dtype=str)
    if kind == "dates":
        with pytest.raises(InputError, match="cannot parse '4' as a time"):
            csvfile._parse_times(col, "f.csv", "t")
    elif kind == "numbers":
        with pytest.raises(InputError, match="row 3: cannot parse '2024-01-02' as a time \\(the "
                           "column holds numbers"):  # fmt: skip
            csvfile._parse_times(col, "f.csv", "t")
    else:
        with pytest.raises(InputError, match="row 4: '1e400' is not a finite time"):
            csvfile._parse_times(col, "f.csv", "t")


def test_a_large_file_reads_like_the_same_file_written_small(tmp_path, capsys):
    """The range row numbers of a file without comment or blank lines and the list of one with
    them give the same results."""
    rows = [f"2024-01-{d:02d} {h:02d}:00:00,{(d * h) % 7 - 3.5},{d + h / 10}" for d, h in
            itertools.product(range(1, 29), range(24))]  # fmt: skip
    plain = tmp_path / "plain.csv"
    plain.write_text("time,a,b\n" + "\n".join(rows) + "\n")
    commented = tmp_path / "commented.csv"
    commented.write_text("# hourly\ntime,a,b\n\n" + "\n".join(rows) + "\n# end\n")
    args = ["--time-col", "time", *GIVEN, "--time-unit", "1h", "--quiet"]
    assert filter_main([str(plain), *args, "--out", str(tmp_path / "p")]) == 0
    assert filter_main([str(commented), *args, "--out", str(tmp_path / "c")]) == 0
    capsys.readouterr()
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "p" / "results.csv"),
                                  pd.read_csv(tmp_path / "c" / "results.csv"))  # fmt: skip
