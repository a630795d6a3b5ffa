"""A pytest plugin that writes each test's outcome and time as it finishes, for runs that a job
limit may cut (the whole suite on a GPU machine: its summary of failures comes only at the end,
and a cut ``-v`` log of pytest-xdist workers is easy to misread).

    KALMANSCAN_TEST_LOG=run.txt python -m pytest -p benchmarks.pytest_progress -n 15 tests/...
    python benchmarks/pytest_progress.py run.txt      # outcomes, failures, unfinished, slowest

The run's main process (under pytest-xdist the controller, which every worker reports to)
appends a line to the file, its fields separated by tabs: ``start, <unix time>, <node id>`` when
a test starts; ``<outcome>, <unix time>, <node id>, <seconds>`` once it is done (``passed``,
``failed``, ``skipped``; a failing setup or teardown is written as ``failed`` too, expected
failures as ``xfailed`` or ``xpassed``; seconds are setup + call + teardown); and for a failure
``why, <unix time>, <node id>, <its error lines>``. A test started but never done was running
when the run was cut; the summary says how long it had run by the file's last line.
"""

from __future__ import annotations

import collections
import os
import sys
import time

_ENV = "KALMANSCAN_TEST_LOG"
_started: dict[str, float] = {}
_worst: dict[str, str] = {}
_RANK = {"passed": 0, "skipped": 1, "xfailed": 1, "xpassed": 1, "failed": 2}


def _write(kind: str, nodeid: str, *more: str) -> None:
    path = os.environ.get(_ENV)
    # xdist relays each worker's reports to the controller: it alone writes, once a test
    if path and not os.environ.get("PYTEST_XDIST_WORKER"):
        line = "\t".join((kind, f"{time.time():.1f}", nodeid, *more))
        with open(path, "a") as f:
            f.write(line.replace("\n", " ") + "\n")


def pytest_runtest_logstart(nodeid, location):
    _started[nodeid] = time.perf_counter()
    _write("start", nodeid)


def _why(report) -> str:
    """A failure's error lines (pytest's ``E`` lines, else its last line), on one line."""
    text = getattr(report, "longreprtext", "") or ""
    lines = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("E ")]
    lines = lines or [ln.strip() for ln in text.splitlines() if ln.strip()][-1:]
    return " | ".join(lines[:4]).replace("\t", " ")[:600]


def pytest_runtest_logreport(report):
    # a test's outcome: the worst of its setup, call and teardown
    outcome = "failed" if report.failed else report.outcome
    if hasattr(report, "wasxfail"):  # an expected failure (strict xpasses fail)
        outcome = "xfailed" if report.skipped else "xpassed"
    if _RANK[outcome] > _RANK[_worst.get(report.nodeid, "passed")]:
        _worst[report.nodeid] = outcome
    if report.failed:
        _write("why", report.nodeid, _why(report))


def pytest_runtest_logfinish(nodeid, location):
    took = time.perf_counter() - _started.pop(nodeid, time.perf_counter())
    _write(_worst.pop(nodeid, "passed"), nodeid, f"{took:.2f}")


def summarize(path: str, slowest: int = 20) -> dict:
    """The file's outcomes: counts, failed tests with their error lines, tests started and never
    done with the seconds they had run by the file's last line, the slowest."""
    started, done, why, last = {}, {}, {}, 0.0
    with open(path) as f:
        for line in f:
            kind, at, nodeid, *more = line.rstrip("\n").split("\t")
            last = max(last, float(at))
            if kind == "start":
                started[nodeid] = float(at)
            elif kind == "why":
                why.setdefault(nodeid, more[0] if more else "")
            elif kind in _RANK:
                done[nodeid] = (kind, float(more[0]))
    counts = collections.Counter(kind for kind, _ in done.values())
    return dict(
        counts=dict(counts),
        failed=sorted(n for n, (kind, _) in done.items() if kind == "failed"),
        why={n: why.get(n, "") for n, (kind, _) in done.items() if kind == "failed"},
        unfinished=sorted(set(started) - set(done)),
        running_s={n: last - at for n, at in started.items() if n not in done},
        slowest=sorted(((s, n) for n, (_, s) in done.items()), reverse=True)[:slowest],
    )


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python benchmarks/pytest_progress.py LOG", file=sys.stderr)
        return 2
    s = summarize(argv[0])
    print("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(s["counts"].items())))
    for n in s["failed"]:
        print(f"FAILED {n}" + (f"\n    {s['why'][n]}" if s["why"][n] else ""))
    for n in s["unfinished"]:
        print(f"UNFINISHED {n}  (running for {s['running_s'][n]:.0f} s at the file's last line)")
    for secs, n in s["slowest"]:
        print(f"{secs:8.1f} s  {n}")
    return 1 if s["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
