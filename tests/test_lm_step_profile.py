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
