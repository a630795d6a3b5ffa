"""Focused numerical studies behind claims in docs/validation.md.

Run them with ``python -m kalmanscan.validation.studies``.
"""

from __future__ import annotations

import numpy as np

from .battery import Runner, run_kalmanscan
from .metrics import elementwise
from .models import LaneBatch, _lane
from .truths import filterpy_truth

__all__ = ["mobius_float32_bias", "main"]

P_PHIS = (1e-5, 1e-6, 1e-7, 6e-8, 3e-8, 1e-8, 1e-9)


def mobius_float32_bias(
    p_phis=P_PHIS, T: int = 50_000, runner: Runner | None = None, seed: int = 1
) -> list[dict]:
    """Float32 steady-state variance bias of the parallel filter on random walks with ``p*phi``.

    Each lane: ``decay = 1``, ``process_var = p_phi``, ``obs_var = 1``, proper prior. Returns per
    lane the predicted bias ``delta / (2 sqrt(p phi))`` (``delta`` the float32 rounding error of
    ``1 + p phi``), the measured mean relative bias of the filtered variance over the last 1000
    steps, and the worst smoothed-variance error, all against filterpy in float64.

    >>> rows = mobius_float32_bias(p_phis=(1e-6,), T=3000)  # doctest: +SKIP
    >>> rows[0]["measured_bias"] < 1e-4  # doctest: +SKIP
    True
    """
    runner = runner or Runner("torch", "torch", "cpu")
    rng = np.random.default_rng(seed)
    lanes = [
        _lane(f"p*phi={x:g}", T, decay=1.0, process_var=x, obs_var=1.0, prior_var=1.0, rng=rng)
        for x in p_phis
    ]
    batch = LaneBatch.stack("mobius float32", lanes)
    out = run_kalmanscan(batch, runner, "float32")
    rows = []
    for n, x in enumerate(p_phis):
        truth = filterpy_truth(batch.lane(n))
        delta = abs(float(np.float32(1.0 + x)) - (1.0 + x))
        tail = slice(max(T - 1000, 0), T)
        rows.append(
            dict(
                p_phi=x,
                predicted_bias=delta / (2 * np.sqrt(x)),
                measured_bias=float(np.mean(np.abs(out["var"][tail, n] / truth.var[tail] - 1))),
                smoothed_var_err=elementwise(out["smooth_var"][:, n], truth.smooth_var),
                backend=runner.label,
            )
        )
    return rows


def main() -> None:
    print("p*phi     predicted  measured  smoothed-var err  (float32 vs filterpy float64)")
    for r in mobius_float32_bias():
        print(
            f"{r['p_phi']:<9.0e} {r['predicted_bias']:9.1e} {r['measured_bias']:9.1e} "
            f"{r['smoothed_var_err']:9.1e}   {r['backend']}"
        )


if __name__ == "__main__":
    main()
