from kalmanscan.cuda.kla import chunked as KC
from benchmarks.gpu import compile_sm90
from benchmarks.kla_sass import loops, sass_of
sig = {"maps_ptr": "*fp32", "lam0_ptr": "*fp32", "eta0_ptr": "*fp32", "start_ptr": "*fp32", "C": "i32", "MS": "i32", "NR": "i32"}
k = compile_sm90(KC._carry_kernel, sig, dict(BLOCK=128, NS=4), 4)
ptx = k.asm["ptx"]
print("carry cp.async", ptx.count("cp.async"), "loops", [x[0] for x in loops(sass_of(k))])
sig2 = {"amap_ptr": "*fp32", "gend_ptr": "*fp32", "C": "i32", "MS": "i32", "NR": "i32"}
k = compile_sm90(KC._adjoint_carry_kernel, sig2, dict(BLOCK=128, NS=4), 4)
print("adj carry cp.async", k.asm["ptx"].count("cp.async"), "loops", [x[0] for x in loops(sass_of(k))])
