"""Many series fitted at once: separate OU fits for each series, in memory and on a dask cluster.

Simulates ``--series`` independent OU series (each with its own rate) on shared irregular
timestamps, fits every series by maximum likelihood in one batched call, checks how often the
true parameter lies within the 90 % interval from the Hessian standard errors, and repeats the fit
chunk-wise over the series with xarray + dask on a local cluster.

    python examples/many_series.py --series 64 --out many-output
"""

import argparse
import os
import time

import numpy as np

import kalmanscan as ks


def main(n_series: int, n_steps: int, out: str) -> None:
    try:
        import xarray as xr
        from dask.distributed import Client, LocalCluster
    except ImportError as exc:
        raise SystemExit(
            f"examples/many_series.py needs xarray, dask and distributed ({exc.name} is not "
            "installed): pip install 'kalmanscan[xarray]'"
        ) from None

    import kalmanscan.xarray  # noqa: F401  (registers the .kalman accessor)

    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    t = np.cumsum(rng.exponential(1.0, n_steps))
    true = dict(
        theta=rng.uniform(0.05, 0.5, n_series),
        sigma2=np.full(n_series, 0.5),
        mu=rng.normal(0, 2, n_series),
        obs_var=np.full(n_series, 0.3),
    )
    _, z = ks.OUModel(**true).simulate(t, seed=1)
    z[rng.random(z.shape) < 0.1] = np.nan

    t0 = time.perf_counter()
    fit = ks.fit_ou(z, t)
    elapsed = time.perf_counter() - t0
    print(
        f"{n_series} series x {n_steps} steps fitted in {elapsed:.2f} s "
        f"({int(np.sum(fit.converged))} converged, {fit.n_iter} Newton iterations)"
    )
    for k in ("theta", "mu"):
        est, se = fit.params[k], fit.stderr[k]
        inside = np.abs(est - true[k]) <= 1.6449 * se
        print(
            f"{k:6s}: median |rel. error| {np.median(np.abs(est / true[k] - 1)):.3f}; "
            f"true value inside the 90% interval for {inside.mean():.0%} of series"
        )

    da = xr.DataArray(z, dims=("time", "series"), coords={"time": t})
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster),
    ):
        t0 = time.perf_counter()
        params = da.chunk({"series": max(1, n_series // 4)}).kalman.fit_ou().compute()
        elapsed = time.perf_counter() - t0
    diff = float(np.max(np.abs(params["theta"].values / fit.params["theta"] - 1)))
    print(
        f"dask (4 chunks, 2 workers): {elapsed:.2f} s; largest relative difference in theta vs "
        f"in-memory {diff:.1e}"
    )
    ds = da.kalman.filter(params, coverage=0.9)
    kalmanscan.xarray.save_netcdf(params, os.path.join(out, "params.nc"))
    kalmanscan.xarray.save_netcdf(ds, os.path.join(out, "filtered.nc"))
    print(f"wrote {out}/params.nc and {out}/filtered.nc")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=64)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--out", default="many-output", help="output directory")
    a = parser.parse_args()
    main(a.series, a.steps, a.out)
