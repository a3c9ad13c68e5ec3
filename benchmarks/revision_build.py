"""A kernel's build from its sources at another git revision, for the scripts that time a
kernel against an earlier version of itself in one process (attention_ab.py, matmul_ab.py)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from speclane.kernels import build

ROOT = Path(__file__).resolve().parents[1]
KERNELS = "src/speclane/kernels"


def build_at(revision: str, source: str, isa: str, declare: Callable, where: Path) -> build.Kernel:
    """The ``isa`` build of ``source`` (a file name in kernels/) as it was at git ``revision``,
    with every header of kernels/ at that revision beside it, compiled in ``where``."""
    def show(name: str) -> str:
        return subprocess.run(["git", "show", f"{revision}:{KERNELS}/{name}"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout

    listed = subprocess.run(["git", "ls-tree", "--name-only", f"{revision}:{KERNELS}"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.split()
    for name in [source, *(n for n in listed if n.endswith(".h"))]:
        (where / name).write_text(show(name))
    return build.load_build(where / source, isa, declare)
