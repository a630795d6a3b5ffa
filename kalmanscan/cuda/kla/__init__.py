"""Fused Triton kernels of the KLA op (SPEC §3): the ``"triton"`` backend of ``kla_filter``.

Shapes (batch B, time L, channels M, slots S; a lane is ``(b, m, s)``): ``v, Lv [B, L, M]``,
``k, q [B, L, S]``, ``decay, process_var [M, S]``, ``lam0, eta0 [B, M, S]``; outputs
``y, yvar [B, L, M]``, the final ``lam, eta [B, M, S]`` and optionally the precisions
``[B, L, M, S]``. Per step ``phi = Lv[m] k[s]^2``, ``r = v[m] Lv[m] k[s]``, ``c = 0``; the
predict step is ``lam_pred = lam / (p lam + d) + e`` (``device._dynamics``).

Layout. A program (one warp, ``NT = 32`` threads) owns ``BM = NT / G`` channels of one batch
row; each thread walks ``SG`` slots of one channel through time (``G = S / SG`` threads per
channel), the state in registers as a ``[SG, NT]`` tile whose first axis lives inside the
thread. So the ``SG`` slots are independent chains a thread interleaves, the sum over slots of
the readout is a register sum plus a ``log2 G``-step shuffle, and the per-channel loads
(``v, Lv``) are one coalesced load per step. No ``[B, L, M, S]`` tensor is written unless the
precisions are asked for.

Modules, by role:

- ``device``: helpers both directions use (the PTX primitives and their interpreter twins,
  lane layout, predict step, tile loads, reduce-scatters);
- ``forward``: the forward kernel (pipelined blocks of 8 or 4 steps) and its launch;
- ``backward``: the backward kernel (exact: recomputation from checkpoints, adjoint walk) and
  its launch;
- ``tuning``: the launch choices by lane count and the cache of launch plans;
- ``autograd``: :func:`kla_triton`, the entry ``kla_filter(backend="triton")`` calls;
- ``glue``: the KLA layer's fused elementwise path around the op (launch blocks, autograd
  Functions), its kernels in ``glue_conv`` (causal conv + SiLU) and ``glue_pointwise``
  (dynamics, sensors, gate and skip).

Measurements: docs/performance.md; the variants tried and deleted: benchmarks/HISTORY.md.
"""

from kalmanscan.cuda.kla.autograd import kla_triton

__all__ = ["kla_triton"]
