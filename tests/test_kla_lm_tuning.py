"""benchmarks/kla_lm_tuning.py: its argument checks and a dry run on the CPU (the script's path,
not the GPU figures)."""

import json

import pytest

from benchmarks import kla_lm_tuning as T
from kalmanscan.cuda.kla import chunked, tuning


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--variants", '[{"nope": 1}]'], "expected keys among"),
        (["--variants", '[{"maps.nope": 1}]'], "got ['maps.nope']"),
        (["--variants", "{}"], "expected a non-empty JSON list of objects"),
        (["--variants", "[{"], "expected a JSON list of objects"),
        (["--shape", "8by2048"], "expected BxL"),
    ],
)
def test_bad_arguments_name_the_argument(argv, expected, capsys):
    with pytest.raises(SystemExit):
        T.parse_args(["--out", "x.json", *argv])
    assert expected in capsys.readouterr().err


def test_apply_variant_sets_each_kind_of_key_and_restore_undoes_it():
    saved = T._saved()
    try:
        T.apply_variant({"NS": 3, "CHUNKS": 4, "maps.NS": 2, "tangent.unroll": 8,
                         "glue.CONV_WALK": [32, 64, 1, 1], "chunked.CARRY_NS": 8},
                        saved)  # fmt: skip
        assert tuning.TUNING["NS"] == 3 and tuning.CHUNKS == 4
        assert chunked.MAPS_LAUNCH["NS"] == 2 and chunked.TANGENT_LAUNCH["unroll"] == 8
        assert T.glue.CONV_WALK == (32, 64, 1, 1)  # (a tuple, as the module keeps it)
        assert chunked.CARRY_NS == 8
        assert chunked.MAPS_LAUNCH["unroll"] == saved[2]["unroll"]  # the others as they were
        T.apply_variant({}, saved)
        assert T._saved() == saved
    finally:
        T._restore(saved)


def test_dry_run_writes_every_variant_and_restores_the_tuning(tmp_path):
    before = T._saved()
    out = tmp_path / "t.json"
    variants = '[{}, {"NS": 3}, {"maps.NS": 2, "CHUNKS": 2}]'
    argv = ["--dry-run", "--out", str(out), "--variants", variants, "--rounds", "2",
            "--profiles", "1"]  # fmt: skip
    assert T.main(argv) == 0
    assert T._saved() == before
    rows = json.loads(out.read_text())["rows"]
    assert [r["variant"] for r in rows] == [{}, {"NS": 3}, {"maps.NS": 2, "CHUNKS": 2}]
    for r in rows:
        assert len(r["op_ms"]) == 2 and r["op_median_ms"] >= 0
        # on the CPU the op (torch) reads no TUNING entry: every run gives the first's loss and
        # gradients, bit for bit, through the script's comparison
        assert r["grad_rel_diff"] == 0.0 and r["loss_rel_diff"] == 0.0
