"""Small Triton helpers shared by the kernels of kalmanscan/cuda/ (per-step formulas, sizes,
output buffers).

Every kernel walks lanes through time with the state in registers (one lane per thread in the
general filter, several in the KLA kernels); the loads of a step do not depend on the state, so
the time loops are software-pipelined (``tl.range(..., num_stages=NS)``) and a step never waits
on its own global load. An earlier
version staged ``[TB, lanes]`` tiles in registers and picked rows with compile-time indices;
that relied on the compiler keeping a tile's time axis inside one thread, which Triton 3.9 did
and Triton 3.6 did not (register spills, cross-warp reductions every step).
"""

from __future__ import annotations

import inspect

import torch
import triton

from kalmanscan.cuda import interpreting  # noqa: F401 - re-exported to the kernels' modules


def _interpreter_index_fix() -> bool:
    """Make the interpreter of Triton before 3.9 take a scalar as a Python index under NumPy 2.

    Its scalars are 1-element arrays, and it made them indices (``range(t0, L)`` over a
    program's first step, ``tl.range`` likewise) by ``int()`` of the array, which NumPy 2
    refuses ("only 0-dimensional arrays can be converted to Python scalars"): every kernel
    looping from a program id failed under ``TRITON_INTERPRET=1`` with, say, torch 2.11's
    Triton 3.6. Triton 3.9 squeezes the array first; this gives the older interpreter the same
    ``__index__``. Returns whether it patched.
    """
    if tuple(int(x) for x in triton.__version__.split(".")[:2] if x.isdigit()) >= (3, 9):
        return False
    try:
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover - an interpreter-less Triton
        return False
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "_squeezed_index", False):
        return False

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patch_lang_tensor._squeezed_index = True
    interpreter._patch_lang_tensor = patch_lang_tensor
    return True


if interpreting():
    _interpreter_index_fix()

# Device helpers are inlined by the compiler; under the interpreter each call of a jitted helper
# re-patches the language module (slow), so there they stay plain functions over patched `tl`.
helper = (lambda fn: fn) if interpreting() else triton.jit


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for host-side sizes. Plain Python: ``triton.cdiv`` and
    ``triton.next_power_of_2`` go through Triton's function wrapper, about 7 us a call here,
    a third of the KLA op's host time a forward call."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of 2 at least ``n`` (1 for ``n <= 1``), for host-side sizes."""
    return 1 << max(int(n) - 1, 0).bit_length()


def lanes_config(N: int):
    """``(BLOCK, num_warps)`` for one lane per thread (narrow blocks when interpreting)."""
    if interpreting():
        return min(32, max(2, next_pow2(N))), 1
    block = min(128, max(32, next_pow2(N)))
    return block, block // 32


# Tests set this to True so that every output buffer starts as NaN and an unwritten element fails.
POISON = False


def empty(shape, like=None, dtype=None, device=None):
    """An output buffer with the dtype and device of ``like`` (or those given): NaN-filled
    when ``POISON`` is set, else uninitialized."""
    if like is not None:
        dtype, device = like.dtype, like.device
    if POISON:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


class _Launch:
    """One kernel's compiled variants by argument specialization (see :func:`launch`)."""

    def __init__(self, fn):
        self.fn = fn
        sig = inspect.signature(fn.fn)
        self.names = list(sig.parameters)
        self.defaults = {n: p.default for n, p in sig.parameters.items()}
        if hasattr(fn, "params"):
            self.constexpr = [p.is_constexpr for p in fn.params]
        else:  # the interpreter's function: from the annotations
            self.constexpr = ["constexpr" in str(p.annotation) for p in sig.parameters.values()]
        self.cache = {}

    def spec(self, args, kw):
        """The key of a call: everything Triton's JIT specializes a compiled kernel on, or
        finer. Tensors: dtype and 16-byte alignment of the data pointer; integers: == 1,
        divisible by 16, and the 32/64-bit range (the value itself for constexpr parameters);
        floats: the type only (never specialized); everything else, and every keyword (the
        constexprs and launch options such as ``num_warps``), by value."""
        key = [torch.cuda.current_device()]
        for a, const in zip(args, self.constexpr, strict=False):
            if isinstance(a, torch.Tensor):
                key.append((a.dtype, a.data_ptr() & 15 == 0))
            elif const or isinstance(a, bool) or not isinstance(a, int | float):
                key.append(("v", a))
            elif isinstance(a, float):
                key.append(float)
            else:
                key.append((a == 1, a & 15 == 0, -(1 << 31) <= a < (1 << 31), a < (1 << 63)))
        key.append(tuple(kw.items()))
        return tuple(key)

    def tail(self, n_args, kw):
        """The arguments after the first ``n_args``, in signature order (keywords, else the
        defaults), as the JIT passes them to the compiled kernel."""
        return tuple(kw[n] if n in kw else self.defaults[n] for n in self.names[n_args:])


_LAUNCH = {}

# False: every launch goes through the JIT's own binding (for comparisons; see launch()).
FAST_LAUNCH = True

# Compile options every launch passes (and the ahead-of-time compiles, _aot.compile_for and
# benchmarks/gpu.py): multiply-adds contracted into FMAs, as the kernels' instruction counts and
# tests assume. It is Triton's default up to 3.9, which warns that 3.10 turns it off unless set.
COMPILE_OPTIONS = {"enable_fp_fusion": True}


def launch(fn, grid, *args, **kw):
    """Launch the ``@triton.jit`` kernel ``fn`` on ``grid`` as ``fn[grid](*args, **kw)`` does,
    without the JIT's per-call argument binding once a call of the same specialization ran.
    Returns the compiled kernel it launched (None when interpreting or with
    ``FAST_LAUNCH = False``).

    The JIT binds every argument, formats its compile options into a string and looks the
    kernel up each call. On the H200 machine's host this path takes about 10 us less a launch
    (``benchmarks/kla_host_time.py --parts``), against a KLA forward of 0.14 ms at B=4 L=2048
    M=960 S=16 whose host time must stay under its kernel's. Here the first
    call of each specialization key (:meth:`_Launch.spec`, at least as fine as the JIT's) goes
    through the JIT, which compiles or loads the kernel, and the compiled kernel it returns is
    kept under that key; later calls with that key launch it directly on the current stream,
    with the JIT's arguments in signature order (constexprs and defaults included, as the JIT
    passes them). Under ``TRITON_INTERPRET=1``, or with ``FAST_LAUNCH = False``, every call
    is ``fn[grid](*args, **kw)``. The kernels' global constants are assumed fixed (the JIT's
    check that they did not change runs on the first call of a key only)."""
    if interpreting() or not FAST_LAUNCH:
        fn[grid](*args, **{**COMPILE_OPTIONS, **kw})
        return None
    entry = _LAUNCH.get(fn)
    if entry is None:
        entry = _LAUNCH[fn] = _Launch(fn)
    key = entry.spec(args, kw)
    kernel = entry.cache.get(key)
    if kernel is None:  # (the package's compile options on the JIT's calls only: constant)
        kernel = fn[grid](*args, **{**COMPILE_OPTIONS, **kw})
        if hasattr(kernel, "run") and hasattr(kernel, "function"):
            entry.cache[key] = kernel
            return kernel
        return None
    kernel[tuple(grid) + (1,) * (3 - len(grid))](*args, *entry.tail(len(args), kw))
    return kernel


def launch_site(site: dict, slot, fn, grid, args, kw):
    """:func:`launch` for a caller that keys ``site`` (a dict it keeps) so finely that every
    call with the same ``site`` and ``slot`` has the same specialization (tensor dtypes and
    16-byte alignments, integer classes, constexprs, options: ``kw`` is fixed for the slot)
    and the same ``grid``: from the second call on, the kept compiled kernel is launched with
    ``args`` and the slot's fixed tail, with no key computed. ``args`` is a tuple or list;
    ``kw`` a dict or a function returning it (called only when the slot has no kernel yet)."""
    hit = site.get(slot)
    if hit is not None:
        kernel, grid3, tail = hit
        kernel[grid3](*args, *tail)
        return
    if callable(kw):
        kw = kw()
    kernel = launch(fn, grid, *args, **kw)
    if kernel is not None:
        grid3 = tuple(grid) + (1,) * (3 - len(grid))
        site[slot] = (kernel, grid3, _LAUNCH[fn].tail(len(args), kw))
