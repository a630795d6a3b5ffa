"""The ``kalmanscan`` command: one entry point, one module per sub-command.

Each sub-command lives with the layer it serves and exposes ``main(argv) -> int``:

- ``demo`` / ``filter``: time series (``kalmanscan.timeseries.cli``)
- ``validate``: numerical equivalence with classic filters (``kalmanscan.validate``)
- ``inspect``: belief-state precisions of a KLA language model (``kalmanscan.kla.cli``)
"""

from __future__ import annotations

import importlib
import os
import sys

_COMMANDS = {
    "demo": (
        "kalmanscan.timeseries.cli",
        "demo_main",
        "filter, smooth and forecast the bundled Nile data",
    ),
    "filter": ("kalmanscan.timeseries.cli", "filter_main", "filter a CSV of time series"),
    "validate": ("kalmanscan.validate", "main", "check kalmanscan against classic Kalman filters"),
    "inspect": (
        "kalmanscan.kla.cli",
        "inspect_main",
        "belief-state precisions of a KLA language model",
    ),
}


def _usage() -> str:
    lines = ["usage: kalmanscan <command> [options]  |  kalmanscan --version", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, _, help_) in _COMMANDS.items()]
    lines += ["", "Run 'kalmanscan <command> --help' for the options of one command."]
    return "\n".join(lines)


# The exit status of a command whose reader went away (``... | head -1``): 128 + SIGPIPE, what
# the shell reports for a C tool that SIGPIPE ends (``seq 1 1000000 | head -1``).
EXIT_BROKEN_PIPE = 141


def main(argv: list[str] | None = None) -> int:
    """Run ``kalmanscan <command> ...``; returns the exit status. Output cut short by its reader
    (piped into ``head``) ends quietly with :data:`EXIT_BROKEN_PIPE`, as the Python docs
    recommend (library "signal", note on SIGPIPE): no traceback."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # (a reader gone shows here, not in the flush at exit)
    except BrokenPipeError:
        # the rest of the output, and the interpreter's flush at exit, go nowhere
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (AttributeError, OSError, ValueError):  # (a stdout with no file descriptor)
            pass
        return EXIT_BROKEN_PIPE
    return code


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        from kalmanscan.timeseries.cli import _version

        print(f"kalmanscan {_version()}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in _COMMANDS:
        print(
            f"kalmanscan: unknown command {name!r}; expected one of {sorted(_COMMANDS)}",
            file=sys.stderr,
        )
        print(_usage(), file=sys.stderr)
        return 2
    module, func, _ = _COMMANDS[name]
    return int(getattr(importlib.import_module(module), func)(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
