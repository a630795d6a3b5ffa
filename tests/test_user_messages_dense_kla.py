"""Messages that name the argument as the user gave it, the expected and the received
(the probe's problem 8): a masked entry of a dense model parameter (reported as NaN or inf and
missing data before), an empty batch of tokens (reported as the layer's internal ``x``), and the
``kalmanscan inspect`` options ``--file``, ``--compare-file``, ``--window`` and ``--channels``
(a bare ``[Errno 2]`` and the library's argument names before)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import kalmanscan.dense as kd
from kalmanscan.kla import KLAConfig, KLALanguageModel, ModelConfig, cli, save_checkpoint


@pytest.mark.parametrize(
    "name, index",
    [("F", (1, 1)), ("Q", (0, 1)), ("H", (0, 1)), ("R", (0, 0)), ("offset", (1,)),
     ("prior_cov", (1, 0)), ("prior_mean", (0,))],
)  # fmt: skip
def test_masked_parameter_entry_is_named_as_masked(name, index):
    m = kd.local_linear_trend(1.0, 0.1, 2.0)
    args = dict(m._asdict(), prior_mean=np.zeros(2), prior_cov=np.eye(2))
    value = np.array(args[name], dtype=float)
    mask = np.zeros(value.shape, dtype=bool)
    mask[index] = True
    args[name] = np.ma.masked_array(value, mask=mask)
    with pytest.raises(ValueError) as err:
        kd.filter(np.arange(5.0)[:, None], **args)
    assert str(err.value) == (
        f"{name}: expected a number at every index (a parameter has no missing values), got a "
        f"masked value at index {index}"
    )


def test_masked_data_is_still_missing_data():
    m = kd.local_linear_trend(1.0, 0.1, 2.0)
    z = np.ma.masked_array(np.arange(5.0)[:, None], mask=[[0], [1], [0], [0], [0]])
    zn = np.arange(5.0)[:, None]
    zn[1] = np.nan
    assert kd.filter(z, **m._asdict()).loglik == kd.filter(zn, **m._asdict()).loglik
    # a masked array with nothing masked is an ordinary parameter
    Q = np.ma.masked_array(m.Q, mask=np.zeros((2, 2), dtype=bool))
    assert kd.filter(zn, **dict(m._asdict(), Q=Q)).loglik == kd.filter(zn, **m._asdict()).loglik
    with pytest.raises(ValueError, match=r"^Q: .* masked value at index \(1, 0\)"):
        kd.filter(zn, **dict(m._asdict(), Q=np.ma.masked_array(m.Q, mask=[[0, 0], [1, 0]])))


def tiny_model():
    torch.manual_seed(0)
    return KLALanguageModel(ModelConfig(d_model=16, n_layers=1, kla=KLAConfig(d_state=2)))


@pytest.mark.parametrize("shape", [(0, 3), (2, 0), (0, 0)])
def test_empty_tokens_are_named_tokens(shape):
    model = tiny_model()
    want = f"tokens: expected shape [B, L] with B >= 1 and L >= 1, got {shape}"
    with pytest.raises(ValueError) as err:
        model(torch.zeros(shape, dtype=torch.long))
    assert str(err.value) == want
    with pytest.raises(ValueError) as err:
        model.generate(torch.zeros(shape, dtype=torch.long), 2)
    assert str(err.value) == want


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_checkpoint(tiny_model(), tmp_path_factory.mktemp("ck"))


def run_inspect(capsys, tmp_path, checkpoint, *argv):
    rc = cli.inspect_main([*argv, "--checkpoint", str(checkpoint), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    return rc, err[-1] if err else ""


def test_inspect_missing_file_names_the_option_and_path(capsys, tmp_path, checkpoint):
    missing = tmp_path / "no-such-file.txt"
    rc, msg = run_inspect(capsys, tmp_path, checkpoint, "--file", str(missing))
    assert rc == 2
    assert msg == (
        f"kalmanscan inspect: --file: expected a readable file, got {str(missing)!r} "
        "(No such file or directory)"
    )
    rc, msg = run_inspect(capsys, tmp_path, checkpoint, "--file", str(tmp_path))
    assert rc == 2
    assert msg.startswith(f"kalmanscan inspect: --file: expected a readable file, got "
                          f"{str(tmp_path)!r} (")  # fmt: skip
    rc, msg = run_inspect(capsys, tmp_path, checkpoint, "abc", "--compare-file", str(missing))
    assert rc == 2
    assert msg == (
        f"kalmanscan inspect: --compare-file: expected a readable file, got {str(missing)!r} "
        "(No such file or directory)"
    )
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("window", ["10:20", "2:2", "3:9", "-1:2"])
def test_inspect_window_out_of_range_names_the_option_as_typed(capsys, tmp_path, checkpoint,
                                                                window):  # fmt: skip
    rc, msg = run_inspect(capsys, tmp_path, checkpoint, "abc", f"--window={window}")
    assert rc == 2
    assert msg == (
        "kalmanscan inspect: --window: expected START:STOP with 0 <= START < STOP and START "
        f"below the text's 3 tokens (bytes), got {window!r}"
    )


def test_inspect_channels_out_of_range_names_the_option_as_typed(capsys, tmp_path, checkpoint):
    rc, msg = run_inspect(
        capsys, tmp_path, checkpoint, "abc", "--channels", "0-99", "--window", "0:2"
    )
    assert rc == 2
    assert msg == (
        "kalmanscan inspect: --channels: expected channel ids in [0, 32) (the inspected blocks' "
        "channels), got 68 outside it (32, 33, 34, 35, 36, ...) from '0-99'"
    )
    rc, msg = run_inspect(capsys, tmp_path, checkpoint, "abc", "--channels", "", "--window", "0:2")
    assert rc == 2
    assert msg.startswith("kalmanscan inspect: --channels: expected channel ids in [0, 32)")
    assert msg.endswith("got none from ''")


def test_inspect_library_messages_are_reworded_to_options():
    detail = (
        "window, channels: the per-lane detail would take 3.00 GiB > max_detail_bytes=2.00 GiB "
        "(1 layers x 32 channels x 9 tokens); pass a window=(start, stop), fewer channels or "
        "detail=False (summaries only, any length)"
    )
    assert cli._as_options(detail) == (
        "--window, --channels: the per-lane detail would take 3.00 GiB > max_detail_bytes=2.00 "
        "GiB (1 layers x 32 channels x 9 tokens); pass a shorter --window START:STOP or fewer "
        "--channels (without --window: summaries only, any length)"
    )
    assert cli._as_options("layers: expected distinct layers, got [0] more than once") == (
        "--layers: expected distinct layers, got [0] more than once"
    )
    # other messages (a checkpoint's, the text's) are left as they are
    for msg in ("checkpoint: expected a config file x, found none", "text: expected text"):
        assert cli._as_options(msg) == msg
    assert re.match(r"^--chunk-size: ", cli._as_options("chunk_size: expected a positive int"))


def test_inspect_of_no_sequences_names_tokens():
    from kalmanscan.kla import KLAConfig, KLALanguageModel, ModelConfig, inspect

    model = KLALanguageModel(ModelConfig(d_model=16, n_layers=1, kla=KLAConfig(d_state=2)))
    with pytest.raises(ValueError, match=r"^tokens: expected shape .* B >= 1 .* got \(0, 3\)"):
        inspect(model, torch.zeros(0, 3, dtype=torch.long))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this torch has CUDA")
@pytest.mark.parametrize("mixers", ["kla", "attention"])
def test_init_state_on_a_device_torch_cannot_use_names_device(mixers):
    from kalmanscan.kla import KLAConfig, KLALanguageModel, ModelConfig

    cfg = ModelConfig(d_model=16, n_layers=1, kla=KLAConfig(d_state=2), mixers=mixers)
    model = KLALanguageModel(cfg)
    with pytest.raises(ValueError, match=r"^device: expected a device this torch can use"):
        model.init_state(1, device="cuda")
