"""Instructions of the KLA kernels' time loops in sm_90 SASS, compiled on this machine (no GPU
needed): the counts that benchmarks/HISTORY.md and docs/performance.md give.

For each kernel at the KLA LM's configuration (d_model 512: M = 1024 channels, S = 16 slots;
the backward at 2^17 lanes, as the LM step at 8 x 2,048 runs it, without the output variance's
gradient), the loops of its SASS of at least 50 instructions (the instructions between a
backward branch and its target), largest first, with their instructions by opcode:

- ``backward``: one 8-step checkpoint interval at 4 slots a thread;
- ``forward``: one 4-step block at 4 slots a thread, saving checkpoints, no variance;
- ``chunk_maps``: one 8-step block of the chunk maps at 2 slots a thread (two loops: the
  general step, then the lean one, which a program takes where no lane forgets);
- ``tangent_maps``: two 8-step blocks of the tangent maps at 2 slots a thread (a pair of
  double-buffered blocks, ``chunked.TANGENT_LAUNCH``).

The counts depend on the Triton version (the H200 image's Triton 3.6 and Triton 3.9 compile the
same source differently); the JSON records it.

    python3 benchmarks/kla_sass.py [--out FILE.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

ADDR = re.compile(r"\s+/\*([0-9a-f]{4,6})\*/\s+(.*?);")
BRANCH = re.compile(r"BRA[^;]*?0x([0-9a-f]+)")
OPCODE = re.compile(r"(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def loops(sass: str):
    """The backward-branching loops of ``sass``, largest first: ``[(instructions, opcode
    counts)]``."""
    lines = [(int(m.group(1), 16), m.group(2)) for m in map(ADDR.match, sass.splitlines()) if m]
    out = []
    for addr, text in lines:
        b = BRANCH.search(text)
        if b and int(b.group(1), 16) < addr:
            body = [t for a, t in lines if int(b.group(1), 16) <= a <= addr]
            ops = collections.Counter(OPCODE.match(t).group(1) for t in body if OPCODE.match(t))
            out.append((len(body), dict(ops.most_common())))
    return sorted(out, key=lambda x: -x[0])


def sass_of(kernel) -> str:
    from benchmarks.gpu import cuobjdump_path

    with tempfile.TemporaryDirectory(prefix="kalmanscan-sass-") as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        return subprocess.run([cuobjdump_path(), "-sass", path], capture_output=True,
                              text=True, check=True).stdout  # fmt: skip


# the resource check's cases (benchmarks.gpu.kernel_cases) that the LM step runs, by the name
# printed here
CASES = {
    "backward": "kla_bwd_ck8_rerun_nogyv_atomic",
    "forward": "kla_fwd_novar",
    "chunk_maps": "kla_chunk_maps",
    "tangent_maps": "kla_adjoint_maps_nogyv",
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="JSON path (default: print only)")
    ap.add_argument("--only", default=None, help="comma-separated kernel names")
    args = ap.parse_args()
    import triton

    from benchmarks.gpu import compile_sm90, kernel_cases
    from kalmanscan.validation.run_meta import run_meta

    res = dict(benchmark="kla_sass", **run_meta(False), triton=triton.__version__, kernels={})
    all_cases = kernel_cases()
    for name, case in CASES.items():
        if args.only and name not in args.only.split(","):
            continue
        fn, sg, consts, warps, *maxnreg = all_cases[case]
        kernel = compile_sm90(fn, sg, consts, warps, *maxnreg)
        found = [x for x in loops(sass_of(kernel)) if x[0] >= 50]
        res["kernels"][name] = [{"loop_instructions": n, "by_opcode": ops} for n, ops in found]
        for n, ops in found:
            print(f"{name}: {n} instructions a loop iteration; " +
                  ", ".join(f"{k} {v}" for k, v in list(ops.items())[:8]), flush=True)  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
