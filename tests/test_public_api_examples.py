"""The public API as a new user meets it (house style 12: a runnable example on each public
function): every module's docstring examples run; every public name has a docstring with an
example; the reference pages (docs/api.md, docs/api-core.md) give each public name's signature as
the code has it, defaults included; and the runnable blocks of docs/kla.md and docs/dense.md that
no other test runs run as written (api.md and api-core.md run as doctests in
tests/test_timeseries_docs.py and tests/test_core_api.py, getting-started.md in
tests/test_real_data_docs.py, dense.md's "Known directions" block in tests/test_dense_singular.py).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import doctest
import importlib
import inspect
import io
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import kalmanscan

DOCS = Path(__file__).resolve().parents[1] / "docs"
FLAGS = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS


# ------------------------------------------------------------------ 1. every module's examples
def _modules():
    """Every module of the package, found on disk (collecting imports nothing: no triton)."""
    root = Path(kalmanscan.__file__).parent
    names = set()
    for path in root.rglob("*.py"):
        parts = ("kalmanscan",) + path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts[-1] != "__main__":
            names.add(".".join(parts))
    return sorted(names)


# known wrong examples (a defect to fix in the module): each still runs, and its failure is
# reported as an expected one; remove the entry with the fix
KNOWN_WRONG: dict[str, str] = {}


# an example that needs what this machine lacks: an optional extra, or the compiled CPU kernels
# (a checkout run uninstalled, as on the GPU machines); skipped there, run where they are
_MISSING = re.compile(
    r"ModuleNotFoundError: No module named '(filterpy|dask|distributed|netCDF4|h5netcdf|"
    r"polars|cftime|statsmodels|triton|xarray|matplotlib|mpmath|scipy|pandas)'|"
    r"RuntimeError: .*kalmanscan\.core\._native\w* is not built"
)


def _lacks(report: str) -> str | None:
    """What the machine lacks, where a failed example's first error says so."""
    first = report.split("Traceback", 2)
    m = _MISSING.search(first[1] if len(first) > 1 else report)
    return m.group(0) if m else None


def _needs_cuda(test) -> bool:
    return any('device="cuda"' in ex.source or ".cuda()" in ex.source for ex in test.examples)


@pytest.mark.parametrize("name", _modules())
def test_module_examples_run(name):
    with contextlib.suppress(ImportError):  # figures drawn by examples: no window, closed after
        import matplotlib

        matplotlib.use("Agg")
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as err:  # an optional extra (triton, xarray, ...) not installed
        pytest.skip(f"{name}: {err}")
    tests = [t for t in doctest.DocTestFinder().find(module, name) if t.examples]
    failed, known, skipped = [], [], []
    for test in tests:
        if _needs_cuda(test) and not torch.cuda.is_available():
            skipped.append(test.name)
            continue
        out = io.StringIO()
        runner = doctest.DocTestRunner(optionflags=FLAGS)
        runner.run(test, out=out.write)
        if "matplotlib.pyplot" in sys.modules:
            sys.modules["matplotlib.pyplot"].close("all")
        if runner.failures and _lacks(out.getvalue()):
            skipped.append(f"{test.name} ({_lacks(out.getvalue())})")
        elif runner.failures:
            (known if test.name in KNOWN_WRONG else failed).append(f"{test.name}\n{out.getvalue()}")
    assert not failed, "\n".join(failed)
    if known:
        pytest.xfail("; ".join(KNOWN_WRONG[k.split("\n")[0]] for k in known))
    if tests and len(skipped) == len(tests):
        pytest.skip(f"{name}: its examples need CUDA or what this machine lacks: {skipped}")


# ------------------------------------------------------------------ 2. the public names
def _public():
    """``{qualified name: object}``: what the package's ``__all__`` lists, the public plotting,
    xarray and testing helpers, and the methods the reference pages document."""
    pytest.importorskip("xarray")
    pytest.importorskip("matplotlib")
    import kalmanscan.dense
    import kalmanscan.kla
    import kalmanscan.kla.plot
    import kalmanscan.plot
    import kalmanscan.testing
    import kalmanscan.timeseries
    import kalmanscan.xarray

    out = {}
    for mod in (kalmanscan, kalmanscan.timeseries, kalmanscan.dense, kalmanscan.kla,
                kalmanscan.xarray):  # fmt: skip
        for n in mod.__all__:
            out[f"{mod.__name__}.{n}"] = getattr(mod, n)
    for n in ("plot_bands", "plot_series", "plot_precision", "plot_overview"):
        out[f"kalmanscan.plot.{n}"] = getattr(kalmanscan.plot, n)
    for n in ("TOLERANCES", "tolerance", "rel_error", "assert_close"):
        out[f"kalmanscan.testing.{n}"] = getattr(kalmanscan.testing, n)
    accessor = kalmanscan.xarray._KalmanAccessor
    for n in ("filter", "fit_ou", "forecast"):
        out[f"DataArray.kalman.{n}"] = getattr(accessor, n)
    ts = kalmanscan.timeseries
    methods = {
        ts.OUModel: ("filter", "smooth", "loglik", "forecast", "simulate", "to_dataset", "run",
                     "prior", "params", "filter_args"),
        ts.OUFit: ("filter", "smooth", "disturbances", "forecast", "to_dataset", "summary"),
        ts.TimeAxis: ("future", "calendar_step", "position"),
        kalmanscan.kla.KLALayer: ("forward", "init_state", "trace"),
        kalmanscan.kla.KLALanguageModel: ("forward", "init_state", "generate"),
        kalmanscan.kla.KLAConfig: ("from_authors",),
        kalmanscan.kla.ModelConfig: ("hybrid",),
    }  # fmt: skip
    for cls, names in methods.items():
        for n in names:
            out[f"{cls.__module__}.{cls.__name__}.{n}"] = getattr(cls, n)
    return out


# public names whose docstring has no example yet (a gap to fill in the module named; remove the
# entry with the fix)
NO_EXAMPLE_YET: dict[str, str] = {}


def _doc(obj) -> str:
    if isinstance(obj, property):
        obj = obj.fget
    if isinstance(obj, dict):  # a table (TOLERANCES): its module's docstring describes it
        return ""
    doc = obj.__doc__ or ""
    if inspect.isclass(obj) and issubclass(obj, tuple) and doc.startswith(f"{obj.__name__}("):
        return ""  # the docstring namedtuple writes, not the author's
    return doc


def test_every_public_name_has_a_docstring_with_an_example():
    """The public names, and whatever else the reference pages give a signature for."""
    names = _public()
    known = {_key(obj) for obj in names.values()}
    for obj, _ in _documented()[0].values():
        if _key(obj) not in known:
            names[f"{obj.__module__}.{getattr(obj, '__qualname__', obj)}"] = obj
    missing, fixed = [], []
    for qual, obj in names.items():
        if isinstance(obj, dict):
            continue
        examples = doctest.DocTestParser().get_examples(_doc(obj))
        has = any(not ex.options.get(doctest.SKIP) for ex in examples)  # one that runs
        if not has and qual not in NO_EXAMPLE_YET:
            missing.append(qual)
        if has and qual in NO_EXAMPLE_YET:
            fixed.append(qual)
    assert not missing, f"public names without a docstring example: {missing}"
    assert not fixed, f"NO_EXAMPLE_YET entries that now have an example (remove them): {fixed}"


# ------------------------------------------------------------------ 3. the reference pages
REFERENCE = ("api.md", "api-core.md")
# a heading's backticked name is where the signatures under it live; these are not import paths
HEADING_OWNERS = {".kalman": "kalmanscan.xarray._KalmanAccessor"}
# where a heading's name is looked up when the enclosing sections' names do not hold it
HEADING_FALLBACK = ("kalmanscan", "kalmanscan.timeseries", "kalmanscan.dense", "kalmanscan.kla")


def _default_names():
    from kalmanscan.kla import AttentionConfig, KLAConfig

    return {"inf": math.inf, "torch": torch, "np": np, "KLAConfig": KLAConfig,
            "AttentionConfig": AttentionConfig}  # fmt: skip


def _resolve(dotted: str, owners: list):
    parts = dotted.split(".")
    if parts[0] == "kalmanscan":
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ModuleNotFoundError:
                continue
            try:
                for p in parts[i:]:
                    obj = getattr(obj, p)
            except AttributeError:
                return None
            return obj
        return None
    for owner in owners:
        obj = owner
        try:
            for p in parts:
                if inspect.ismodule(obj) and not hasattr(obj, p):  # a submodule not yet imported
                    with contextlib.suppress(ModuleNotFoundError):
                        importlib.import_module(f"{obj.__name__}.{p}")
                obj = getattr(obj, p)
        except AttributeError:
            continue
        return obj
    return None


def _spans(line: str):
    """``(name, args)`` of each backticked ``name(args)`` span, args up to the matching paren."""
    for m in re.finditer(r"`([A-Za-z_][\w.]*)\(", line):
        depth, i = 1, m.end()
        while i < len(line) and depth and line[i] != "`":
            depth += {"(": 1, ")": -1}.get(line[i], 0)
            i += 1
        if depth == 0 and re.match(r"\s*(->[^`]*)?`", line[i:]):
            yield m.group(1), line[m.end() : i - 1]


def _signature_lines(text: str):
    """``(heading stack, line)`` of the lines that give signatures: headings, list items and
    a table's first column; prose mentions calls, it does not define them."""
    stack: list[tuple[int, str]] = []
    fence = False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        if fence:
            continue
        h = re.match(r"(#+) (.*)", line)
        if h:
            level = len(h.group(1))
            stack = [s for s in stack if s[0] < level] + [(level, h.group(2))]
            yield list(stack), line
        elif re.match(r"\s*- `", line):
            yield list(stack), line[: line.index("`", line.index("`") + 1) + 1]
        elif line.startswith("| `"):
            yield list(stack), line.split(" | ")[0]


def _key(obj) -> int:
    return id(getattr(obj, "__func__", obj))  # a classmethod's function, not a new bound method


def _owners(stack) -> list:
    """The objects a section's names are looked up in: its heading's, then its parents', then
    the public packages."""
    owners = []
    for _, heading in stack:
        m = re.search(r"`([\w.]+)`", heading)
        if not m:
            continue
        name = m.group(1)
        if name in HEADING_OWNERS:
            obj = _resolve(HEADING_OWNERS[name], [])
        else:
            fallback = [importlib.import_module(n) for n in HEADING_FALLBACK]
            obj = _resolve(name, owners[::-1] + fallback)
        if obj is not None:
            owners.append(obj)
    return owners[::-1] + [importlib.import_module(n) for n in HEADING_FALLBACK]


def _doc_params(args: str):
    tree = ast.parse(f"def _f({args}): pass").body[0].args
    out = []
    pos = tree.posonlyargs + tree.args
    defaults = [None] * (len(pos) - len(tree.defaults)) + tree.defaults
    for a, d in zip(pos, defaults, strict=True):
        out.append((a.arg, "positional or keyword", d))
    if tree.vararg:
        out.append((tree.vararg.arg, "*args", None))
    for a, d in zip(tree.kwonlyargs, tree.kw_defaults, strict=True):
        out.append((a.arg, "keyword-only", d))
    if tree.kwarg:
        out.append((tree.kwarg.arg, "**kwargs", None))
    return out


_KIND = {
    inspect.Parameter.POSITIONAL_ONLY: "positional or keyword",
    inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional or keyword",
    inspect.Parameter.VAR_POSITIONAL: "*args",
    inspect.Parameter.KEYWORD_ONLY: "keyword-only",
    inspect.Parameter.VAR_KEYWORD: "**kwargs",
}


def _code_params(obj):
    params = list(inspect.signature(obj).parameters.values())
    if params and params[0].name in ("self", "cls"):
        params = params[1:]
    fields = {f.name: f for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else {}
    out = []
    for p in params:
        default = p.default
        if default is dataclasses._HAS_DEFAULT_FACTORY:
            default = fields[p.name].default_factory()
        out.append((p.name, _KIND[p.kind], default))
    return out


def _shape(params):
    # the names of *args and **kwargs are not part of the interface (nobody passes them by name)
    return [(k if k in ("*args", "**kwargs") else n, k) for n, k, _ in params]


def _signature_text(obj) -> str:
    params = list(inspect.signature(obj).parameters.values())
    if params and params[0].name in ("self", "cls"):
        params = params[1:]
    return str(inspect.Signature([p.replace(annotation=inspect.Parameter.empty) for p in params]))


def _mismatch(where: str, obj, args: str) -> list[str]:
    try:
        doc = _doc_params(args)
    except SyntaxError:
        return [f"{where}: not a parameter list"]
    code = _code_params(obj)
    if _shape(doc) != _shape(code):
        return [f"{where}: the code's parameters are {_signature_text(obj)}"]
    bad, names = [], _default_names()
    for (n, _, d), (_, _, c) in zip(doc, code, strict=True):
        given = None if d is None else eval(compile(ast.Expression(d), where, "eval"), names)
        if (d is None) != (c is inspect.Parameter.empty) or (d is not None and given != c):
            bad.append(f"{where}: {n} defaults to {c!r} in the code")
    return bad


def _documented():
    """``{id(object): (object, [where])}`` of the signatures the reference pages give, and the
    mismatches with the code."""
    pytest.importorskip("xarray")
    pytest.importorskip("matplotlib")
    import kalmanscan.kla.plot  # noqa: F401
    import kalmanscan.xarray  # noqa: F401

    seen, bad = {}, []
    for page in REFERENCE:
        text = (DOCS / page).read_text()
        for stack, line in _signature_lines(text):
            owners = _owners(stack)
            for name, args in _spans(line):
                where = f"docs/{page}: `{name}(...)`"
                obj = _resolve(name, owners)
                if obj is None:
                    looked = [getattr(o, "__name__", o) for o in owners]
                    bad.append(f"{where}: no such name in {looked}")
                    continue
                seen.setdefault(_key(obj), (obj, []))[1].append(where)
                if args.strip() != "...":  # "(...)": same arguments as the one above
                    bad += _mismatch(where, obj, args)
    return seen, bad


def test_reference_signatures_are_the_codes():
    seen, bad = _documented()
    assert not bad, "\n".join(bad)
    assert len(seen) > 80, len(seen)


def _named_only(obj) -> bool:
    """Results and errors a user receives and does not construct: named, with their fields (a
    NamedTuple, ``OUFit``) or message described; a signature is checked where one is given."""
    import kalmanscan.timeseries

    if isinstance(obj, dict) or obj is kalmanscan.timeseries.OUFit:
        return True
    return inspect.isclass(obj) and (issubclass(obj, Exception) or hasattr(obj, "_fields"))


def test_every_public_name_is_in_the_reference():
    seen, _ = _documented()
    text = " ".join((DOCS / p).read_text() for p in REFERENCE)
    missing = []
    for qual, obj in _public().items():
        short = qual.rsplit(".", 1)[1]
        if _key(obj) in seen:
            continue
        if not (_named_only(obj) and re.search(rf"`{short}[`(]", text)):
            missing.append(qual)
    assert not missing, f"public names without a signature in {REFERENCE}: {missing}"


# ------------------------------------------------------------------ 4. the pages' code blocks
def _python_blocks(page: str):
    return re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), flags=re.S)


def test_reference_page_blocks_are_doctests():
    """api.md and api-core.md run through ``doctest.testfile``, which runs only ``>>>`` lines:
    a block written as plain code would never run."""
    for page in REFERENCE:
        for block in _python_blocks(page):
            assert block.lstrip().startswith(">>>"), f"docs/{page}: a python block without >>>"


def test_dense_page_blocks_run(tmp_path, monkeypatch):
    """Every python block of docs/dense.md except "Known directions" (its own test prints and
    compares), each in a fresh scope."""
    monkeypatch.chdir(tmp_path)
    blocks = [b for b in _python_blocks("dense.md") if "# -> " not in b]
    assert len(blocks) >= 2
    for block in blocks:
        scope = {}
        exec(compile(block, "docs/dense.md", "exec"), scope)
        assert "res" in scope


def _kla_blocks():
    """docs/kla.md's python blocks; a block that inspects texts of hundreds of tokens with the
    bundled model (a compare) takes about 20 s on a 2-core CPU, 45 s on a loaded one: slow."""
    marks = {True: [pytest.mark.slow], False: []}
    return [
        pytest.param(b, id=f"block{i}", marks=marks["compare(" in b])
        for i, b in enumerate(_python_blocks("kla.md"))
    ]


@pytest.mark.parametrize("block", _kla_blocks())
def test_kla_page_blocks_run(block, tmp_path, monkeypatch):
    """docs/kla.md's python blocks run as written, each in a fresh scope."""
    pytest.importorskip("xarray")
    matplotlib = pytest.importorskip("matplotlib")
    pytest.importorskip("safetensors")
    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(block, "docs/kla.md", "exec"), {})
    import matplotlib.pyplot as plt

    plt.close("all")


def test_kla_page_one_liner_prints_what_the_page_says():
    """The shell block's ``python3 -c`` one-liner prints the figures the page quotes."""
    pytest.importorskip("safetensors")
    text = (DOCS / "kla.md").read_text()
    m = re.search(r'```bash\npython3 -c "\n(.*?)"\n```', text, flags=re.S)
    assert m, "the process-noise one-liner"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(m.group(1), "docs/kla.md", "exec"), {})
    printed = buf.getvalue().strip()
    assert f"(prints `{printed}`)" in " ".join(text.split()), printed
