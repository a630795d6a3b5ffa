"""``kalmanscan filter`` on a large CSV, the whole command as a user runs it: wall time and the
part spent computing, median of repeated runs; and, a secondary row, the time its CSV reader
(``read_csv_series``) takes on the file in a fresh process.

    python benchmarks/cli_large.py --rows 1000000 --repeats 3 --out benchmarks/results/cli-large-cpu.json

The file (seeded): hourly times from 1900 as ``YYYY-MM-DD HH:MM:SS``, a random walk and white
noise, written once to a temporary folder; the command filters and smooths both series with
given parameters (``--sigma2 1 --obs-var 1 --time-unit 1h``) and writes its PNG, netCDF, CSV and
summary. Each run is a fresh process (``python -m kalmanscan.cli``), so imports count too; the
reader's time excludes its imports.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np


def make_csv(path: str, rows: int) -> None:
    import pandas as pd

    rng = np.random.default_rng(20261204)
    times = pd.date_range("1900-01-01", periods=rows, freq="h").strftime("%Y-%m-%d %H:%M:%S")
    frame = pd.DataFrame(
        {"time": times, "a": np.cumsum(rng.normal(size=rows)), "b": rng.normal(size=rows)}
    )
    frame.to_csv(path, index=False)


# the reader alone, in a fresh process: its time without the imports, and the shape it read
READ = """
import sys, time
from kalmanscan.timeseries.csvfile import read_csv_series
import pandas, kalmanscan.timeseries.times
t0 = time.perf_counter()
times, z, names, _ = read_csv_series(sys.argv[1], "time")
print(f"{z.shape[0]}x{z.shape[1]}", time.perf_counter() - t0)
"""


def run(rows: int, repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        csv = os.path.join(tmp, "big.csv")
        make_csv(csv, rows)
        cmd = [sys.executable, "-m", "kalmanscan.cli", "filter", csv, "--time-col", "time",
               "--sigma2", "1", "--obs-var", "1", "--time-unit", "1h", "--out",
               os.path.join(tmp, "out")]  # fmt: skip
        read = [sys.executable, "-c", READ, csv]
        walls, computes, reads = [], [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            walls.append(time.perf_counter() - t0)
            if proc.returncode != 0:
                raise RuntimeError(f"kalmanscan filter failed: {proc.stderr}")
            computes.append(float(re.search(r"computed in ([\d.]+) s", proc.stdout).group(1)))
            proc = subprocess.run(read, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"read_csv_series failed: {proc.stderr}")
            shape, seconds = proc.stdout.split()
            if shape != f"{rows}x2":  # the reader read every row of both series
                raise RuntimeError(f"read_csv_series read {shape}, expected {rows}x2")
            reads.append(float(seconds))
        size = os.path.getsize(os.path.join(tmp, "out", "results.csv"))
    return dict(
        benchmark="cli_large",
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        device=f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)",
        shape=dict(rows=rows, series=2),
        command="kalmanscan filter big.csv " + " ".join(cmd[5:-2]),
        repeats=repeats,
        median_wall_s=statistics.median(walls),
        wall_s=walls,
        median_compute_s=statistics.median(computes),
        median_read_s=statistics.median(reads),
        read_s=reads,
        results_csv_bytes=size,
        correctness="results.csv equal byte for byte to pandas' to_csv text of the same table, "
        "its floats to Python's %.10g, its dates to numpy's, and the ISO times read at once to the "
        "general parse: tests/test_real_data_csv_formats.py::"
        "test_results_csv_text_equals_pandas_writer, tests/test_cli_output_speed.py",
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None, help="write the result as JSON here")
    args = p.parse_args(argv)
    if args.rows < 2 or args.repeats < 1:
        p.error(f"--rows: expected >= 2 and --repeats >= 1, got {args.rows}, {args.repeats}")
    res = run(args.rows, args.repeats)
    print(json.dumps(res, indent=1))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(res, fh, indent=1)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
