"""Package layout only (metadata lives in pyproject.toml).

validation/ is the user-readable truth suite at the top of the repository; it installs as
``kalmanscan.validation`` so that ``kalmanscan validate`` works from any install.
"""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["kalmanscan", "kalmanscan.*"]) + ["kalmanscan.validation"],
    package_dir={"kalmanscan.validation": "validation"},
)
