"""The LM-step benchmark's profile split (benchmarks/lm_step.py): which GPU events count as
kernel time and in which category."""

from types import SimpleNamespace

from benchmarks.lm_step import _is_annotation, classify


def test_annotation_spans_are_not_kernel_time():
    # the optimizer's record_function span on the GPU covers its own kernels: counting it too
    # would add the optimizer's time twice
    assert _is_annotation(SimpleNamespace(name="Optimizer.step#AdamW.step"))
    assert _is_annotation(SimpleNamespace(name="anything", is_user_annotation=True))
    kern = "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdam>"
    assert not _is_annotation(SimpleNamespace(name=kern, is_user_annotation=False))
    assert not _is_annotation(SimpleNamespace(name="_kla_bwd_kernel"))


def test_kernel_categories():
    assert classify("_kla_bwd_kernel") == "kla_op"
    assert classify("_adjoint_maps_kernel") == "kla_op"
    assert classify("_glue_conv_walk_kernel") == "glue_fused"
    assert classify("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT") == "gemm"
    assert classify("void at::native::reduce_kernel<128, 4>") == "elementwise"
    assert classify("void pytorch_flash::flash_fwd_kernel") == "attention"


def test_profiled_steps_interleaved_and_their_median(tmp_path):
    """``--profile-steps``: every model's steps profiled in turn; the split is the median
    step's, the kernel ratio that of the two median steps, each round's ratio kept."""
    import json

    from benchmarks.lm_step import main

    out = tmp_path / "lm.json"
    main(["--dry-run", "--shapes", "2x16", "--models", "kla,attention", "--repeats", "1",
          "--profile-steps", "3", "--out", str(out)])  # fmt: skip
    for row in json.loads(out.read_text())["rows"]:
        kla, att = row["models"]["kla"], row["models"]["attention"]
        for m in (kla, att):
            totals = m["profile_total_ms_all"]
            assert len(totals) == 3
            assert m["profile_ms"]["total"] == sorted(totals)[1]  # the median step's split
        pairs = zip(kla["profile_total_ms_all"], att["profile_total_ms_all"], strict=True)
        ratios = [round(k / a, 3) for k, a in pairs]
        assert row["kla_over_attention_kernels_all"] == ratios
        want = round(kla["profile_ms"]["total"] / att["profile_ms"]["total"], 3)
        assert row["kla_over_attention_kernels"] == want
