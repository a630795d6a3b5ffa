"""The SASS loop counter of benchmarks/kla_sass.py (the instruction counts the docs give): which
instructions form a loop and how they are tallied, on a hand-written listing."""

from benchmarks.kla_sass import loops

LISTING = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   FADD R2, R1, R1 ;
        /*0020*/                   FFMA R3, R2, R2, R1 ;
        /*0030*/              @!P0 FMUL R4, R3, R3 ;
        /*0040*/               @P1 BRA 0x10 ;
        /*0050*/                   FMUL R5, R4, R4 ;
        /*0060*/                   BRA 0x50 ;
        /*0070*/                   EXIT ;
"""


def test_loops_count_the_instructions_between_a_backward_branch_and_its_target():
    found = loops(LISTING)
    # 0x10..0x40: FADD, FFMA, FMUL (predicated), BRA; 0x50..0x60: FMUL, BRA; the forward
    # branch-free prologue and the exit are in no loop
    assert [n for n, _ in found] == [4, 2]
    assert found[0][1] == {"FADD": 1, "FFMA": 1, "FMUL": 1, "BRA": 1}
    assert found[1][1] == {"FMUL": 1, "BRA": 1}
