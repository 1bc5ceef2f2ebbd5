"""`python -m MODULE ARGS` for the tests, forked from a warm interpreter instead of started cold.

A cold interpreter pays ~5 s of CPU importing torch, Lightning (torchmetrics, scipy.signal, torch._dynamo) and
MLflow before the command's first line runs; the suite starts dozens of them (sweep and verdict workers, kill and
resume runs, reports). `run` and `popen` take the arguments of `subprocess.run` / `subprocess.Popen` and, for a
command of the form `[sys.executable, "-m", module, ...]` or `[sys.executable, "script.py", ...]`, ask a server
(one per test process, started on first use) that has imported those libraries once to fork a child; the child
takes the caller's working directory, environment, standard streams and session, then runs the module as `-m`
would (`runpy`, `__main__`, `sys.argv`, `sys.path[0]`) and exits through the normal interpreter shutdown (atexit
handlers run: MLflow ends its runs). The caller gets a Popen-like handle: pid (signals and process groups work as
for any child), poll/wait/communicate, the exit code (-N for signal N).

What a forked child cannot reproduce, and so is started cold: interpreter options, and an environment whose
interpreter-level variables (PYTHON*, OMP_*, MKL_*, TORCH*, MALLOC_*, HF_*, ...) differ from the server's, since those
are read once at start-up or import. None of this project's modules are imported by the server: a command still
imports the code under test itself, and a test that checks what a command imports (or how fast it starts) calls
`subprocess` directly. `ABLATIONS_TEST_COLD=1` starts every command cold.
"""
from __future__ import annotations

import atexit
import io
import json
import locale
import os
import select
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

PRELOAD = ("torch", "lightning.pytorch", "mlflow", "mlflow.tracking", "sqlalchemy", "optuna", "hydra", "omegaconf",
           "pandas", "matplotlib")
# read once per interpreter (at start-up or by an import the server made): a request must match the server on these
# (not KMP_*: a library sets KMP_DUPLICATE_LIB_OK in the test process; it matters only to Intel's OpenMP runtime)
_INTERPRETER_ENV = ("PYTHON", "OMP_", "MKL_", "OPENBLAS_", "TORCH", "PYTORCH", "MALLOC_", "LD_", "MPL",
                    "CUDA", "TRITON", "HF_", "TRANSFORMERS", "TOKENIZERS")
_CHILD_ENV = ("PYTHONPATH", "PYTHONUNBUFFERED")  # applied by the child itself
# set by torch itself in the test process (inductor's cache default, the CUDA check) and read when used, not at import
_SET_BY_TORCH = ("TORCHINDUCTOR_CACHE_DIR", "PYTORCH_NVML_BASED_CUDA_CHECK")
_server: "_Server | None" = None  # this process's, started by its first warm command


def _interpreter_env(env: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(_INTERPRETER_ENV)
                        and k not in _CHILD_ENV + _SET_BY_TORCH))


# ------------------------------------------------------------------------------------------------------ client
class _Server:
    def __init__(self, env: dict):
        self.key = _interpreter_env(env)
        self.dir = tempfile.mkdtemp(prefix="warm-python-")
        self.path = os.path.join(self.dir, "sock")
        env = {k: v for k, v in env.items() if k not in _CHILD_ENV}
        self.proc = subprocess.Popen([sys.executable, __file__, self.path, str(os.getpid())], env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=open(os.path.join(self.dir, "server.log"), "wb"),
                                     start_new_session=True)
        atexit.register(self.close)

    def connect(self) -> socket.socket:
        deadline = time.monotonic() + 300  # the preload takes seconds, minutes on a loaded machine
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(self.path)
                return s
            except (FileNotFoundError, ConnectionRefusedError):
                s.close()
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    with open(os.path.join(self.dir, "server.log")) as f:
                        raise RuntimeError(f"warm_python server did not start:\n{f.read()[-3000:]}") from None
                time.sleep(0.05)

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait()


def _server_for(env: dict) -> _Server | None:
    """This process's server, started on first use with `env`'s interpreter-level variables; None when `env`'s
    differ from those (the command starts cold; with $ABLATIONS_TEST_WARM_LOG set, the variables that differ are
    appended to that file)."""
    global _server
    if _server is None:
        _server = _Server(env)
    key = _interpreter_env(env)
    if key == _server.key:
        return _server
    if os.environ.get("ABLATIONS_TEST_WARM_LOG"):
        with open(os.environ["ABLATIONS_TEST_WARM_LOG"], "a") as f:
            print(os.environ.get("PYTEST_CURRENT_TEST"), sorted(set(key) ^ set(_server.key)), file=f)
    return None


def _program(args) -> tuple[str, str] | None:
    """("module", name) or ("path", script) for a command a forked child can run, else None."""
    args = [os.fspath(a) for a in args] if not isinstance(args, (str, bytes)) else None
    if not args or len(args) < 2 or args[0] != sys.executable:
        return None
    if args[1] == "-m" and len(args) >= 3:
        return "module", args[2]
    if args[1].endswith(".py") and not args[1].startswith("-"):
        return "path", args[1]
    return None


def _fd(stream, default: int, opened: list) -> int:
    if stream is None:
        return default
    if stream == subprocess.DEVNULL:
        fd = os.open(os.devnull, os.O_RDWR)
        opened.append(fd)
        return fd
    return stream if isinstance(stream, int) else stream.fileno()


class WarmProcess:
    """The subprocess.Popen subset the tests use, for a child forked by the server."""

    def __init__(self, server, args, program, cwd, env, stdin, stdout, stderr, start_new_session, text):
        self.args, self.returncode, self.stdout, self.stderr, self.stdin = list(args), None, None, None, None
        self._text = text
        opened, mine = [], {}
        try:
            fds = [_fd(stdin, 0, opened)]
            for name, stream, default in (("stdout", stdout, 1), ("stderr", stderr, 2)):
                if stream == subprocess.PIPE:
                    r, w = os.pipe()
                    opened.append(w)
                    mine[name] = r
                    fds.append(w)
                elif stream == subprocess.STDOUT:
                    fds.append(fds[1])
                else:
                    fds.append(_fd(stream, default, opened))
            job = {"program": program, "argv": [os.fspath(a) for a in args[(3 if program[0] == "module" else 2):]],
                   "cwd": os.fspath(cwd) if cwd is not None else os.getcwd(), "env": dict(env),
                   "session": bool(start_new_session)}
            self._conn = server.connect()
            body = json.dumps(job).encode()
            socket.send_fds(self._conn, [struct.pack("!I", len(body)) + body], fds)
            self.pid = struct.unpack("!i", _recv_exact(self._conn, 4))[0]
        finally:
            for fd in opened:
                os.close(fd)
        for name, r in mine.items():
            f = os.fdopen(r, "rb")
            setattr(self, name, io.TextIOWrapper(f, encoding=locale.getpreferredencoding(False)) if text else f)

    def poll(self):
        if self.returncode is None and _readable(self._conn, 0):
            self._finish()
        return self.returncode

    def wait(self, timeout=None):
        if self.returncode is None:
            if not _readable(self._conn, timeout):
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._finish()
        return self.returncode

    def _finish(self):
        status = struct.unpack("!i", _recv_exact(self._conn, 4))[0]
        self._conn.close()
        self.returncode = os.waitstatus_to_exitcode(status)

    def communicate(self, input=None, timeout=None):
        assert input is None, "warm_python passes no input"
        deadline = None if timeout is None else time.monotonic() + timeout
        streams = [s for s in (self.stdout, self.stderr) if s is not None]
        chunks = {id(s): [] for s in streams}
        sel = selectors.DefaultSelector()
        for s in streams:
            sel.register(s.buffer if self._text else s, selectors.EVENT_READ, s)
        while sel.get_map():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            for key, _ in sel.select(left):
                data = os.read(key.fileobj.fileno(), 1 << 16)
                if data:
                    chunks[id(key.data)].append(data)
                else:
                    sel.unregister(key.fileobj)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        out = []
        for s in (self.stdout, self.stderr):
            if s is None:
                out.append(None)
                continue
            data = b"".join(chunks[id(s)])
            s.close()
            if self._text:  # as subprocess does in text mode: decoded, universal newlines
                data = data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")
            out.append(data)
        return tuple(out)

    def send_signal(self, sig):
        if self.returncode is None:
            os.kill(self.pid, sig)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for s in (self.stdout, self.stderr):
            if s is not None:
                s.close()
        self.wait()


def _readable(sock, timeout) -> bool:
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    return bool(sel.select(timeout))


def _recv_exact(sock, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            raise RuntimeError("warm_python server closed the connection")
        buf += part
    return buf


def popen(args, *, cwd=None, env=None, stdin=None, stdout=None, stderr=None, start_new_session=False, text=False,
          **kwargs):
    """subprocess.Popen(args, ...), forked warm when the command allows it (module docstring)."""
    env = dict(os.environ if env is None else env)
    program = _program(args)
    server = None if program is None or kwargs or os.environ.get("ABLATIONS_TEST_COLD") else _server_for(env)
    if server is None:
        return subprocess.Popen(args, cwd=cwd, env=env, stdin=stdin, stdout=stdout, stderr=stderr,
                                start_new_session=start_new_session, text=text, **kwargs)
    return WarmProcess(server, args, program, cwd, env, stdin, stdout, stderr, start_new_session, text)


def run(args, *, cwd=None, env=None, capture_output=False, text=False, timeout=None, check=False, stdin=None,
        stdout=None, stderr=None, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run(args, ...), forked warm when the command allows it (module docstring)."""
    if capture_output:
        stdout = stderr = subprocess.PIPE
    with popen(args, cwd=cwd, env=env, stdin=stdin, stdout=stdout, stderr=stderr, text=text, **kwargs) as p:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            raise
    r = subprocess.CompletedProcess(args, p.returncode, out, err)
    if check:
        r.check_returncode()
    return r


# ------------------------------------------------------------------------------------------------------ server
def _serve(path: str, parent: int):
    """Accept jobs on `path` until the test process `parent` is gone; returns (in a forked child only) its job."""
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    base_pythonpath = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base_path = sys.path[1 + len(base_pythonpath):]  # the interpreter's own: stdlib, site-packages
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    waiting: dict[int, socket.socket] = {}  # child pid -> the connection its exit status goes to
    while True:
        if os.getppid() != parent and not waiting:
            sys.exit(0)
        ready, _, _ = select.select([listener], [], [], 0.05)
        if ready:
            conn, _ = listener.accept()
            msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            (n,) = struct.unpack("!I", msg[:4])
            body = msg[4:]
            while len(body) < n:
                body += conn.recv(n - len(body))
            job = json.loads(body)
            pid = os.fork()
            if pid == 0:
                listener.close()
                for c in waiting.values():
                    c.close()
                conn.close()
                return job, fds, base_path
            for fd in fds:
                os.close(fd)
            conn.sendall(struct.pack("!i", pid))
            waiting[pid] = conn
        while waiting:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = waiting.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(struct.pack("!i", status))
                except OSError:
                    pass
                conn.close()


def _child(job: dict, fds: list[int], base_path: list[str]):
    """Become the command: its session, streams, directory, environment and path; then run it as `python` would."""
    import runpy

    if job["session"]:
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    if os.environ.get("PYTHONUNBUFFERED"):
        for name, fd in (("stdout", 1), ("stderr", 2)):
            old = getattr(sys, name)
            setattr(sys, name, io.TextIOWrapper(open(fd, "wb", buffering=0, closefd=False), encoding=old.encoding,
                                                errors=old.errors, write_through=True))
    if "numpy" in sys.modules:  # `random` reseeds itself in a forked child; numpy's global state does not
        sys.modules["numpy"].random.seed()
    pythonpath = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    kind, what = job["program"]
    first = os.getcwd() if kind == "module" else os.path.dirname(os.path.abspath(what))
    sys.path[:] = [first, *pythonpath, *base_path]
    code = 0
    try:
        if kind == "module":
            sys.argv = ["-m", *job["argv"]]
            runpy._run_module_as_main(what, True)  # what `python -m` calls
        else:
            sys.argv = [what, *job["argv"]]
            runpy.run_path(what, run_name="__main__")
    except SystemExit as e:
        code = _exit_code(e.code)
    except BaseException:  # noqa: BLE001 - printed and ended as the interpreter does with an uncaught exception
        sys.excepthook(*sys.exc_info())
        code = 1
    _exit(code)


def _exit_code(value) -> int:
    """SystemExit's argument as the interpreter turns it into an exit status (a message goes to stderr, then 1)."""
    if value is None or isinstance(value, bool) and not value:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def _exit(code: int):
    """The interpreter's shutdown up to its module teardown, as Py_FinalizeEx orders it: wait for the non-daemon
    threads, run the atexit handlers (MLflow ends its runs, logging flushes), flush stdout and stderr; then exit
    without freeing every module's objects one by one, which takes seconds once Lightning is imported and which
    no command here depends on."""
    import atexit
    import threading

    threading._shutdown()
    atexit._run_exitfuncs()
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    _child(*_serve(sys.argv[1], int(sys.argv[2])))
