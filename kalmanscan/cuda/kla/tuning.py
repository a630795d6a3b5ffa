"""The KLA kernels' launch choices: pipeline depths, slots a thread, checkpoint interval and
L2 prefetch distance, the last three chosen by the lane count ``B M S``; and the cache of
launch plans. Every alternative that lost on every measured shape was deleted (its timings:
benchmarks/HISTORY.md, "KLA kernels: variants deleted"); what is left here either differs by
shape or is a number that benchmarks/gpu.py and benchmarks/kla_kernel_time.py sweep.
"""

from __future__ import annotations

from kalmanscan.cuda._common import next_pow2

# Entries a sweep may override (``None``: chosen by the lane count, :func:`tuning_for`).
TUNING = {
    "NS": 4,  # pipeline stages of the forward's loads
    "bwd_NS": 3,  # pipeline stages of the backward's checkpoint intervals
    "fwd_slots": 4,  # slots a thread walks in the forward
    "bwd_slots": None,  # slots a thread walks in the backward: 2 below LARGE lanes, else 4
    "bwd_l2_ahead": None,  # steps the backward prefetches rows into L2: 0, or 32 from LARGE
    "ck": None,  # steps between the forward's checkpoints: 8, or 4 from LARGE lanes
}
LARGE = 1 << 17  # lanes B M S from which the backward takes 4 slots a thread and not 2
WARPS = 1  # a program is one warp (its reduce-scatters shuffle within the warp)


def tuning_for(lanes: int) -> dict:
    """``TUNING`` with its ``None`` entries chosen for ``lanes = B M S`` lanes."""
    t = dict(TUNING)
    large = lanes >= LARGE
    if t["bwd_slots"] is None:
        t["bwd_slots"] = 4 if large else 2
    if t["bwd_l2_ahead"] is None:
        t["bwd_l2_ahead"] = 32 if large else 0
    if t["ck"] is None:
        t["ck"] = 4 if large else 8
    if t["ck"] not in (4, 8):
        raise ValueError(f"TUNING['ck']: expected 4 or 8, got {t['ck']!r}")
    return t


def block_steps(save_ck: bool) -> int:
    """Steps a block of the forward: 4 when it saves the backward's checkpoints, else 8."""
    return 4 if save_ck else 8


def layout(S: int, slots: int):
    """``(G, SG, NT, num_warps)``: ``SG`` slots a thread (``slots``, at most the padded ``S``),
    ``G`` threads a channel, ``NT`` threads a program."""
    SP = next_pow2(S)
    NT = 32 * WARPS
    SG = max(min(slots, SP), SP // NT)
    return SP // SG, SG, NT, WARPS


_PLANS: dict = {}  # launch plans by (make, shape and flags, TUNING, LARGE); see plan


def plan(make, *key):
    """``make(*key)``, kept by ``key``, ``TUNING`` and ``LARGE`` as they are now: a launch
    configuration (sizes, grids, the kernel's constexprs) is a few microseconds of host time to
    derive, a share of a B=4 forward call. The cache is bounded (shapes come and go, varying
    L)."""
    full = (make, key, tuple(TUNING.items()), LARGE)
    hit = _PLANS.get(full)
    if hit is None:
        if len(_PLANS) >= 256:
            _PLANS.clear()
        hit = _PLANS[full] = make(*key)
    return hit
