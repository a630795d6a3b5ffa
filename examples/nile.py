"""Nile flows 1871-1970: local level model fitted by maximum likelihood, smoothed, forecast.

Reproduces the figures of Durbin & Koopman (2012), ch. 2: variances 15099 (observation) and 1469.1
(level), exact diffuse log-likelihood -632.5456, and the missing-observations variant.

Step 1 fits the model. Steps 2 and 3 then use the published parameters (obs_var 15099,
sigma2 1469.1), not the fitted ones, because the book's forecast and missing-data figures are
computed at those values; the fit agrees with them to about 1e-4. Step 4 uses the fitted ones.

    python examples/nile.py --out nile-output
"""

import argparse
import math
import os

import numpy as np

import kalmanscan as ks
from kalmanscan.timeseries import load_nile


def main(out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from kalmanscan.plot import plot_overview
    from kalmanscan.xarray import save_netcdf

    os.makedirs(out, exist_ok=True)
    years, flow = load_nile()

    # 1. Maximum likelihood; the local level model is the OU model with theta = 0, mu = 0.
    fit = ks.fit_ou(flow, years, fix={"theta": 0.0, "mu": 0.0})
    print(fit.summary())
    for name, published in (("obs_var", 15099.0), ("sigma2", 1469.1)):
        est = fit.params[name]
        print(
            f"{name:8s} {est:10.2f}  published {published:8.1f}  rel. diff "
            f"{est / published - 1:+.2e}"
        )
    print(f"loglik   {fit.loglik:10.4f}  published  -632.5456")

    # 2. At the published parameters (not the fit), to compare with the book's figures: the 1971
    #    forecast (published 798.3703, s.e. 143.5279).
    dk = ks.OUModel(theta=0.0, sigma2=1469.1, obs_var=15099.0)
    print("steps 2 and 3 use the published parameters obs_var 15099, sigma2 1469.1")
    fc = dk.forecast(flow, years, steps=1, coverage=0.9)
    print(
        f"1971 forecast {fc.mean[0]:.4f} (s.e. {math.sqrt(fc.predictive_var[0]):.4f}), "
        f"90% interval [{fc.lower[0]:.2f}, {fc.upper[0]:.2f}]"
    )

    # 3. Missing observations (1891-1910 and 1931-1950 removed), still at the published parameters:
    #    the filter predicts across them.
    gappy = flow.copy()
    gappy[20:40] = np.nan
    gappy[60:80] = np.nan
    sm = dk.smooth(gappy, years)
    print(
        f"with gaps: loglik {float(sm.filtered.loglik):.4f} (published -380.5871), "
        f"filtered variance at 1910 {sm.filtered.var[39]:.2f} (published 33414.20)"
    )

    # 4. At the fitted parameters: dataset + figure: smoothed level, 50/90 % bands, a 10-year
    #    forecast, the precision panel.
    ds = ks.OUModel(**fit.params).to_dataset(
        gappy, years, coverage=(0.5, 0.9), forecast_steps=10, name="Nile"
    )
    save_netcdf(ds, os.path.join(out, "nile_gaps.nc"))
    axes = plot_overview(ds)
    axes[0].set_ylabel("flow (10^8 m^3)")
    axes[0].figure.savefig(os.path.join(out, "nile_gaps.png"), dpi=100)
    print(f"wrote {out}/nile_gaps.png and {out}/nile_gaps.nc")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="nile-output", help="output directory")
    main(parser.parse_args().out)
