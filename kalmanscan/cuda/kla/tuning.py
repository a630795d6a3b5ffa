"""The KLA kernels' launch choices: pipeline depths, slots a thread, checkpoint interval, the
backward's rerun of half an interval and L2 prefetch distance, the last four chosen by the lane
count ``B M S`` (the interval also by the inputs' precision, the prefetch also by the channels
``M``), and the no-gradient forward's register cap; and the cache of launch plans. Every
alternative that lost on every measured shape was deleted (its timings: benchmarks/HISTORY.md,
"KLA kernels: variants deleted"); what is left here either differs by shape or is a number that
benchmarks/gpu.py and benchmarks/kla_kernel_time.py sweep.
"""

from __future__ import annotations

from kalmanscan.cuda._common import next_pow2

# Entries a sweep may override (``None``: chosen by the lane count, :func:`tuning_for`).
TUNING = {
    # pipeline stages of the forward's loads: 5, not 4 (H200, the KLA LM step at 8 x 2,048 on the
    # device's Triton 3.6, two rounds in one process: forward 1.415 -> 1.367 ms a step, 3 stages
    # 1.693; results/kla-lm-tuning-h200.json)
    "NS": 5,
    "bwd_NS": 3,  # pipeline stages of the backward's checkpoint intervals
    "fwd_slots": 4,  # slots a thread walks in the forward
    "bwd_slots": None,  # slots a thread walks in the backward: 2 below LARGE lanes, else 4
    # steps the backward prefetches rows into L2: 32 from LARGE lanes of at least L2_AHEAD_M
    # channels, else 0 (H200: B=8 M=2,048 float32 backward 1.68 ms against 1.81 without, on the
    # code of benchmarks/HISTORY.md's "variants" table; the KLA LM's M = 1,024 at 8 x 2,048,
    # 3.452 ms a step with 32 against 3.325 without, 64 no better, in one process,
    # results/kla-lm-tuning-h200.json)
    "bwd_l2_ahead": None,
    # steps between the forward's checkpoints (4 or 8): 8, but 4 from LARGE lanes when the
    # inputs are half (their backward at 8-step intervals with the rerun below compiled to 255
    # registers and 184 bytes of stack on the H200's Triton 3.6)
    "ck": None,
    # with 8-step checkpoint intervals, the backward recomputes an interval's first half again
    # after walking back its second half instead of keeping its states (4 live, as at ck 4):
    # True from LARGE lanes (4 slots a thread), where 8 live states would not fit. H200, the
    # LM step (results/kla-ck-rerun-h200.json, against ck 4 there): the forward 1.66 -> 1.44 ms
    # a step at 8 x 2,048, the backward 3.86 -> 4.01, kernels a step 0.1 ms fewer, and the
    # checkpoints' memory halved (peak 8.1 -> 6.6 GB; 15.1 -> 12.1 at 1 x 32,768)
    "bwd_rerun": None,
    # registers a thread of the float32 no-gradient forward (8-step blocks) at up to 32 padded
    # slots; 0: ptxas's choice. With 128, 16 one-warp programs share an SM's 65,536 registers,
    # where ptxas's own 154-158 at S = 16 leave room for 12, so the 2,048 programs of B=8 M=2048
    # run in one wave (H200 kernel 0.430 against 0.447 ms; B=4 M=960 0.135 against 0.140;
    # benchmarks/HISTORY.md). No spills at S = 4 ... 32 (sm_90); float64 and 64 slots would
    # spill, so they keep ptxas's choice
    "fwd_maxnreg": 128,
    # the backward's sums over channels of gk, gq added by float32 atomics into [B, L, S] (in
    # L2), not stored as [M / channels a program, B, L, S] partial sums for a torch sum (268 MB
    # a layer at B=8 L=2,048 M=1,024 S=16); and the sums over batch rows of gdecay,
    # gprocess_var into [M, S] (not [B, M, S] partials: one torch sum kernel a call fewer);
    # off under torch.use_deterministic_algorithms
    "bwd_atomic_sums": True,
}
LARGE = 1 << 17  # lanes B M S from which the backward takes 4 slots a thread and not 2
L2_AHEAD_M = 2048  # channels from which the backward prefetches into L2 (at LARGE lanes)
WARPS = 1  # a program is one warp (its reduce-scatters shuffle within the warp)


def tuning_for(lanes: int, half: bool = False, channels: int | None = None) -> dict:
    """``TUNING`` with its ``None`` entries chosen for ``lanes = B M S`` lanes (``half``: the
    op's inputs are float16 / bfloat16; ``channels``: ``M``, None for at least
    ``L2_AHEAD_M``)."""
    t = dict(TUNING)
    large = lanes >= LARGE
    if t["bwd_slots"] is None:
        t["bwd_slots"] = 4 if large else 2
    if t["bwd_l2_ahead"] is None:
        wide = channels is None or channels >= L2_AHEAD_M
        t["bwd_l2_ahead"] = 32 if large and wide else 0
    if t["ck"] is None:
        t["ck"] = 4 if large and half else 8
    if t["bwd_rerun"] is None:
        t["bwd_rerun"] = large
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


# Time chunks (``chunked.py``): where the lanes are too few to fill the device, the op runs in
# ``C`` chunks of ``L / C`` steps in parallel, as if the batch had ``B C`` rows. H200, d_model 512
# (M = 1024, S = 16), one layer's forward + backward (benchmarks/results/kla-chunked-h200.json):
# 16,384 lanes at L = 32,768 9.16 ms unchunked against 4.33 / 4.00 / 3.92 ms in 8 / 32 / 64
# chunks, at L = 131,072 36.1 against 15.4 ms in 32; 32,768 lanes at L = 8,192 2.51 against
# 2.10 ms in 16 chunks (the forward alone 0.64 against 0.70). Chunks of 512 steps, not 256 or
# 1,024: inside the KLA LM step (benchmarks/kla_lm_tuning.py,
# results/kla-lm-map-launch-h200.json) the op's kernels a step at 1 x 32,768 in 64 chunks
# against 32: 15.95 against 16.15 ms (4-step tangent-map blocks), 15.63 against 15.73 (8-step);
# at 1 x 131,072 61.9 against 62.8; 2 x 8,192 in 16 chunks 25.05 ms of kernels a step against
# 25.10 in 32 (benchmarks/HISTORY.md), the op alone 1.91 against 1.97 ms
CHUNKS = None  # a fixed chunk count (a divisor of L) for every call, or None: chunks_for's rule
CHUNK_BELOW = 256  # lanes an SM below which the op is chunked
LANES_PER_SM = 8192  # lanes times chunks an SM that the chunk count aims for
MAX_CHUNKS = 64  # most chunks (the chunked op's float32 error grows with their count)
MIN_CHUNK = 512  # fewest steps a chunk: shorter ones spend more on the maps than they save


def chunks_for(lanes: int, L: int, sms: int) -> int:
    """Time chunks ``C`` for ``lanes = B M S`` lanes of ``L`` steps on a device of ``sms``
    multiprocessors: 1 where ``lanes >= CHUNK_BELOW sms`` (the sequential pass fills the
    device), else the largest divisor of ``L`` at most ``ceil(LANES_PER_SM sms / lanes)`` and
    ``MAX_CHUNKS`` with chunks of at least ``MIN_CHUNK`` steps (1 where there is none).
    ``CHUNKS`` set overrides the rule (it must divide ``L``). ``benchmarks/kla_chunked.py``
    times the op at every chunk count.

    >>> chunks_for(8 * 1024 * 16, 2048, 132), chunks_for(1 * 1024 * 16, 32768, 132)
    (1, 64)
    >>> chunks_for(2 * 1024 * 16, 8192, 132)
    16
    """
    if CHUNKS is not None:
        if not (isinstance(CHUNKS, int) and CHUNKS >= 1 and L % CHUNKS == 0):
            raise ValueError(f"tuning.CHUNKS: expected a positive divisor of L={L}, got {CHUNKS!r}")
        return CHUNKS
    key = (lanes, L, sms, CHUNK_BELOW, LANES_PER_SM, MAX_CHUNKS, MIN_CHUNK)
    hit = _CHUNK_COUNTS.get(key)
    if hit is None:
        if len(_CHUNK_COUNTS) >= 256:
            _CHUNK_COUNTS.clear()
        top = 1
        if lanes < CHUNK_BELOW * sms:
            top = min(-(-LANES_PER_SM * sms // lanes), MAX_CHUNKS, L // MIN_CHUNK)
        hit = _CHUNK_COUNTS[key] = next((c for c in range(top, 1, -1) if L % c == 0), 1)
    return hit


_CHUNK_COUNTS: dict = {}  # chunks_for's answers (a call's host time: one lookup)


_SMS: dict = {}


def sm_count(device) -> int:
    """Multiprocessors of a CUDA ``device`` (kept per device); 0 for any other device (no
    chunking unless ``CHUNKS`` is set)."""
    if device.type != "cuda":
        return 0
    hit = _SMS.get(device.index)
    if hit is None:
        import torch

        hit = _SMS[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return hit


_PLANS: dict = {}  # launch plans by (make, shape and flags, TUNING, LARGE, L2_AHEAD_M); see plan


def plan(make, *key):
    """``make(*key)``, kept by ``key``, ``TUNING``, ``LARGE`` and ``L2_AHEAD_M`` as they are
    now: a launch configuration (sizes, grids, the kernel's constexprs) is a few microseconds of
    host time to derive, a share of a B=4 forward call. The cache is bounded (shapes come and
    go, varying L)."""
    full = (make, key, tuple(TUNING.items()), LARGE, L2_AHEAD_M)
    hit = _PLANS.get(full)
    if hit is None:
        if len(_PLANS) >= 256:
            _PLANS.clear()
        hit = _PLANS[full] = make(*key)
    return hit
