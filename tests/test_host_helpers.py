"""Host-side helpers of the GPU code: benchmarks/gpu.py's variant checker (every variant is
applied, compared with the default's outputs and the tuning restored; an unknown key, misspelt or
retired, is refused rather than timing the default under the variant's name), and the
plain-Python size helpers of kalmanscan/cuda/_common.py against triton's."""

import importlib.util
import os

import pytest
import torch

ROOT = os.path.join(os.path.dirname(__file__), "..")


@pytest.fixture(scope="module")
def gpu():
    spec = importlib.util.spec_from_file_location(
        "bench_gpu", os.path.join(ROOT, "benchmarks", "gpu.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_variants_are_applied_compared_and_restored(gpu):
    tuning = {"scale": 1.0, "slots": 4}

    def outputs():
        return [torch.tensor([1.0, 2.0]) * tuning["scale"]]

    rows = list(gpu.checked_variants(tuning, [{}, {"slots": 2}, {"scale": 2.0}], outputs))
    assert [(k, e) for k, _, e in rows] == [
        ("default", None),
        ("slots=2", None),
        ("scale=2.0", None),
    ]
    assert rows[0][1] == 0.0 and rows[1][1] == 0.0
    assert rows[2][1] == pytest.approx(1.0)  # normwise relative difference of 2x against 1x
    assert tuning == {"scale": 1.0, "slots": 4}


def test_unknown_variant_keys_are_refused(gpu):
    tuning = {"fwd_staging": None, "bwd_slots": None}
    with pytest.raises(ValueError, match=r"variants: expected keys of .* got \['fwd_prefetch'\]"):
        list(gpu.checked_variants(tuning, [{"fwd_prefetch": False}], lambda: [torch.zeros(1)]))
    assert tuning == {"fwd_staging": None, "bwd_slots": None}


def test_host_size_helpers_match_triton():
    # kalmanscan/cuda/_common.py's plain-Python cdiv / next_pow2 replace triton's on the host
    triton = pytest.importorskip("triton")
    from kalmanscan.cuda._common import cdiv, next_pow2

    for a in range(0, 200):
        for b in range(1, 19):
            assert cdiv(a, b) == triton.cdiv(a, b), (a, b)
    for n in range(1, 5000):
        assert next_pow2(n) == triton.next_power_of_2(n), n


class _FakeCompiled:
    """What the JIT returns: a compiled kernel whose ``[grid](*args)`` launches."""

    function = object()

    def __init__(self, log):
        self.log = log

    def run(self, *a):  # (the launcher; present on real compiled kernels)
        raise AssertionError("launch() goes through [grid], not run()")

    def __getitem__(self, grid):
        return lambda *args: self.log.append(("direct", grid, args))


class _FakeJIT:
    """A stand-in for a ``@triton.jit`` function: its parameters, and ``[grid](...)``."""

    def __init__(self, log):
        import types

        def kernel(x_ptr, n, S, BLOCK, FLAG=True):
            pass

        self.fn = kernel
        self.params = [types.SimpleNamespace(is_constexpr=c) for c in (0, 0, 1, 1, 1)]
        self.log = log

    def __getitem__(self, grid):
        def run(*args, **kw):
            self.log.append(("jit", grid, args, kw))
            return _FakeCompiled(self.log)

        return run


def test_launch_reuses_a_compiled_kernel_only_for_the_same_specialization(monkeypatch):
    # the fast path of kalmanscan.cuda._common.launch: the first call of a key goes through
    # the JIT, later calls with that key launch its compiled kernel with every argument in
    # signature order (constexprs and defaults included); anything the JIT specializes on
    # (integer == 1 or divisible by 16, tensor dtype or 16-byte alignment, a constexpr's
    # value, a keyword) is a new key
    from kalmanscan.cuda import _common

    monkeypatch.setattr(_common, "interpreting", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(_common, "_LAUNCH", {})
    log = []
    fn = _FakeJIT(log)
    buf = torch.zeros(64)
    calls = [
        (buf, 40, 16, dict(BLOCK=128, num_warps=4)),  # jit: first of its key
        (buf, 56, 16, dict(BLOCK=128, num_warps=4)),  # direct: 56 like 40 (not 1, not 16k)
        (buf, 1, 16, dict(BLOCK=128, num_warps=4)),  # jit: n == 1
        (buf, 32, 16, dict(BLOCK=128, num_warps=4)),  # jit: n divisible by 16
        (buf, 40, 8, dict(BLOCK=128, num_warps=4)),  # jit: constexpr S
        (buf, 40, 16, dict(BLOCK=64, num_warps=4)),  # jit: constexpr keyword
        (buf, 40, 16, dict(BLOCK=128, num_warps=2)),  # jit: launch option
        (buf[1:], 40, 16, dict(BLOCK=128, num_warps=4)),  # jit: pointer not 16-byte aligned
        (buf.double(), 40, 16, dict(BLOCK=128, num_warps=4)),  # jit: dtype
        (buf[4:], 41, 16, dict(BLOCK=128, num_warps=4)),  # direct: as the first call
        (buf, 1 << 40, 16, dict(BLOCK=128, num_warps=4)),  # jit: 64-bit integer
    ]
    for x, n, S, kw in calls:
        _common.launch(fn, (3,), x, n, S, **kw)
    kinds = [e[0] for e in log]
    assert kinds == ["jit", "direct", "jit", "jit", "jit", "jit", "jit", "jit", "jit",
                     "direct", "jit"]  # fmt: skip
    _, grid, args = log[1]
    assert grid == (3, 1, 1)
    assert args[1:] == (56, 16, 128, True) and args[0] is buf  # BLOCK by keyword, FLAG default
    # (the JIT call also gets the package's compile options, _common.COMPILE_OPTIONS)
    assert log[0][2] == (buf, 40, 16)
    assert log[0][3] == dict(_common.COMPILE_OPTIONS, BLOCK=128, num_warps=4)
    # without the fast path every call is the JIT's
    monkeypatch.setattr(_common, "FAST_LAUNCH", False)
    log.clear()
    _common.launch(fn, (3,), buf, 40, 16, BLOCK=128, num_warps=4)
    assert [e[0] for e in log] == ["jit"]


def test_the_interpreter_takes_a_program_id_as_a_loop_bound():
    """Triton's interpreter before 3.9 under NumPy 2 refused a scalar as a Python index
    (``kalmanscan.cuda._common._interpreter_index_fix``); loops from a program's first step,
    as the KLA glue's, run there."""
    from kalmanscan.cuda import _common

    if not _common.interpreting():
        pytest.skip("the Triton interpreter's behaviour (TRITON_INTERPRET=1)")
    import triton
    import triton.language as tl

    @triton.jit
    def partial_sums(out_ptr, N):
        acc = 0
        for t in range(tl.program_id(0) * 2, N):
            acc += t
        tl.store(out_ptr + tl.program_id(0), acc)

    out = torch.zeros(3, dtype=torch.int32)
    partial_sums[(3,)](out, 6)
    assert out.tolist() == [15, 14, 9]
    patched = _common._interpreter_index_fix()  # once is enough: a second call changes nothing
    assert patched is False
