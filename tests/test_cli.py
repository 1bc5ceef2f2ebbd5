"""Every `python -m` command of the project: listed in docs/commands.md, `--help` exits 0 and lists its options, an
old flag spelling still runs with one line naming the new one, a wrong option is one line naming it (exit 2)."""
import contextlib
import importlib
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("ablations", "sweeps", "analysis")


def entry_points() -> list[str]:
    """Every module of the packages that runs as `python -m`: a `__main__` guard, or a package's __main__.py."""
    found = []
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            rel = path.relative_to(REPO).with_suffix("")
            if path.name == "__main__.py":
                found.append(".".join(rel.parts[:-1]))
            elif 'if __name__ == "__main__"' in path.read_text():
                found.append(".".join(rel.parts))
    return found


COMMANDS = entry_points()


def test_every_command_is_in_the_inventory():
    listed = set(re.findall(r"^\| `([\w.]+)`", (REPO / "docs" / "commands.md").read_text(), re.M))
    assert set(COMMANDS) == listed, "docs/commands.md's table and the entry points differ"


def run_main(module: str, argv: list[str]) -> tuple[int, str, str]:
    """main(argv) in this process -> (exit code, stdout, stderr); SystemExit is an exit code like any other."""
    main = importlib.import_module(module).main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
    return code or 0, out.getvalue(), err.getvalue()


def declared(module: str):
    """The module's ablations.cli.Command, where it has one (ablations.bench's is in its cli submodule)."""
    main = importlib.import_module(module).main
    return getattr(sys.modules[main.__module__], "COMMAND", None)


@pytest.mark.parametrize("module", [m for m in COMMANDS if m != "ablations.run"])
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_the_options(module, flag):
    code, out, _ = run_main(module, [flag])
    assert code == 0 and out.lstrip().startswith("usage:"), out[:300]
    command = declared(module)
    for option in command.options if command else ():
        assert f"  {option.key}=" in out, f"{module} --help does not list {option.key}="


def test_help_of_the_hydra_entry_point():
    """ablations.run is Hydra's own @hydra.main: its --help is Hydra's (the config groups and the composed config)."""
    r = subprocess.run([sys.executable, "-m", "ablations.run", "--help"], capture_output=True, text=True, cwd=REPO,
                       timeout=120)
    assert r.returncode == 0 and "== Configuration groups ==" in r.stdout and "trainer:" in r.stdout, r.stderr[-2000:]


OLD = [  # one old spelling per command that had flags, and what it now reads as
    ("ablations.paired", ["--steps", "3", "a=", "b="], {"steps": 3}),
    ("ablations.bench.cli", ["--threads", "1", "--only", "train,norms", "--no-compile"],
     {"threads": 1, "only": ["train", "norms"], "no_compile": True}),
    ("ablations.memory", ["--bench"], {"bench": True}),
    ("ablations.rerun", ["run_id=abc", "--check"], {"check": True}),
    ("ablations.export", ["run_id=abc", "out=d", "--log"], {"log": True}),
    ("sweeps.plan", ["verdict=x", "--simulate"], {"simulate": True}),
    ("sweeps.replay", ["--orders=20"], {"orders": 20}),
]


@pytest.mark.parametrize("module,argv,expected", OLD, ids=[m for m, _, _ in OLD])
def test_old_spelling_still_parses_and_names_the_new_one(module, argv, expected, capsys):
    values, _ = importlib.import_module(module).COMMAND.parse(argv)
    assert {k: values[k] for k in expected} == expected
    err = capsys.readouterr().err.strip().splitlines()
    new = " ".join(f"{k}={'true' if v is True else v}" for k, v in expected.items() if k != "only")
    assert len(err) == 1 and "is spelled" in err[0] and all(w in err[0] for w in new.split()), err


@pytest.mark.parametrize("module,argv,hint", [
    ("ablations.paired", ["--stesp", "3", "a=", "b="], "did you mean steps="),
    ("sweeps.replay", ["order=5"], "did you mean orders="),
    ("ablations.export", ["--logg", "run_id=abc", "out=d"], "did you mean log="),
    ("ablations.memory", ["bnech=true"], "did you mean bench="),
])
def test_wrong_option_is_one_line_exit_2(module, argv, hint):
    code, _, err = run_main(module, argv)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and argv[0] in lines[0] and hint in lines[0], lines


def test_given_names_the_options_on_the_command_line_in_either_spelling():
    """An option given as null is told apart from one not given (its default None) only by `given`."""
    from ablations.cli import Command, Option

    c = Command("x.y", "", "", (Option("sd", ""), Option("pilot_uri", "", parse=str), Option("check", "", switch=True)),
                rest="overrides")
    assert c.given(["sd=null", "--pilot-uri", "u", "--check", "trainer.max_steps=3"]) == {"sd", "pilot_uri", "check"}
    assert c.given(["trainer.max_steps=3"]) == set()
