import re, subprocess, tempfile
from kalmanscan.cuda.kla import chunked
from benchmarks.gpu import compile_sm90, kernel_cases, cuobjdump_path
from benchmarks.kla_sass import loops, sass_of
for which, key, slots in (("tangent", "kla_adjoint_maps_nogyv", (1, 2)), ("maps", "kla_chunk_maps", (1, 2, 4))):
    for sl in slots:
        d = chunked.TANGENT_LAUNCH if which == "tangent" else chunked.MAPS_LAUNCH
        old = dict(d); d["slots"] = sl
        fn, sg, consts, warps, *mx = kernel_cases()[key]
        k = compile_sm90(fn, sg, consts, warps, *mx)
        p = tempfile.mktemp(suffix=".cubin"); open(p, "wb").write(k.asm["cubin"])
        res = subprocess.run([cuobjdump_path(), "-res-usage", p], capture_output=True, text=True).stdout
        ls = [x[0] for x in loops(sass_of(k)) if x[0] >= 50]
        print(which, "slots", sl, re.findall(r"REG:(\d+)", res), re.findall(r"STACK:(\d+)", res), "loops", ls, flush=True)
        d.clear(); d.update(old)
