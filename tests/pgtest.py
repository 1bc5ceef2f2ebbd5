"""A throwaway PostgreSQL server for tests and local experiments (Debian's ``postgresql`` package).

    python tests/pgtest.py start [DIR]   # initdb + start on 127.0.0.1, a free port; prints the URL
    python tests/pgtest.py stop DIR

The cluster lives in DIR (default: a new temp dir), listens on 127.0.0.1 only, trusts local connections and
runs with fsync off: for tests only. Run as root, it initialises and runs the server as the ``postgres`` user.
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path


class PostgresUnavailable(RuntimeError):
    """PostgreSQL server binaries are not installed or the server does not start."""


def find_bindir() -> Path:
    """The directory holding initdb/pg_ctl: $PATH first, else Debian's /usr/lib/postgresql/<ver>/bin."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(on_path).resolve().parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    if candidates:
        return Path(candidates[-1]).parent
    raise PostgresUnavailable("PostgreSQL server binaries (initdb, pg_ctl) not found: "
                              "apt-get install -y postgresql")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_server_user(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise PostgresUnavailable("running as root and there is no 'postgres' user to run the server") from None
    runuser = shutil.which("runuser")
    if runuser:
        return [runuser, "-u", "postgres", "--", *cmd]
    return ["su", "postgres", "-s", "/bin/sh", "-c", " ".join(cmd)]


@dataclass
class Cluster:
    datadir: Path
    port: int
    bindir: Path

    @property
    def base_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}"

    def url(self, database: str = "postgres") -> str:
        return f"{self.base_url}/{database}"

    def stop(self) -> None:
        subprocess.run(_as_server_user([str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", "immediate",
                                        "-w", "stop"]), capture_output=True, timeout=60)


def start(base: str | os.PathLike | None = None) -> Cluster:
    bindir = find_bindir()
    root = Path(base) if base else Path(tempfile.mkdtemp(prefix="sweeps-pg-"))
    root.mkdir(parents=True, exist_ok=True)
    datadir = root / "data"
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(root, pw.pw_uid, pw.pw_gid)
        os.chmod(root, 0o755)
    port = free_port()
    run = lambda cmd: subprocess.run(_as_server_user(cmd), capture_output=True, text=True, timeout=120)  # noqa: E731
    r = run([str(bindir / "initdb"), "-D", str(datadir), "-A", "trust", "-U", "postgres", "-E", "UTF8",
             "--no-sync", "--no-instructions"])
    if r.returncode != 0:
        raise PostgresUnavailable(f"initdb failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    opts = (f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off "
            f"-c full_page_writes=off -c max_connections=100")
    r = run([str(bindir / "pg_ctl"), "-D", str(datadir), "-l", str(root / "server.log"), "-o", opts, "-w",
             "-t", "60", "start"])
    if r.returncode != 0:
        log = (root / "server.log").read_text(errors="replace")[-500:] if (root / "server.log").exists() else ""
        raise PostgresUnavailable(f"pg_ctl start failed: {(r.stderr or r.stdout).strip()[-300:]} {log}")
    return Cluster(datadir=datadir, port=port, bindir=bindir)


def create_database(server_url: str, name: str) -> str:
    """CREATE DATABASE ``name`` on the server of ``server_url`` (any database URL there); returns its URL."""
    import psycopg  # the project's one PostgreSQL driver (psycopg 3: the [cluster] extra)
    from sqlalchemy.engine import make_url

    u = make_url(server_url)
    with psycopg.connect(host=u.host or "127.0.0.1", port=u.port or 5432, user=u.username, password=u.password,
                         dbname=u.database or "postgres", connect_timeout=10, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return u.set(database=name).render_as_string(hide_password=False)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("start", "stop"):
        print(__doc__.strip())
        return 2
    try:
        if argv[0] == "start":
            c = start(argv[1] if len(argv) > 1 else None)
            print(c.url())
            print(f"# stop with: python tests/pgtest.py stop {c.datadir.parent}", file=sys.stderr)
        else:
            root = Path(argv[1])
            Cluster(datadir=root / "data", port=0, bindir=find_bindir()).stop()
    except PostgresUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
