"""Ahead-of-time compilation of the package's Triton kernels for an NVIDIA GPU on a machine
without one (``triton.compile`` of an ``ASTSource`` for a ``GPUTarget``).

The interpreter (``TRITON_INTERPRET=1``) runs a kernel's Python with numpy and skips the
compiler's checks: a variable bound to tensors of different shapes in the two branches of a
runtime ``if``, a dtype the lowering rejects, a block shape ptxas refuses. Compiling each
specialization a module launches, down to the cubin, finds these before device time is spent.

A module opts in with ``_aot_cases()``: a list of ``(name, kernel, args, consts, num_warps)``,
``args`` a dict with an example value for every non-constexpr parameter (see
:func:`compile_for`), ``consts`` the constexpr values. ``python -m kalmanscan.cuda._aot MODULE
[MODULE ...] [--stage ttir]`` compiles every case of each module for sm_90 and prints a JSON object
``{case: null | error}``; it exits 1 when a case fails, 2 when compiling is not possible here.
"""

from __future__ import annotations

import json
import sys

from kalmanscan.cuda import interpreting

# torch dtype name -> Triton pointer element type
_PTR = {
    "float32": "fp32",
    "float64": "fp64",
    "bfloat16": "bf16",
    "float16": "fp16",
    "int64": "i64",
    "int32": "i32",
    "int16": "i16",
    "int8": "i8",
    "uint8": "u8",
    "bool": "i1",
}


def unavailable(arch: int = 90) -> str | None:
    """Why kernels cannot be compiled for ``sm_{arch}`` here, or None when they can: Triton
    with the ``ASTSource``/``GPUTarget`` API and its NVIDIA backend, not interpreting, and a
    ptxas that runs (the PTX stage asks it for the CUDA version, the cubin stage runs it)."""
    if interpreting():
        return "TRITON_INTERPRET is set (kernels are not compiled)"
    try:
        import triton
        from triton.backends import backends
        from triton.backends.compiler import GPUTarget  # noqa: F401

        triton.compiler.ASTSource  # noqa: B018
    except (ImportError, AttributeError) as e:
        return f"triton lacks the ahead-of-time compile API ({e})"
    if "nvidia" not in backends:
        return "triton has no NVIDIA backend"
    try:
        from triton.backends.nvidia import compiler as nv

        try:
            nv.get_ptxas_version(arch)
        except TypeError:  # older Triton: no arch argument
            nv.get_ptxas_version()
    except Exception as e:  # a missing or broken ptxas binary, whatever the Triton version
        return f"ptxas does not run ({type(e).__name__}: {e})"
    return None


def _arg_type(name, value):
    """The Triton signature type and the JIT's attributes of one argument's example value."""
    import torch

    if isinstance(value, torch.dtype):
        elt = _PTR.get(str(value).removeprefix("torch."))
        if elt is None:
            raise ValueError(f"args[{name!r}]: expected a supported pointer dtype, got {value}")
        return "*" + elt, [["tt.divisibility", 16]]  # a tensor's data: 16-byte aligned
    if isinstance(value, bool):
        return "i1", []
    if isinstance(value, int):
        if not -(1 << 63) <= value < (1 << 64):
            raise ValueError(f"args[{name!r}]: expected a 64-bit integer, got {value}")
        kind = "i32" if -(1 << 31) <= value < (1 << 31) else "i64" if value < (1 << 63) else "u64"
        return kind, [["tt.divisibility", 16]] if value % 16 == 0 else []
    if isinstance(value, float):
        return "fp32", []
    raise ValueError(
        f"args[{name!r}]: expected a torch.dtype (a pointer), an int, a bool or a float, "
        f"got {type(value).__name__}"
    )


STAGES = ("ttir", "ttgir", "llir", "cubin")


def compile_for(fn, args: dict, consts: dict, num_warps=4, arch: int = 90, stage="cubin"):
    """Compile the ``@triton.jit`` kernel ``fn`` for ``sm_{arch}`` and return Triton's compiled
    kernel (``.asm["ttir" | "ttgir" | "llir" | "ptx" | "cubin"]``). No GPU is needed.
    ``num_warps``: an int, or a dict of compile options (``num_warps``, ``num_stages``...).

    ``stage``: ``"cubin"`` (every stage, through Triton's cache), or stop after ``"ttir"`` (the
    frontend: type and shape checks), ``"ttgir"`` or ``"llir"``; these return the IR text, need
    no ptxas and are a few times faster (they drive Triton's stages directly, an internal API).

    ``args``: every non-constexpr parameter's example value, specialized as a launch does: a
    ``torch.dtype`` is a 16-byte-aligned tensor of that dtype, an int is ``i32`` (``i64`` past
    32 bits) with the divisible-by-16 hint when it is, a float is ``fp32``. ``consts``: the
    constexpr parameters' values (a ``None`` in ``args`` is one, as in a launch). Raises
    ``triton.compiler.errors.CompilationError`` (or the backend's error) where a launch on
    the device would fail to compile."""
    import triton
    from triton.backends.compiler import GPUTarget

    names = list(fn.arg_names)
    params = {p.name: p for p in getattr(fn, "params", [])}
    const_names = {n for n in names if n in params and params[n].is_constexpr}
    missing = [n for n in names if n not in args and n not in consts]
    extra = [n for n in list(args) + list(consts) if n not in names]
    if missing or extra:
        raise ValueError(
            f"{fn.__name__}: expected a value for each parameter {names}, "
            f"missing {missing}, unknown {extra}"
        )
    wrong = [n for n in args if n in const_names and args[n] is not None]
    wrong += [n for n in consts if n not in const_names]
    if params and wrong:
        raise ValueError(
            f"{fn.__name__}: expected constexprs {sorted(const_names)} in consts and the other "
            f"parameters in args, got {wrong} on the wrong side"
        )
    signature, attrs, consts = {}, {}, dict(consts)
    for i, n in enumerate(names):
        if n in args and args[n] is None:  # a None argument: specialized as a constexpr
            consts[n] = None
        if n in consts:
            signature[n] = "constexpr"
            continue
        signature[n], at = _arg_type(n, args[n])
        if at:
            attrs[(i,)] = at
    src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs)
    target = GPUTarget("cuda", arch, 32)
    opts = dict(num_warps) if isinstance(num_warps, dict) else {"num_warps": num_warps}
    from kalmanscan.cuda._common import COMPILE_OPTIONS

    opts = {**COMPILE_OPTIONS, **opts}  # (what every launch passes)
    if stage == "cubin":
        return triton.compile(src, target=target, options=opts)
    if stage not in STAGES:
        raise ValueError(f"stage: expected one of {STAGES}, got {stage!r}")
    from triton._C.libtriton import ir
    from triton.compiler.compiler import make_backend

    backend = make_backend(target)
    options = backend.parse_options(opts)
    stages = {}
    backend.add_stages(stages, options, src.language)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    codegen = backend.get_codegen_implementation(options)
    module = src.make_ir(target, options, codegen, backend.get_module_map(), context)
    metadata = {"target": target, **options.__dict__}
    for ext, run in stages.items():
        module = run(module, metadata)
        if ext == stage:
            return str(module)
    raise ValueError(f"stage {stage!r}: not among this Triton's stages {list(stages)}")


def compile_cases(cases, arch: int = 90, stage="cubin") -> dict:
    """``{name: None | error}`` for each ``(name, kernel, args, consts, num_warps)`` case
    (``num_warps`` an int, or a dict of compile options: ``num_warps``, ``num_stages``); the
    error is the exception's type and message (the compiler's names the kernel's line). Cases
    with one specialization (argument types, divisibility hints, constexprs) compile once."""
    out, seen = {}, {}
    for name, fn, args, consts, warps in cases:
        # cases that differ only in values the launch does not specialize on compile once
        types = tuple((n, v) if v is None else (n, *_arg_type(n, v)[:1], bool(_arg_type(n, v)[1]))
                      for n, v in args.items())  # fmt: skip
        key = (fn, types, tuple(consts.items()), str(warps))
        if key not in seen:
            try:
                compile_for(fn, args, consts, num_warps=warps, arch=arch, stage=stage)
                seen[key] = None
            except Exception as e:  # report every case, then fail
                seen[key] = f"{type(e).__name__}: {e}"
        out[name] = seen[key]
    return out


class record_launches:
    """Within ``with record_launches() as cases:`` every ``kernel[grid](...)`` of a
    ``@triton.jit`` kernel records ``(name, kernel, args, consts, options)`` in ``cases`` (a
    list, the format of ``_aot_cases``) instead of launching: the host code runs on CPU
    tensors at device sizes, outputs left unwritten, and the cases are the specializations
    it would launch. Set ``kalmanscan.cuda._common.FAST_LAUNCH = False`` around it (the fast
    path asks CUDA for the current device)."""

    def __enter__(self):
        import torch
        from triton.runtime.jit import JITFunction

        self.cases, self._cls, self._old = [], JITFunction, JITFunction.__getitem__
        cases = self.cases

        def getitem(fn, grid):
            def record(*a, **kw):
                names = list(fn.arg_names)
                bound = dict(zip(names, a, strict=False))
                bound.update({k: v for k, v in kw.items() if k in names})
                opts = {k: v for k, v in kw.items() if k not in names}
                args, consts = {}, {}
                for p in fn.params:
                    v = bound.get(p.name, p.default)
                    v = v.dtype if isinstance(v, torch.Tensor) else v
                    (consts if p.is_constexpr else args)[p.name] = v
                opts.setdefault("num_warps", 4)
                tag = ",".join(f"{k}={v}" for k, v in sorted({**args, **consts}.items()))
                cases.append((f"{fn.__name__}[{tag}]", fn, args, consts, opts))

            return record

        JITFunction.__getitem__ = getitem
        return cases

    def __exit__(self, *exc):
        self._cls.__getitem__ = self._old
        return False


def main(argv=None) -> int:
    import argparse
    import importlib

    ap = argparse.ArgumentParser(prog="python -m kalmanscan.cuda._aot", description=__doc__)
    ap.add_argument("modules", nargs="+", help="modules with an _aot_cases() function")
    ap.add_argument("--stage", default="cubin", choices=STAGES, help="the last stage to run")
    a = ap.parse_args(argv)
    why = unavailable() if a.stage == "cubin" else None
    if why is None and interpreting():
        why = "TRITON_INTERPRET is set (kernels are not compiled)"
    if why is not None:
        print(json.dumps({"unavailable": why}))
        return 2
    res = {}
    for mod in a.modules:
        cases = importlib.import_module(mod)._aot_cases()
        for name, err in compile_cases(cases, stage=a.stage).items():
            res[f"{mod}:{name}"] = err
    print(json.dumps(res, indent=1))
    return 1 if any(v is not None for v in res.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
