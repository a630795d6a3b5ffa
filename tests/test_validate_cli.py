"""``kalmanscan validate``'s arguments: refused before the battery runs, with exit status 2 (a
failed row is 1), a message naming the flag, what it expects and what it got."""

from __future__ import annotations

import pytest

from kalmanscan import validate, validation
from kalmanscan.validation.battery import BatteryResult


@pytest.fixture
def no_battery(monkeypatch):
    """Any run of the battery fails the test: the argument must be refused first."""
    monkeypatch.setattr(validation, "run_battery", lambda *a, **k: pytest.fail("battery ran"))


@pytest.mark.parametrize(
    "flag,name",
    [
        ("--csv", "no-such-folder/v.csv"),
        ("--markdown", "no-such-folder/v.md"),
        ("--figure", "no-such-folder/fig.png"),
        ("--drift-figure", "no-such-folder/drift.png"),
    ],
)
def test_an_output_in_a_missing_folder_is_refused_before_the_run(
    tmp_path, capsys, no_battery, flag, name
):
    path = str(tmp_path / name)
    assert validate.main(["--quick", "-q", flag, path]) == 2
    err = capsys.readouterr().err
    assert f"{flag}: expected a path in an existing folder, got {path!r}" in err
    assert "Traceback" not in err


def test_a_folder_given_as_output_file_is_refused(tmp_path, capsys, no_battery):
    assert validate.main(["--quick", "--csv", str(tmp_path)]) == 2
    assert f"--csv: expected a file path, got the folder {str(tmp_path)!r}" in (
        capsys.readouterr().err
    )


def test_a_figure_in_a_format_matplotlib_cannot_write_is_refused(tmp_path, capsys, no_battery):
    pytest.importorskip("matplotlib")
    path = str(tmp_path / "fig.bogus")
    assert validate.main(["--quick", "--figure", path]) == 2
    err = capsys.readouterr().err
    assert "--figure: expected a figure file ending in one of" in err and "png" in err
    assert repr(path) in err


def test_an_unwritable_folder_is_refused(tmp_path, capsys, no_battery, monkeypatch):
    import tempfile

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)  # as a read-only folder answers
    path = str(tmp_path / "v.csv")
    assert validate.main(["--quick", "--csv", path]) == 2
    err = capsys.readouterr().err
    assert f"--csv: expected a writable path, got {path!r} (Permission denied)" in err


def test_writable_outputs_create_no_file_before_the_run(tmp_path, monkeypatch):
    """The check leaves nothing behind: a run that then stops writes no empty files."""

    def stop(*a, **k):
        raise KeyError("stopped")

    monkeypatch.setattr(validation, "run_battery", stop)
    monkeypatch.setattr(validate, "_missing_truths", lambda: [])  # (the battery is replaced)
    with pytest.raises(KeyError):
        validate.main(["--quick", "-q", "--csv", str(tmp_path / "v.csv")])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("seed", ["-1", "abc", "1.5"])
def test_a_bad_seed_is_an_argument_error(capsys, no_battery, seed):
    assert validate.main(["--quick", "--seed", seed]) == 2
    err = capsys.readouterr().err
    assert "argument --seed: expected an integer >= 0, got" in err and seed in err
    assert "Traceback" not in err


def test_help_lists_every_runner(capsys):
    assert validate.main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the help text
    for label in ("sequential", "torch", "native", "torch-cuda", "triton"):
        assert label in out.replace("torch- cuda", "torch-cuda")
    assert set(validate.RUNNERS) >= {r.label for r in validation.available_runners()}


def test_a_write_that_fails_after_the_run_is_reported_not_raised(tmp_path, capsys, monkeypatch):
    row = dict(
        truth="filterpy", quantity="loglik", dtype="float64", backend="torch",
        max_rel_err=1e-13, tol=1e-9, n_models=1,
    )  # fmt: skip
    monkeypatch.setattr(validation, "run_battery", lambda *a, **k: BatteryResult(rows=[row]))
    monkeypatch.setattr(validate, "_regime_rows", lambda *a: [])
    monkeypatch.setattr(validate, "_missing_truths", lambda: [])  # (the battery is replaced)

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(validation.report, "write_csv", full_disk)
    assert validate.main(["--quick", "-q", "--csv", str(tmp_path / "v.csv")]) == 2
    err = capsys.readouterr().err
    assert "could not write the results" in err and "No space left on device" in err
