"""Fused Triton kernels, registered as backends of the core ops (imported only when used).

- ``kalmanscan.cuda.filter.filter_lanes``: the ``"triton"`` backend of ``kalmanscan.filter``
  (see ``kalmanscan.core.backends``).
- ``kalmanscan.cuda.kla.kla_triton``: the ``"triton"`` backend of
  ``kalmanscan.core.kla_op.kla_filter``.

Design, floors and measurements: docs/performance.md.
"""
