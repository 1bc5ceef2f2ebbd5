"""Every `python -m` command of the project: listed in docs/commands.md, `--help` exits 0 and lists its options, an
old flag spelling still runs with one line naming the new one, a wrong option is one line naming it (exit 2)."""
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
from commands_testing import run_main

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


def declared(module: str):
    """The module's ablations.cli.Command, where it has one (ablations.bench's is in its cli submodule)."""
    main = importlib.import_module(module).main
    return getattr(sys.modules[main.__module__], "COMMAND", None)


@pytest.mark.parametrize("module", [m for m in COMMANDS if m != "ablations.run"])
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_the_options(module, flag):
    r = run_main(module, [flag])
    code, out = r.returncode, r.stdout
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
    ("analysis.report", ["norms", "--tracking-uri", "sqlite:///x.db", "--format", "png", "--format", "svg", "--kind",
                         "ablation"], {"tracking_uri": "sqlite:///x.db", "format": ("png", "svg"), "kind": "ablation"}),
    ("analysis.lr_transfer", ["--tracking-uri", "sqlite:///x.db", "--experiment", "e", "--out", "d"],
     {"tracking_uri": "sqlite:///x.db", "experiment": "e", "out": "d"}),
    ("analysis.lr_hypothesis", ["--out", "d", "--previous", ".."], {"out": "d", "previous": ".."}),
]


@pytest.mark.parametrize("module,argv,expected", OLD, ids=[m for m, _, _ in OLD])
def test_old_spelling_still_parses_and_names_the_new_one(module, argv, expected, capsys):
    values, _ = importlib.import_module(module).COMMAND.parse(argv)
    assert {k: values[k] for k in expected} == expected
    err = capsys.readouterr().err.strip().splitlines()
    new = " ".join(f"{k}={'true' if v is True else v}" for k, v in expected.items()
                   if not isinstance(v, (list, tuple)))  # a list is spelled as each of its values was
    assert len(err) == 1 and "is spelled" in err[0] and all(w in err[0] for w in new.split()), err


@pytest.mark.parametrize("module,argv,hint", [
    ("ablations.paired", ["--stesp", "3", "a=", "b="], "did you mean steps="),
    ("sweeps.replay", ["order=5"], "did you mean orders="),
    ("ablations.export", ["--logg", "run_id=abc", "out=d"], "did you mean log="),
    ("ablations.memory", ["bnech=true"], "did you mean bench="),
    ("analysis.report", ["--tracking-url", "sqlite:///x.db", "norms"], "did you mean tracking_uri="),
    ("analysis.report", ["outt=d", "norms"], "did you mean out="),
    ("analysis.lr_transfer", ["experimnt=e"], "did you mean experiment="),
    ("analysis.lr_hypothesis", ["--previus", ".."], "did you mean previous="),
])
def test_wrong_option_is_one_line_exit_2(module, argv, hint):
    r = run_main(module, argv)
    code, err = r.returncode, r.stderr
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and argv[0] in lines[0] and hint in lines[0], lines


def test_given_names_the_options_on_the_command_line_in_either_spelling():
    """An option given as null is told apart from one not given (its default None) only by `given`."""
    from ablations.cli import Command, Option

    c = Command("x.y", "", "", (Option("sd", ""), Option("pilot_uri", "", parse=str), Option("check", "", switch=True)),
                rest="overrides")
    assert c.given(["sd=null", "--pilot-uri", "u", "--check", "trainer.max_steps=3"]) == {"sd", "pilot_uri", "check"}
    assert c.given(["trainer.max_steps=3"]) == set()


def test_an_old_repeatable_flag_adds_up_to_one_list(capsys):
    """`--format png --format svg` (argparse's action=append) is format=[png,svg]; format=[png,svg] and a repeated
    format= read the same; given once, the value is as typed; an option that is not `many` keeps its last value."""
    from ablations.cli import Command, Option

    c = Command("x.y", "", "", (Option("format", "", "png", many=True), Option("out", "", parse=str)))
    assert c.parse(["--format", "png", "--format", "svg", "--format=pdf"])[0]["format"] == ["png", "svg", "pdf"]
    assert "--format png --format svg --format=pdf is spelled format=png format=svg format=pdf" in \
        capsys.readouterr().err
    assert c.parse(["format=[png,svg]"])[0]["format"] == ["png", "svg"]
    assert c.parse(["format=png", "format=[svg,pdf]"])[0]["format"] == ["png", "svg", "pdf"]
    assert c.parse(["format=svg"])[0]["format"] == "svg" and c.parse([])[0]["format"] == "png"
    assert c.parse(["out=a", "out=b"])[0]["out"] == "b"


def test_the_report_tells_a_filter_from_an_option(capsys):
    """analysis.report's QUERY may be an MLflow filter holding `=`: a word whose text before `=` could name an option
    is one (unknown: one line, exit 2), any other is the query; KIND and the older kind= are checked as they parse."""
    from analysis.report import COMMAND, main

    values, words = COMMAND.parse(["ablation", "tags.choice.norm = 'rmsnorm'", "format=[png,svg]", "margin=0.02"])
    assert words == ["ablation", "tags.choice.norm = 'rmsnorm'"] and values["format"] == ("png", "svg")
    assert values["margin"] == 0.02 and COMMAND.parse(["params.x='1'"])[1] == ["auto", "params.x='1'"]
    assert COMMAND.parse(["q", "kind=protocol"])[1] == ["protocol", "q"]  # the words resolved: [KIND, QUERY]
    for argv, says in ((["status=1", "q"], "unknown option 'status'"), (["--outt=d", "q"], "unknown option '--outt=d'"),
                       (["norms", "q"], "expected [KIND] QUERY"), (["ladder", "q", "kind=ladder"], "expected [KIND]"),
                       (["q", "kind=nope"], "kind=nope: choose one of auto, ablation"),
                       (["q", "format=[png,gif]"], "format=gif: choose png, svg, pdf"),
                       (["protocol", "q", "held_out=a=b.db"], "only the ladder kind reads a held-out rung"),
                       (["q", "margin=wide"], "margin=wide"), ([], "expected [KIND] QUERY")):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("analysis.report: error: ") and says in err[0], (argv, err)
