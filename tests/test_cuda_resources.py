"""The kernels compiled for sm_90 (Hopper) on this machine, no GPU needed: no register spills,
a bounded register count and software-pipelined loads. Spilled register tiles made an earlier
version 30x slower on the H200 than its design; this catches that before device time is spent.
"""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")
# Compiling every kernel for sm_90 from an empty Triton cache takes about 3 minutes on 2 cores:
# CI runs it in its slow step (`pytest -m slow`), as gpu.py --resources before device time.
pytestmark = pytest.mark.slow
ROOT = os.path.join(os.path.dirname(__file__), "..")


@pytest.fixture(scope="module")
def resources():
    from benchmarks.gpu import triton_cuobjdump

    if triton_cuobjdump() is None:
        pytest.skip("triton's cuobjdump is not installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "gpu.py"), "--resources"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)["kernels"]


KERNELS = [
    "kla_fwd",
    "kla_fwd_infer",
    "kla_fwd_novar",
    "kla_bwd",
    "kla_bwd_ck4",
    "kla_bwd_ck4_nogyv",
    "kla_bwd_ck4_nogyv_atomic",
    "kla_bwd_ck8_rerun_nogyv_atomic",
    "kla_bwd_ck8_rerun_ahead",
    "kla_bwd_half",
    "filter_fwd",
    "filter_fwd_chunk_maps",
    "filter_fwd_chunked_tangents",
    "filter_bwd",
    "filter_bwd_chunked",
    "filter_carry",
    "filter_adj_carry",
]


# Budgets per kernel: registers a thread (the KLA kernels run one-warp programs whose threads
# hold several lanes and, in the backward, an 8-step interval of states, so they may use more),
# and bytes of spilled stack (the KLA backward's unrolled interval spills a few words on sm_90).
BUDGET = {
    "kla_fwd": (255, 0),
    "kla_fwd_infer": (128, 0),  # capped (tuning's fwd_maxnreg): 16 one-warp programs an SM
    "kla_bwd": (255, 64),
    "kla_bwd_ck4": (255, 0),  # the point of 4-step intervals: no spills at 4 slots a thread
    "kla_fwd_novar": (255, 0),
    "kla_bwd_ck4_nogyv": (255, 0),
    "kla_bwd_ck4_nogyv_atomic": (255, 0),
    "kla_bwd_ck8_rerun_nogyv_atomic": (255, 0),
    "kla_bwd_ck8_rerun_ahead": (255, 0),
    "kla_bwd_half": (255, 0),
    # the carries' tile scans: a [chunks, 16 lanes] tile of 7 (12) map entries over 128 threads,
    # a handful of programs whose walk over the tiles is latency-bound (occupancy is not)
    "filter_carry": (255, 0),
    "filter_adj_carry": (255, 0),
}


@pytest.mark.parametrize("name", KERNELS)
def test_no_spills_and_pipelined_loads(resources, name):
    r = resources[name]
    regs, stack = BUDGET.get(name, (128, 0))
    assert r["stack_bytes"] <= stack, f"{name} spills registers to local memory: {r}"
    assert r["registers"] <= regs, f"{name} uses {r['registers']} registers: {r}"
    assert r["cp_async"] > 0, f"{name} has no pipelined (cp.async) loads: {r}"


def test_reciprocals_per_step(resources):
    # filter forward (homogeneous (u, e, v) form): one IEEE division, the once-a-lane range check
    # of h*h/obs_var (constant in time here); the loop's normalizations and outputs take hardware
    # reciprocals (8 a step body: 1/max(u, v) twice, 1/u and 1/v for the outputs of the
    # predicted and filtered beliefs, shared where they coincide; float32's kept mean adds the
    # gain's 1/U and the observation's state z/h, kernels.kept_update). KLA forward: the predict
    # reciprocal and 1/lam for the readout, 2 a lane-step; the
    # compiled case has 4 lanes a thread ([32, 4] tile, one warp) and 5 step bodies (the 4
    # unrolled steps of a pipelined block and the one-step tail loop; without gradients the
    # blocks hold 8 steps), plus 1 / p once a lane (the lean form's e where the decay is 0).
    # float32 KLA kernels take one hardware reciprocal each (no division sequences)
    assert resources["filter_fwd"]["divisions"] == 1
    assert resources["filter_fwd"]["fast_reciprocals"] == 8
    assert resources["kla_fwd"]["fast_reciprocals"] == 2 * 4 * 5 + 4
    assert resources["kla_fwd_infer"]["fast_reciprocals"] == 2 * 4 * 9 + 4
    for name in KERNELS:
        if name.startswith("kla"):
            assert resources[name]["divisions"] == 0, (name, resources[name])


@pytest.mark.parametrize(
    "name",
    ["kla_chunk_maps", "kla_adjoint_maps", "kla_adjoint_maps_nogyv"],
)
def test_map_kernels_fit_in_registers(resources, name):
    # the chunked KLA op's map passes (chunked.MAPS_LAUNCH, TANGENT_LAUNCH): plain loads (one
    # pipeline stage measured fastest), no spills, at most 128 registers (16 one-warp programs
    # an SM; the tangent maps' double-buffered 8-step blocks at 2 slots take 128 on sm_90); the
    # tangent maps at 4 slots a thread took 168 and ran slower
    r = resources[name]
    assert r["stack_bytes"] == 0, f"{name} spills registers to local memory: {r}"
    assert r["registers"] <= 128, f"{name} uses {r['registers']} registers: {r}"


@pytest.mark.parametrize("name", ["kla_carry", "kla_adjoint_carry"])
def test_chunk_carries_pipeline_their_loads(resources, name):
    # a chunk's map (its adjoint map) does not depend on the state (adjoint) the carry walks:
    # the loads go ahead of the walk through cp.async, so the walk is not one load latency a chunk
    r = resources[name]
    assert r["cp_async"] > 0, f"{name}: the maps' loads are not pipelined: {r}"
    assert r["stack_bytes"] == 0, f"{name} spills registers to local memory: {r}"
