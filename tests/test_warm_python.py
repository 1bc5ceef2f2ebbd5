"""tests/warm_python.py against the real thing: a command forked warm behaves as `subprocess` starting it cold."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import warm_python

PROBE = textwrap.dedent("""
    import atexit, json, os, sys
    atexit.register(lambda: print("atexit ran", flush=True))
    print(os.getppid(), file=sys.stderr)
    print(json.dumps({"argv": sys.argv[1:], "argv0": os.path.basename(sys.argv[0]), "path0": sys.path[0],
                      "cwd": os.getcwd(), "env": os.environ.get("PROBE_VALUE"), "main": __name__,
                      "spec": getattr(__spec__, "name", None), "pp": os.environ.get("PYTHONPATH") in sys.path}))
    print("to stderr", file=sys.stderr)
    if sys.argv[1:] == ["raise"]:
        raise ValueError("planted")
    sys.exit(int(sys.argv[1]) if sys.argv[1:] and sys.argv[1].isdigit() else 0)
""")


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """A module to run, and a server of this module's own: the process's server may have been started by another
    test with other interpreter-level variables, and then these commands would run cold."""
    d = tmp_path_factory.mktemp("warm")
    (d / "probe_mod.py").write_text(PROBE)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(warm_python, "_server", None)
        yield d
        if warm_python._server is not None:
            warm_python._server.close()


@pytest.mark.parametrize("args", [["3"], ["a", "b c"], ["raise"]])
@pytest.mark.parametrize("form", ["module", "script"])
def test_a_warm_child_is_what_a_cold_one_is(probe, tmp_path, args, form):
    """Exit code, stdout, stderr (a traceback's last line), argv, sys.path[0], cwd, environment, __main__, atexit:
    equal to `subprocess.run` of the same command."""
    cmd = [sys.executable, *(["-m", "probe_mod"] if form == "module" else [str(probe / "probe_mod.py")]), *args]
    env = {**os.environ, "PROBE_VALUE": "v", "PYTHONPATH": str(probe)}
    cwd = probe if form == "module" else tmp_path
    cold = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    warm = warm_python.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert isinstance(warm, subprocess.CompletedProcess)
    assert (warm.returncode, warm.stdout) == (cold.returncode, cold.stdout)
    assert int(cold.stderr.split()[0]) == os.getpid() != int(warm.stderr.split()[0])  # warm: the server's child
    assert warm.stderr.splitlines()[1] == cold.stderr.splitlines()[1] == "to stderr"
    assert warm.stderr.splitlines()[-1] == cold.stderr.splitlines()[-1]  # ValueError: planted, for "raise"


def test_signals_sessions_and_a_forked_parent(probe, tmp_path):
    """A child in its own session is killed by its process group, and reports -SIGKILL; it was forked by the
    server (its parent is not this process), so it skipped the imports."""
    (tmp_path / "sleeper.py").write_text("import os, sys, time\nprint(os.getppid(), os.getpgrp() == os.getpid(), "
                                         "'torch' in sys.modules, flush=True)\ntime.sleep(60)\n")
    p = warm_python.popen([sys.executable, str(tmp_path / "sleeper.py")], cwd=tmp_path, stdout=subprocess.PIPE,
                          text=True, start_new_session=True)
    parent, leader, torch_loaded = p.stdout.readline().split()
    assert int(parent) != os.getpid() and leader == "True" and torch_loaded == "True"
    assert p.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(timeout=0.2)
    os.killpg(p.pid, signal.SIGKILL)
    assert p.wait(timeout=30) == -signal.SIGKILL
    p.stdout.close()


def test_what_cannot_be_forked_starts_cold(probe, monkeypatch):
    """`-c`, interpreter options, another interpreter-level variable (read at start-up or by the server's imports)
    and ABLATIONS_TEST_COLD get a real subprocess.Popen."""
    warm_python.run([sys.executable, "-m", "json.tool", "--help"], stdout=subprocess.DEVNULL)  # the server is up
    cold = [[sys.executable, "-c", "pass"], [sys.executable, "-X", "importtime", "-c", "pass"]]
    procs = [(warm_python.popen(cmd, stderr=subprocess.DEVNULL), None) for cmd in cold]
    procs.append((warm_python.popen([sys.executable, "-m", "json.tool", "--help"], stdout=subprocess.DEVNULL,
                                    env={**os.environ, "OMP_NUM_THREADS": "7"}), None))
    monkeypatch.setenv("ABLATIONS_TEST_COLD", "1")
    procs.append((warm_python.popen([sys.executable, "-m", "json.tool", "--help"], stdout=subprocess.DEVNULL), None))
    for p, _ in procs:
        assert isinstance(p, subprocess.Popen) and p.wait(timeout=60) == 0
    assert warm_python._program([sys.executable, "-m", "json.tool"]) == ("module", "json.tool")
    assert warm_python._program(["python3", "-m", "json.tool"]) is None  # another interpreter
