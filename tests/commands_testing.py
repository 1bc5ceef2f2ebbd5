"""A command's `main(argv)` run in this process, read like a finished subprocess: for tests that check what a
command prints and returns, where a second interpreter would only import torch, MLflow and matplotlib again. A
test about what only a new process shows (the module entry, byte-identical output across processes, a kill) starts
one itself."""
from __future__ import annotations

import contextlib
import importlib
import io
import subprocess


def run_main(module: str, argv: list[str]) -> subprocess.CompletedProcess:
    """`python -m module argv...` as `module.main(argv)` here -> its exit code, stdout and stderr (SystemExit is an
    exit code like any other)."""
    main = importlib.import_module(module).main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as e:
            code = e.code
    return subprocess.CompletedProcess([module, *argv], code or 0, out.getvalue(), err.getvalue())
