"""Compile the KLA kernels for sm_90 (no GPU needed) over a matrix of shapes and settings, with
every feature on (tile loads, reduce-scatters, L2 prefetch in the backward, the precisions
output, the gradient of the precisions, the forward's 4-step blocks saving checkpoints and its
8-step blocks without): slots S of 1, 12, 16 and 64, float32, float64 and bfloat16 inputs, 2
slots a thread with 8-step checkpoint intervals and 4 with 4-step ones (the two choices of
``tuning.tuning_for``). The interpreter does not lower a kernel to the GPU, so this is how a
change is checked to compile everywhere before a device session. Prints each failure and the
count (72 compilations; the earlier matrix of 96 took about 20 minutes on 2 cores):

    python benchmarks/kla_compile_matrix.py
"""

from __future__ import annotations

import itertools
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

FWD_PTRS = ("v_ptr Lv_ptr k_ptr q_ptr a_ptr p_ptr lam0_ptr eta0_ptr y_ptr yvar_ptr lamT_ptr "
            "etaT_ptr prec_ptr ck_ptr")  # fmt: skip
BWD_PTRS = ("v_ptr Lv_ptr k_ptr q_ptr a_ptr p_ptr ck_ptr gy_ptr gyv_ptr glT_ptr geT_ptr gprec_ptr "
            "gv_ptr gLv_ptr gk_part_ptr gq_part_ptr ga_part_ptr gp_part_ptr g0_ptr")
INPUTS = ("v_ptr", "Lv_ptr", "k_ptr", "q_ptr")  # half inputs stay half; the rest is float32


def signature(ptrs, ints, dt):
    compute = "fp64" if dt == "fp64" else "fp32"
    d = {n: (f"*{dt}" if n in INPUTS else f"*{compute}") for n in ptrs.split()}
    d.update({n: "i32" for n in ints.split()})
    return d


def main():
    from gpu import compile_sm90

    from kalmanscan.cuda.kla import backward as KB
    from kalmanscan.cuda.kla import forward as KF
    from kalmanscan.cuda.kla import tuning as KT

    failures = 0
    matrix = itertools.product([1, 12, 16, 64], ["fp32", "fp64", "bf16"], [2, 4])
    for S, dt, slots in matrix:
        CK = 4 if slots == 4 else 8
        G, SG, NT, warps = KT.layout(S, slots)
        common = dict(S=S, G=G, SG=SG, NT=NT)
        cases = {
            "fwd-ck": (KF._kla_fwd_kernel, FWD_PTRS, "L M NB",
                       dict(common, CK=CK, NS=4, SAVE_PREC=True, SAVE_CK=True, EVEN_M=True,
                            W=KT.block_steps(True), VAR=True)),
            "fwd-infer": (KF._kla_fwd_kernel, FWD_PTRS, "L M NB",
                          dict(common, CK=CK, NS=4, SAVE_PREC=True, SAVE_CK=False, EVEN_M=False,
                               W=KT.block_steps(False), VAR=True)),
            "bwd": (KB._kla_bwd_kernel, BWD_PTRS, "L M NB B",
                    dict(common, CK=CK, NS=3, HAS_GPREC=True, AHEAD=32, HAS_GYV=True)),
        }  # fmt: skip
        for which, (fn, ptrs, ints, consts) in cases.items():
            try:
                compile_sm90(fn, signature(ptrs, ints, dt), consts, warps)
            except Exception as e:  # report every failing configuration, then the count
                failures += 1
                cause = e
                while cause.__cause__ is not None:
                    cause = cause.__cause__
                print(f"FAIL {which} S={S} {dt} slots={slots} ck={CK}: "
                      f"{str(cause).splitlines()[-1][:200]}", flush=True)  # fmt: skip
    print(f"failures: {failures}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
