"""Package layout and the optional native CPU kernel (metadata lives in pyproject.toml).

``kalmanscan/core/_native.c`` is the fused CPU filter kernel (``backend="native"``),
``kalmanscan/core/_native_kla.c`` the KLA op's forward (``backend="native"`` of ``kla_filter``) and
``kalmanscan/dense/_native_dense.c`` the dense models' sequential filter and smoother. All are
optional: without a working C compiler the install still succeeds and the torch backends serve
the CPU.
"""

import sys

from setuptools import Extension, find_packages, setup

if sys.platform == "win32":
    _cflags = ["/O2"]
else:
    _cflags = ["-O3", "-fno-math-errno", "-fno-trapping-math"]

setup(
    packages=find_packages(include=["kalmanscan", "kalmanscan.*"]),
    ext_modules=[
        Extension(
            "kalmanscan.core._native",
            sources=["kalmanscan/core/_native.c"],
            depends=[
                "kalmanscan/core/_native_common.h",
                "kalmanscan/core/_native_instance.h",
                "kalmanscan/core/_native_kernel.h",
                "kalmanscan/core/_native_adjoint.h",
            ],
            extra_compile_args=_cflags,
            optional=True,
        ),
        Extension(
            "kalmanscan.core._native_kla",
            sources=["kalmanscan/core/_native_kla.c"],
            depends=["kalmanscan/core/_native_common.h", "kalmanscan/core/_native_kla_kernel.h"],
            extra_compile_args=_cflags,
            optional=True,
        ),
        Extension(
            "kalmanscan.dense._native_dense",
            sources=["kalmanscan/dense/_native_dense.c"],
            depends=[
                "kalmanscan/core/_native_common.h",
                "kalmanscan/dense/_native_dense_vec.h",
                "kalmanscan/dense/_native_dense_linalg.h",
                "kalmanscan/dense/_native_dense_update.h",
                "kalmanscan/dense/_native_dense_sqrt.h",
                "kalmanscan/dense/_native_dense_series.h",
            ],
            extra_compile_args=_cflags,
            optional=True,
        ),
    ],
)
