"""Two sensors read at irregular times with gaps: OU fits on datetimes, bands in gaps, forecasts.

The data (examples/data/irregular_sensors.csv) have rows between 1 and 480 hours apart, a 20-day
stretch without any reading, and missing values in each column. Rates are per day (``time_unit``).

    python examples/irregular_gaps.py --out irregular-output
"""

import argparse
import os
import pathlib

import numpy as np
import pandas as pd

import kalmanscan as ks

DATA = pathlib.Path(__file__).resolve().parent / "data" / "irregular_sensors.csv"


def main(out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kalmanscan.plot import plot_precision, plot_series

    os.makedirs(out, exist_ok=True)
    df = pd.read_csv(DATA, comment="#", parse_dates=["t"], index_col="t")
    print(
        f"{len(df)} readings from {df.index[0]} to {df.index[-1]}; "
        f"steps between {df.index.to_series().diff().min()} and {df.index.to_series().diff().max()}"
    )

    # 1. One OU model per sensor, fitted on the real timestamps (a DataFrame: index = times).
    fit = ks.fit_ou(df, time_unit="1D")
    print(fit.summary())

    # 2. The smoothed level at any timestamp: add the timestamps you want as missing rows.
    grid = pd.date_range(df.index[0], df.index[-1], freq="6h")
    dense = df.reindex(df.index.union(grid))
    model = fit.model
    ds = model.to_dataset(
        dense,
        coverage=(0.5, 0.9),
        forecast_at=pd.date_range(df.index[-1], periods=13, freq="12h")[1:].values,
    )
    gap = ds.sel(time=slice("2024-03-05", "2024-03-15"))
    width = (gap["smoothed_upper"] - gap["smoothed_lower"]).sel(coverage=0.9).max("time")
    print(
        "widest 90% band inside the 20-day gap: "
        + ", ".join(f"{s}={float(w):.2f}" for s, w in zip(ds["series"].values, width, strict=False))
    )

    # 3. Forecast at an arbitrary future timestamp (the Dataset above holds 12-hourly ones).
    fc = fit.forecast(at=np.datetime64("2024-06-10T09:30"), coverage=0.9)
    print(
        f"forecast for 2024-06-10 09:30: mean {np.round(fc.mean[0], 3)}, 90% interval "
        f"{np.round(fc.lower[0], 3)} .. {np.round(fc.upper[0], 3)}"
    )

    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True, layout="constrained")
    # the 6-hourly grid rows are NaN on purpose: shade only real stretches without data
    plot_series(ds, 0, ax=axes[0], show_missing="gaps")
    plot_series(ds, 1, ax=axes[1], show_missing="gaps")
    plot_precision(ds, ax=axes[2])
    fig.savefig(os.path.join(out, "irregular_gaps.png"), dpi=100)
    print(f"wrote {out}/irregular_gaps.png")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="irregular-output", help="output directory")
    main(parser.parse_args().out)
