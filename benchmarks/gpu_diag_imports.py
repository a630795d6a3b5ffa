"""Which import pulls a module into a fresh interpreter during a call (a GPU machine's
``tests/test_fit_forecast_state.py::test_first_forecast_imports_no_sympy``): the stack of the
first import of ``--module`` while fitting and forecasting a short series.

    python benchmarks/gpu_diag_imports.py --module sympy
"""

from __future__ import annotations

import argparse
import sys
import traceback


class _Tracer:
    def __init__(self, name):
        self.name = name

    def find_spec(self, fullname, path, target=None):
        if fullname == self.name:
            print(f"first import of {self.name}:", flush=True)
            traceback.print_stack(limit=60, file=sys.stdout)
            sys.meta_path.remove(self)
        return None


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--module", default="sympy")
    args = ap.parse_args(argv)
    sys.meta_path.insert(0, _Tracer(args.module))
    import pathlib

    import numpy as np

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # (not installed)
    import kalmanscan as ks

    fit = ks.fit_ou(np.random.default_rng(0).normal(size=50).cumsum())
    fit.forecast(2)
    ks.discretize_ou(0.5, 1.0, np.ones(3))
    print(f"{args.module} imported: {args.module in sys.modules}")


if __name__ == "__main__":
    main()
