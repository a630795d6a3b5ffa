"""Fused Triton kernels, registered as backends of the core ops (imported only when used).

- ``kalmanscan.cuda.filter.filter_lanes``: the ``"triton"`` backend of ``kalmanscan.filter``
  (see ``kalmanscan.core.backends``).
- ``kalmanscan.cuda.kla.kla_triton``: the ``"triton"`` backend of
  ``kalmanscan.core.kla_op.kla_filter``.

Design, floors and measurements: docs/performance.md.
"""

import os


def interpreting() -> bool:
    """True under ``TRITON_INTERPRET=1`` (kernels run on the CPU through numpy). Here, outside
    the modules that import triton, so that callers can ask without importing it."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
