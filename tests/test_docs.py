"""The docs stay true where they name code: README.md and docs/*.md are read, and

- every `python -m <project module> ...` command they show parses, without running: Hydra entry points compose their
  config with the shown overrides, tools with their own argument parser parse the arguments with it;
- every `package.module.Name` they name in backticks exists, a stated base class (`Name(Base)`) is a direct base,
  and the keyword names of a shown signature are parameters of the callable;
- every relative link resolves to a file (and a `#fragment` to a heading of it), every backticked repository path
  exists.

Items are collected from the docs, so a command or name added to a doc is checked without editing this file; a doc
that names a module that does not exist fails, naming the doc, the line and the command.

How a command shown as a synopsis is made concrete: `[optional groups]` are dropped (only the required part is
parsed), `<placeholder>` becomes a dummy value (for `group=<name>` the group's first option in conf/), an upper-case
metavariable (`N`, `FILE`, `ARM=OVERRIDES`) a dummy of its kind, `...` repeats the argument before it, and
`key=a|b` is tried with each alternative.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import contextlib
import functools
import importlib
import importlib.util
import inspect
import io
import itertools
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PACKAGES = ("modules", "ablations", "sweeps", "analysis")
REPO_DIRS = (*PACKAGES, "conf", "tests", "scripts", "docs", "reports")
# The tests chdir into a temporary directory: imports must still find this checkout's packages, not whatever an
# empty working directory or another install would give.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


# --------------------------------------------------------------------------------------------- reading the docs


@dataclass(frozen=True)
class Snippet:
    doc: Path
    line: int
    text: str

    def where(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}"


def _fenced_and_prose(doc: Path) -> tuple[list[Snippet], str]:
    """-> (logical lines inside ``` blocks, with backslash continuations joined; the prose with fenced lines blanked
    so that offsets still give line numbers)."""
    lines = doc.read_text(encoding="utf-8").split("\n")
    code, prose, inside, pending = [], [], False, None
    for i, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            inside = not inside
            prose.append("")
            continue
        if not inside:
            prose.append(line)
            continue
        prose.append("")
        if pending is not None:
            pending = Snippet(doc, pending.line, pending.text + " " + line.strip())
        else:
            pending = Snippet(doc, i, line)
        if pending.text.rstrip().endswith("\\"):
            pending = Snippet(doc, pending.line, pending.text.rstrip()[:-1])
            continue
        code.append(pending)
        pending = None
    return code, "\n".join(prose)


def _spans(doc: Path) -> list[Snippet]:
    """Backtick spans of the prose (a span may wrap onto the next line)."""
    _, prose = _fenced_and_prose(doc)
    return [Snippet(doc, prose.count("\n", 0, m.start()) + 1, " ".join(m.group(1).split()))
            for m in re.finditer(r"`([^`]{1,400})`", prose)]


_COMMAND = re.compile(r"python3? -m ([A-Za-z_][\w.]*)")


@dataclass(frozen=True)
class Command:
    where: str
    module: str
    args: str  # the text after the module name, as written
    inline: bool  # from a backtick span of the prose, not a code block

    def __str__(self) -> str:
        return f"python -m {self.module} {self.args}".rstrip()


def _commands() -> list[Command]:
    out = []
    for doc in DOCS:
        code, _ = _fenced_and_prose(doc)
        sources = [(s, False) for s in code] + [(s, True) for s in _spans(doc)]
        for snip, inline in sources:
            for m in _COMMAND.finditer(snip.text):
                if m.group(1).split(".")[0] not in PACKAGES:
                    continue
                rest = snip.text[m.end():]
                rest = re.split(r"\s(?:&&|\|\||;|\||>|2>)\s|python3? -m ", rest)[0]
                out.append(Command(snip.where(), m.group(1), rest.strip(), inline))
    return out


# ------------------------------------------------------------------------------------- synopsis -> a real argv


METAVARS = {"N": "2", "R": "2", "C": "64", "F": "1e12", "SEC": "1", "URI": "sqlite:///docs-test.db",
            "FILE": "docs-test.json", "DIR": "docs-test", "FILE_OR_DIR": "docs-test.txt", "SECTIONS": "ceilings",
            "ARM": "arm", "OVERRIDES": "", "KIND": "auto"}


def _group_option(group: str) -> str | None:
    options = sorted(p.stem for p in (CONF / group).glob("*.yaml") if not p.stem.startswith("_"))
    return options[0] if options else None


def _dummy(token: str, n: int) -> str:
    """One argument with its placeholders and metavariables replaced; n numbers repeats (`...`)."""
    key, eq, value = token.partition("=")
    if eq and "<" in value and "/" not in value and (CONF / key).is_dir():
        return f"{key}={_group_option(key)}"
    token = re.sub(r"<[^<>]+>", "x" if n == 1 else f"x{n}", token)

    def meta(m: re.Match) -> str:
        word = m.group(0)
        if word == "ARM":
            return "arm" if n == 1 else f"arm{n}"
        return METAVARS[word]

    return re.sub(r"(?<![\w.-])(" + "|".join(sorted(METAVARS, key=len, reverse=True)) + r")(?![\w.-])", meta, token)


_OPTIONAL = re.compile(r"(^|\s)\[([^\[\]]*)\]")  # `[--check]`; a value list `key=[1,2]` is not optional


def optional_groups(command: Command) -> list[str]:
    return [m.group(2) for m in _OPTIONAL.finditer(command.args)]


def argvs(command: Command, extra: str = "") -> list[list[str]]:
    """The concrete argument lists a shown command stands for (one per `a|b` alternative): its required part, plus
    `extra` (one of its optional groups)."""
    text = _OPTIONAL.sub(" ", command.args) + " " + extra
    try:
        tokens = shlex.split(text, comments=True)
    except ValueError as e:
        pytest.fail(f"{command.where}: `{command}`: cannot split it into arguments ({e})")
    argv, last = [], None
    for tok in tokens:
        if tok in ("...", "…"):
            if last is not None:
                argv.append(_dummy(last, 2))
            continue
        last = tok
        argv.append(_dummy(tok, 1))
    choices = []
    for a in argv:
        m = re.fullmatch(r"([\w.@/+~-]+=)([\w.-]+(?:\|[\w.-]+)+)", a)
        choices.append([m.group(1) + v for v in m.group(2).split("|")] if m else [a])
    return [list(c) for c in itertools.product(*choices)]


# ------------------------------------------------------------------------------------------------ parsing


class _Parsed(Exception):
    def __init__(self, rest: list[str]):
        self.rest = rest


@contextlib.contextmanager
def _stop_after_argparse():
    """The outermost ArgumentParser.parse_args / parse_known_args raises _Parsed once it has parsed (its own
    errors still exit), so a tool's main() parses its arguments and runs nothing."""
    orig_args, orig_known = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
    depth = [0]

    def parse_args(self, args=None, namespace=None):
        depth[0] += 1
        try:
            ns = orig_args(self, args, namespace)
        finally:
            depth[0] -= 1
        if depth[0] == 0:
            raise _Parsed([])
        return ns

    def parse_known_args(self, args=None, namespace=None):
        depth[0] += 1
        try:
            ns, rest = orig_known(self, args, namespace)
        finally:
            depth[0] -= 1
        if depth[0] == 0:
            raise _Parsed(list(rest))
        return ns, rest

    argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = parse_args, parse_known_args
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = orig_args, orig_known


def _compose(overrides: list[str], config_name: str = "config", config_dir: Path = CONF) -> None:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        compose(config_name=config_name, overrides=overrides)


def _expand_multirun(overrides: list[str]) -> list[list[str]]:
    """Hydra multirun `a=1,2 b=x,y` -> each job's overrides."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    per_key = []
    for o in OverridesParser.create().parse_overrides(overrides):
        if o.is_sweep_override():
            key = o.get_key_element()
            per_key.append([f"{key}={v}" for v in o.sweep_string_iterator()])
        else:
            per_key.append([o.input_line])
    return [list(job) for job in itertools.product(*per_key)]


def _hydra_main(argv: list[str]) -> None:
    """A @hydra.main entry point: its flags, then compose every job's config."""
    config_name, config_dir, multirun, overrides = "config", CONF, False, []
    it = iter(argv)
    for a in it:
        if a in ("-m", "--multirun"):
            multirun = True
        elif a in ("-cn", "--config-name"):
            config_name = next(it)
        elif a in ("-cp", "--config-path"):
            path = next(it)
            if not path.startswith("x") and Path(path).is_dir():  # a placeholder stands for a recorded config's dir
                config_dir = Path(path).resolve()
        elif a.startswith("-"):
            raise AssertionError(f"unknown Hydra flag {a!r}")
        else:
            overrides.append(a)
    for job in _expand_multirun(overrides) if multirun else [overrides]:
        _compose(job, config_name, config_dir)


def _source(module: str) -> str:
    """The source of the file that defines the tool's main() (a package may define it in a submodule)."""
    mod = importlib.import_module(module)
    main = getattr(mod, "main", None)
    try:
        return inspect.getsource(inspect.getmodule(main) if main is not None else mod)
    except (OSError, TypeError):
        return ""


def _argparse_main(module: str, argv: list[str]) -> None:
    """Run the tool's main(argv) until its argument parser has parsed; arguments it leaves to others (a tool that
    uses parse_known_args) are Hydra overrides and are composed."""
    main = importlib.import_module(module).main
    err = io.StringIO()
    try:
        with _stop_after_argparse(), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            main(argv)
    except _Parsed as p:
        if p.rest:
            flags = [a for a in p.rest if a.startswith("-")]
            assert not flags, f"unknown option {flags[0]!r}"
            _compose(p.rest)
        return
    except SystemExit as e:
        if e.code in (0, None):
            return
        msg = err.getvalue().strip().splitlines()
        raise AssertionError(str(e.code) if not isinstance(e.code, int) else (msg[-1] if msg else f"exit {e.code}"))
    raise AssertionError(f"{module}.main returned without parsing its arguments with argparse: teach "
                         f"tests/test_docs.py how to parse it")


@contextlib.contextmanager
def _stop_after_compose():
    """hydra.compose raises _Parsed once it has composed a config, in hydra and in every loaded project module that
    imported it by name."""
    import hydra

    orig = hydra.compose

    def compose(*args, **kwargs):
        orig(*args, **kwargs)
        raise _Parsed([])

    patched = [(hydra, "compose")] + [(m, "compose") for name, m in list(sys.modules.items())
                                      if name.split(".")[0] in PACKAGES and getattr(m, "compose", None) is orig]
    for owner, attr in patched:
        setattr(owner, attr, compose)
    try:
        yield
    finally:
        for owner, attr in patched:
            setattr(owner, attr, orig)


def _compose_main(module: str, argv: list[str]) -> None:
    """A tool whose main(argv) checks its arguments and composes the Hydra config itself (or through a helper such
    as sweeps.verdict.load_protocol): run it until the first config is composed; a non-zero return before that is
    its one-line error, a return without composing is a tool this file does not know how to stop."""
    main = importlib.import_module(module).main
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            with _stop_after_compose():
                code = main(argv)
        except _Parsed:
            return
    if any(a in ("-h", "--help") for a in argv) and code in (0, None):
        return
    msg = err.getvalue().strip().splitlines()
    raise AssertionError(msg[-1] if msg and code else f"{module}.main returned {code} without composing a config")


def _key_value_command(module: str, argv: list[str]) -> bool:
    """A command declared with ablations.cli.Command: its own options (and old spellings) parse with it; whether what
    it passes on still needs checking (False: the dispatch below does that)."""
    main = getattr(importlib.import_module(module), "main", None)
    command = getattr(inspect.getmodule(main), "COMMAND", None) if main is not None else None
    if command is None:
        return False
    _, rest = command.parse(argv)  # raises with the one line a user would see
    if module == "ablations.paired":  # the rest are arms, NAME=OVERRIDES
        for arm in (a for a in rest if "$" not in a):  # `"rope=$m position=rope"`: a shell variable, not an arm
            importlib.import_module(module).parse_arm(arm)
        return True
    if module == "ablations.bench":  # the rest are the training overrides it measures
        _compose(rest)
        return True
    if module == "analysis.report":  # the rest are KIND QUERY (an MLflow filter may hold `=`), checked by its parse
        return True
    return not command.rest  # a tool whose rest is composed by its main (sweeps.plan, sweeps.floor) or parse_args


def parse_command(module: str, argv: list[str]) -> None:
    """Parse one command line of a project tool without running it; raises with the reason when it does not."""
    if module == "sweeps.verdict" and hasattr(importlib.import_module(module), "load_protocol"):
        importlib.import_module(module).load_protocol(argv)  # composes the protocol's configs and checks them
        return
    if module == "sweeps.run":  # the sweep group and the trials' overrides are one Hydra config
        _compose(argv)
        return
    if _key_value_command(module, argv):
        return
    source = _source(module)
    if "@hydra.main" in source:
        _hydra_main(argv)
    elif "argparse" in source:
        _argparse_main(module, argv)
    elif hasattr(importlib.import_module(module), "parse_args"):
        importlib.import_module(module).parse_args(argv)
    elif hasattr(importlib.import_module(module), "main"):
        _compose_main(module, argv)  # checks its arguments itself, then composes (directly or through a helper)
    else:
        raise AssertionError(f"no way to parse {module}'s arguments: it has no main(); teach tests/test_docs.py")


COMMANDS = _commands()


@pytest.mark.parametrize("command", COMMANDS, ids=[f"{c.where} {c.module}" for c in COMMANDS])
def test_command_parses(command: Command, tmp_path, monkeypatch):
    if importlib.util.find_spec(command.module) is None:
        pytest.fail(f"{command.where}: `{command}`: module {command.module} does not exist")
    if command.inline and not command.args:
        return  # a mention of the tool by name, not a command line
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setattr(sys, "argv", [command.module])
    failure = _first_failure(command, argvs(command))
    if failure and optional_groups(command):
        # The required part alone may be incomplete when the optional groups are alternatives
        # (`[verdict=<name>] [experiment=<name>]`): then the synopsis holds when one of them completes it.
        if any(_first_failure(command, argvs(command, g)) is None for g in optional_groups(command)):
            failure = None
    if failure:
        pytest.fail(failure)


def _first_failure(command: Command, forms: list[list[str]]) -> str | None:
    for argv in forms:
        try:
            parse_command(command.module, argv)
        except Exception as e:  # noqa: BLE001 - any failure to parse is the doc's mismatch; say which
            reason = " ".join(str(e).split())[:400] or type(e).__name__
            return f"{command.where}: `{command}` (as {argv}) does not parse: {type(e).__name__}: {reason}"
    return None


# ------------------------------------------------------------------------------------------ named code


def _split_args(text: str) -> list[str]:
    """Top-level comma-separated items of an argument list (brackets and quotes nest)."""
    items, depth, cur, quote = [], 0, "", None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(cur.strip())
            cur = ""
            continue
        cur += ch
    return [i for i in [*items, cur.strip()] if i]


@dataclass(frozen=True)
class Named:
    where: str
    span: str
    name: str  # package[.module[.attr]] when qualified, else a bare class name
    args: tuple[str, ...] | None  # None: no parentheses shown
    qualified: bool


_QUALIFIED = re.compile(r"((?:%s)(?:\.[A-Za-z_]\w*)*)(?:\.\{([^}]*)\})?(?:\((.*?)\))?(?:\s*->.*)?"
                        % "|".join(PACKAGES))
_BASES = re.compile(r"([A-Z]\w*)\(([A-Z]\w*(?:, ?[A-Z]\w*)*)\)")


def _named() -> list[Named]:
    out = []
    for doc in DOCS:
        for s in _spans(doc):
            m = _QUALIFIED.fullmatch(s.text)
            if m:
                names = [f"{m.group(1)}.{n.strip()}" for n in m.group(2).split(",")] if m.group(2) else [m.group(1)]
                args = tuple(_split_args(m.group(3))) if m.group(3) is not None else None
                out += [Named(s.where(), s.text, n, args, True) for n in names]
            for b in _BASES.finditer(s.text):  # `ConfigError(AblationsError, ValueError)`, also inside a list
                if not (m and m.group(1).endswith("." + b.group(1))):
                    out.append(Named(s.where(), s.text, b.group(1), tuple(_split_args(b.group(2))), False))
    return out


@functools.cache
def _project_classes() -> dict[str, list[str]]:
    """Bare class name -> the project modules that define it (read from the source, nothing imported)."""
    found: dict[str, list[str]] = {}
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef):
                    found.setdefault(node.name, []).append(module)
    return found


def _resolve(dotted: str):
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            continue
        obj = importlib.import_module(module)
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                raise AssertionError(f"{'.'.join(parts[:parts.index(attr)])} has no attribute {attr!r}")
            obj = getattr(obj, attr)
        return obj
    raise AssertionError(f"no module {parts[0]!r}")


def _check_bases(cls, stated: tuple[str, ...]) -> None:
    direct = [b.__name__ for b in cls.__bases__]
    missing = [b for b in stated if b not in direct]
    name = f"{cls.__module__}.{cls.__qualname__}"
    assert not missing, f"{name} derives from {', '.join(direct)}, not {', '.join(missing)}"


def _check_signature(obj, args: tuple[str, ...]) -> None:
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    shown = [re.split(r"[:=]", a, maxsplit=1)[0].strip() for a in args]
    unknown = [a for a in shown if re.fullmatch(r"[A-Za-z_]\w*", a) and a not in params]
    assert not unknown, f"no parameter {', '.join(map(repr, unknown))}; the signature is {inspect.signature(obj)}"


NAMED = _named()


@pytest.mark.parametrize("named", NAMED, ids=[f"{n.where} {n.name}" for n in NAMED])
def test_named_code_exists(named: Named):
    try:
        if named.qualified:
            obj = _resolve(named.name)
            if named.args is not None and inspect.isclass(obj) and named.args and \
                    all(re.fullmatch(r"[A-Z]\w*", a) for a in named.args):
                _check_bases(obj, named.args)
            elif named.args is not None and callable(obj):
                _check_signature(obj, named.args)
            return
        modules = _project_classes().get(named.name)
        if not modules and hasattr(builtins, named.name):
            return
        assert modules, f"no class {named.name} in {', '.join(PACKAGES)}"
        errors = []
        for module in modules:
            try:
                _check_bases(getattr(importlib.import_module(module), named.name), named.args)
                return
            except AssertionError as e:
                errors.append(str(e))
        raise AssertionError("; ".join(errors))
    except (AssertionError, ImportError) as e:
        pytest.fail(f"{named.where}: `{named.span}`: {e}")


# ---------------------------------------------------------------------------------------------- links, paths


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@functools.cache
def _anchors(doc: Path) -> set[str]:
    _, prose = _fenced_and_prose(doc)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", prose, re.M)}


def _links() -> list[tuple[str, Path, str]]:
    out = []
    for doc in DOCS:
        _, prose = _fenced_and_prose(doc)
        for m in re.finditer(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", prose):
            target = m.group(1)
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            out.append((f"{doc.relative_to(REPO)}:{prose.count(chr(10), 0, m.start()) + 1}", doc, target))
    return out


LINKS = _links()


@pytest.mark.parametrize("where,doc,target", LINKS, ids=[f"{w} {t}" for w, _, t in LINKS])
def test_relative_link_resolves(where: str, doc: Path, target: str):
    path, _, fragment = target.partition("#")
    file = (doc.parent / path).resolve() if path else doc
    shown = file.relative_to(REPO) if file.is_relative_to(REPO) else file
    assert file.exists(), f"{where}: link ({target}) points at {shown}, which does not exist"
    if fragment and file.suffix == ".md":
        assert fragment in _anchors(file), (f"{where}: link ({target}): {file.relative_to(REPO)} has no heading "
                                            f"with anchor #{fragment} (anchors: {sorted(_anchors(file))})")


def _paths() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        for s in _spans(doc):
            first = s.text.split(" ")[0]
            if re.fullmatch(r"(?:%s)/[\w./-]*" % "|".join(REPO_DIRS), first):
                out.append((s.where(), first))
    return out


PATHS = _paths()


@pytest.mark.parametrize("where,path", PATHS, ids=[f"{w} {p}" for w, p in PATHS])
def test_named_path_exists(where: str, path: str):
    assert (REPO / path).exists(), f"{where}: `{path}` does not exist in the repository"


def test_the_docs_are_read():
    """The collectors find what the README and docs plainly contain (guards the regexes above)."""
    modules = {c.module for c in COMMANDS}
    assert {"ablations.run", "sweeps.run", "sweeps.verdict", "analysis.report", "ablations.bench"} <= modules
    assert any(n.name == "modules.errors.AblationsError" for n in NAMED)
    assert any(t.startswith("docs/") for _, d, t in LINKS if d.name == "README.md")
