import importlib.util
import os
import sys

import torch

# Without a GPU, Triton kernels run in its CPU interpreter; the switch must be set before triton's
# first import, so it is set here, before any test module loads.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _patch_language_once_a_launch() -> bool:
    """Under Triton's interpreter, patch ``triton.language`` once a kernel launch: the
    interpreter patches the language (every member of ``tl``, ``tl.core``, ``tl.tensor`` and
    ``tl.math``, a few milliseconds) when a launch starts and restores it when the launch ends,
    and again at every call of one of the language's own jitted functions inside the kernel
    (``tl.sum``, ``tl.max``, ``tl.zeros``: 455 patches for 6 launches of the dense kernels),
    though the launch's patch is still in place: about a third of the interpreted tests' time.
    Here the launch patches both ``tl`` and ``tl.core`` (what any function's patch covers), and a
    call inside the launch keeps it. The values are the interpreter's own either way. False
    where the interpreter is off or has no ``_patch_lang``."""
    if os.environ.get("TRITON_INTERPRET") != "1" or importlib.util.find_spec("triton") is None:
        return False
    import types

    import triton.language as tl
    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_lang", None)
    if patch is None or getattr(patch, "once_a_launch", False):
        return patch is not None
    # a function that sees both language modules, as tl.core's own functions do
    both = types.FunctionType((lambda: None).__code__, {"tl": tl, "core": tl.core})
    active = [False]

    class _LaunchScope:
        def __init__(self, scope):
            self.scope = scope

        def restore(self):
            active[0] = False
            self.scope.restore()

    class _Kept:
        def restore(self):
            pass

    def once_a_launch(fn):
        if active[0]:
            return _Kept()
        scope = patch(both)
        active[0] = True
        return _LaunchScope(scope)

    once_a_launch.once_a_launch = True
    once_a_launch.original = patch
    interpreter._patch_lang = once_a_launch
    return True


def pytest_collection_finish(session):
    """The interpreter's patch once a launch (:func:`_patch_language_once_a_launch`), where a
    collected test module imported triton (no triton import for a run without one)."""
    if "triton" in sys.modules:
        _patch_language_once_a_launch()


def _worker_threads() -> int | None:
    """torch's CPU threads for one pytest-xdist worker: the cores shared among the workers (at
    least 1); None outside xdist. Every worker running torch's default (one thread a core) puts
    ``workers x cores`` OpenMP threads on the cores, and there torch's small operations wait on
    each other's spinning threads: on 2 cores, 2 workers ran the KLA layer and inspection tests
    in 86-160 s against 28-31 s at one thread each."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers < 1:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // workers)


if _worker_threads() is not None:
    torch.set_num_threads(_worker_threads())

import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects by marks
def pytest_collection_modifyitems(config, items):
    """Without CUDA, the cases of ``tests/_default_run.py`` are marked slow: the default run
    leaves them to CI's slow step (each repeats a path another case checks in the default run).
    Then ``config.collected_cases``: node id -> marked slow, of every case this process
    collected (before ``-m`` and ``-k`` select), which tests/test_default_run.py reads."""
    if not torch.cuda.is_available():
        from tests._default_run import NODE_IDS

        for item in items:
            if item.nodeid in NODE_IDS:
                item.add_marker(pytest.mark.slow)
    config.collected_cases = {item.nodeid: item.get_closest_marker("slow") is not None
                              for item in items}  # fmt: skip


@pytest.fixture(autouse=True)
def png_not_rasterized(request, monkeypatch):
    """In a test module that sets ``PNG_DRAWN`` (a set of test names), the CLI's figures are
    built (plot_overview, titles, labels, layout) but not rasterized in the other tests: an
    empty file is written where ``savefig`` would write results.png. Rasterizing is most of a
    small file's run (0.3-0.5 s of about 0.9 s); those modules check reading, results.csv and
    the messages, and drawing is tests/test_plot*.py's and, on the CLI's odd time axes,
    tests/test_real_data_times.py's (and each module's PNG_DRAWN cases')."""
    drawn = getattr(request.module, "PNG_DRAWN", None)
    if drawn is None or request.node.originalname in drawn:
        return
    from matplotlib.figure import Figure

    def savefig(self, fname, *args, **kwargs):
        with open(fname, "wb"):
            pass

    monkeypatch.setattr(Figure, "savefig", savefig)


@pytest.fixture
def rng():
    return np.random.default_rng(20261129)


def _nan_empty(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype)


@pytest.fixture(autouse=True)
def poison_outputs(monkeypatch):
    """Every output buffer a compiled backend allocates starts as NaN in every test, so an element
    that a kernel leaves unwritten fails the comparison instead of passing with stale memory
    (house style 11). Hooks: the Triton kernels' ``kalmanscan.cuda._common.empty`` (switched by
    ``POISON``) and the native CPU kernel's ``kalmanscan.core.native._empty``. The torch and
    sequential backends build their outputs from torch operations, which leave nothing
    unwritten. A hook that disappears fails here, rather than leaving the suite unpoisoned."""
    if importlib.util.find_spec("triton") is not None:
        from kalmanscan.cuda import _common

        assert hasattr(_common, "POISON"), "conftest: kalmanscan.cuda._common.POISON is gone"
        monkeypatch.setattr(_common, "POISON", True)
    from kalmanscan.core import native

    assert hasattr(native, "_empty"), "conftest: kalmanscan.core.native._empty is gone"
    monkeypatch.setattr(native, "_empty", _nan_empty)


def _moved(x, device):
    """``x`` with every tensor in it (dicts, tuples, named tuples, lists) moved to ``device``
    (autograd follows the move)."""
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, dict):
        return {k: _moved(v, device) for k, v in x.items()}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(_moved(v, device) for v in x))
    if isinstance(x, (tuple, list)):
        return type(x)(_moved(v, device) for v in x)
    return x


class _TritonOnGpu:
    """The triton filter backend serving CPU tensors on a CUDA machine: its inputs go to the GPU,
    its outputs come back (the kernels compiled for the device, not interpreted)."""

    def __init__(self, mod):
        self._mod = mod

    def __getattr__(self, name):
        return getattr(self._mod, name)

    def filter_lanes(self, *args, **kw):
        return _moved(self._mod.filter_lanes(*_moved(args, "cuda"), **kw), "cpu")

    def smooth_lanes(self, *args, **kw):
        return _moved(self._mod.smooth_lanes(*_moved(args, "cuda"), **kw), "cpu")


@pytest.fixture
def triton_on_cpu(monkeypatch):
    """Let the triton filter backend serve CPU tensors through the public API: without a GPU its
    kernels run in the interpreter; on a CUDA machine (where Triton cannot read CPU memory) the
    backend's inputs are moved to the GPU and its outputs back, so the same test checks the
    compiled kernels."""
    from kalmanscan.core import backends

    real = backends._unavailable
    monkeypatch.setattr(backends, "_unavailable",
                        lambda name, device, op: None if name == "triton"
                        else real(name, device, op))  # fmt: skip
    if torch.cuda.is_available():
        real_get = backends.get

        def get(name, op="filter"):
            impl = real_get(name, op)
            return _TritonOnGpu(impl) if (name, op) == ("triton", "filter") else impl

        monkeypatch.setattr(backends, "get", get)


@pytest.fixture
def fit_devices(monkeypatch):
    """The device of every log-likelihood call a fit makes (``objective._loglik``'s data), so
    a GPU test can assert where its fit ran."""
    from kalmanscan.timeseries import objective

    devices = []
    real = objective._loglik

    def spy(z, *a):
        devices.append(z.device.type)
        return real(z, *a)

    monkeypatch.setattr(objective, "_loglik", spy)
    return devices


@pytest.fixture(scope="session")
def buried_ou():
    """1,000 random OU series in noise, 500 steps (benchmarks/fit_hard.py's): theta 0.01-1,
    sigma2 and obs_var 0.1-10 (log-uniform), mu ~ N(0, 9)."""
    from kalmanscan.timeseries import OUModel

    r = np.random.default_rng(5)
    n = 1000
    th = np.exp(r.uniform(np.log(0.01), np.log(1.0), n))
    s2 = np.exp(r.uniform(np.log(0.1), np.log(10), n))
    ov = np.exp(r.uniform(np.log(0.1), np.log(10), n))
    model = OUModel(theta=th, sigma2=s2, mu=r.normal(size=n) * 3, obs_var=ov)
    return model.simulate(n=500, seed=22)[1]
