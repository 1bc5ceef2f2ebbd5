"""scripts/gpu/python312.sh, the GPU rehearsal's choice of Python 3.12: a candidate counts when it runs as 3.12, not
when it is on PATH (pyenv's shim is on PATH and exits 127 unless 3.12 is active). Fake interpreters stand in for
the real ones: each is a shell script whose exit status says whether it 'runs as 3.12'."""
import os
import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu" / "python312.sh"
SHIM = '#!/bin/sh\necho "pyenv: python3.12: command not found" >&2\nexit 127\n'  # what pyenv's shim does
GOOD = "#!/bin/sh\nexit 0\n"  # runs, and says (exit 0) it is 3.12
PY311 = "#!/bin/sh\nexit 1\n"  # runs, but sys.version_info[:2] != (3, 12): the script's check exits 1


def fake(path: Path, body: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    path.chmod(0o755)
    return str(path)


def pick(tmp_path, path_dirs, py312=None):
    """Run the script with PATH = path_dirs + a folder holding only the tools it calls (ls, sort), so that no
    interpreter of this machine is a candidate, and pyenv's root in tmp_path."""
    tools = tmp_path / "tools"
    if not tools.exists():
        tools.mkdir()
        for tool in ("ls", "sort"):
            (tools / tool).symlink_to(shutil.which(tool))
    env = {"PATH": ":".join(map(str, [*path_dirs, tools])), "HOME": str(tmp_path),
           "PYENV_ROOT": str(tmp_path / "pyenv")}
    if py312 is not None:
        env["PY312"] = py312
    return subprocess.run(["/bin/bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)


def test_a_shim_that_exits_127_is_skipped_for_one_that_runs(tmp_path):
    fake(tmp_path / "shims" / "python3.12", SHIM)
    good = fake(tmp_path / "real" / "python3.12", GOOD)
    r = pick(tmp_path, [tmp_path / "shims", tmp_path / "real"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == good  # the shim comes first on PATH and is passed over


def test_pyenv_versions_are_tried_after_path_and_a_wrong_version_is_skipped(tmp_path):
    fake(tmp_path / "shims" / "python3.12", SHIM)
    fake(tmp_path / "wrong" / "python3.12", PY311)
    good = fake(tmp_path / "pyenv" / "versions" / "3.12.1" / "bin" / "python3", GOOD)
    r = pick(tmp_path, [tmp_path / "shims", tmp_path / "wrong"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == good


def test_none_runs_is_one_line_and_exit_1(tmp_path):
    shim = fake(tmp_path / "shims" / "python3.12", SHIM)
    r = pick(tmp_path, [tmp_path / "shims"])
    assert r.returncode == 1 and r.stdout == ""
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "no Python 3.12 here runs" in err[0] and shim in err[0] and "set PY312=" in err[0], err


def test_py312_set_is_the_only_candidate_and_is_run(tmp_path):
    good = fake(tmp_path / "real" / "python3.12", GOOD)
    shim = fake(tmp_path / "shims" / "python3.12", SHIM)
    r = pick(tmp_path, [tmp_path / "real"], py312=shim)  # a good one on PATH does not override a bad PY312
    assert r.returncode == 1 and r.stdout == ""
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and f"PY312={shim} does not run as Python 3.12" in err[0], err
    r = pick(tmp_path, [tmp_path / "shims"], py312=good)
    assert r.returncode == 0 and r.stdout.strip() == good, r.stderr


def test_rehearse_uses_the_picker():
    text = (SCRIPT.parent / "rehearse.sh").read_text()
    assert "PY312=$(bash scripts/gpu/python312.sh) || exit 1" in text
    assert "command -v python3.12" not in text
    assert os.access(SCRIPT, os.X_OK)
