"""The tolerance each validation row must meet, read from the project's public table.

``kalmanscan.testing.TOLERANCES`` holds ``("truth", dtype)``: float64 1e-9 (the acceptance bound;
the measured worst case is about 1e-11, so a failure is a bug, not rounding) and float32 2e-3
(kalmanscan in float32, inputs cast by the user included, against the float64 truth; measured
worst case about 2e-4, see docs/validation.md). The Van Loan check compares single closed-form
evaluations, so it asks for a few ulps: ``("discretize", dtype)``, kept in
:data:`LOCAL_TOLERANCES` until the public table carries that entry.
"""

from __future__ import annotations

from kalmanscan.testing import TOLERANCES

# entries the public table does not have yet (same key format)
LOCAL_TOLERANCES: dict[tuple[str, str], float] = {
    ("discretize", "float64"): 1e-13,
    ("discretize", "float32"): 1e-6,
}


def tolerance_kind(truth: str) -> str:
    """The tolerance kind of a truth: ``"discretize"`` for Van Loan, ``"truth"`` otherwise."""
    return "discretize" if truth.startswith("scipy expm") else "truth"


def tolerance(truth: str, quantity: str, dtype: str) -> float:
    """The bound a row (truth, quantity, dtype) must meet.

    >>> tolerance("filterpy", "loglik", "float64")
    1e-09
    >>> tolerance("scipy expm (Van Loan)", "decay", "float64")
    1e-13
    """
    key = (tolerance_kind(truth), dtype)
    if key in TOLERANCES:
        return float(TOLERANCES[key])
    if key in LOCAL_TOLERANCES:
        return LOCAL_TOLERANCES[key]
    raise ValueError(f"dtype: expected 'float32' or 'float64', got {dtype!r}")
