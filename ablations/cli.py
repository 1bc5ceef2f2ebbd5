"""One way to pass options to every `python -m` command: `key=value`, the Hydra override syntax.

Most commands compose the training config, and Hydra spells its overrides `key=value` (`trainer.max_steps=50`); a
command's own options are spelled the same way (`rounds=10`, `json=out.json`), so a user who knows one command can
guess the next one. The only flags are `-h`/`--help`. The flag spellings some commands had before (`--rounds 10`,
`--check`) still work and print one line naming the new spelling, so scripts and recorded commands keep running.

A command declares its options once, as a `Command`: its `--help`, its parsing and its error lines all come from
that one declaration. Values are read as YAML, as Hydra reads an override's value (`10` an int, `[1,2]` a list,
`null` None, `true` a bool), unless the option says otherwise (`parse=str` for paths, run ids and prompts).
"""
from __future__ import annotations

import difflib
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from modules.errors import ConfigError

HELP = ("-h", "--help")


def yaml_value(text: str) -> Any:
    """A value as Hydra reads it; text YAML cannot read (`a: b: c`) stays text."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def shown(value: Any) -> str:
    """A value as it would be typed: YAML's true/false, text with spaces or newlines quoted."""
    if isinstance(value, bool) or value is None:
        return "null" if value is None else str(value).lower()
    return repr(value) if isinstance(value, str) and (not value or any(c.isspace() for c in value)) else str(value)


def listed(value: Any) -> list:
    """A value as a list: a list as it is, one value as a list of one."""
    return list(value) if isinstance(value, (list, tuple)) else [value]


def wrapped(head: str, text: str, indent: int) -> list[str]:
    """`head` then `text` wrapped at 118 columns, continuation lines indented under the text."""
    return textwrap.wrap(text, 118, initial_indent=head.ljust(indent), subsequent_indent=" " * indent) or [head]


def yaml_options(path, prefix: str) -> tuple["Option", ...]:
    """`prefix + key` for each scalar key of a config file, its value the default and its comment the help: the
    file stays the one list of those options."""
    found = re.findall(r"^(\w+):[ \t]*([^#\n]*?)[ \t]*(?:#[ \t]*(.*))?$", Path(path).read_text(), re.M)
    return tuple(Option(prefix + key, why, yaml_value(value)) for key, value, why in found if value)


@dataclass(frozen=True)
class Option:
    key: str
    help: str
    default: Any = None
    parse: Callable[[str], Any] = yaml_value
    switch: bool = False  # its old spelling `--key` took no value (now `key=true`)
    many: bool = False  # given more than once, its values add up to one list (`--format png --format svg`, an old
    #                     repeatable flag, is format=[png,svg]); given once, its value is as typed

    @property
    def flag(self) -> str:
        """The old spelling: `--probe-rounds` for `probe_rounds`."""
        return "--" + self.key.replace("_", "-")


class CommandLineError(ConfigError):
    """A command line that does not parse; the message is one line naming the argument and the right spelling. A
    ConfigError, so a main() that reports the harness's errors reports this one the same way."""


class HelpRequested(Exception):
    pass


@dataclass(frozen=True)
class Command:
    module: str              # "ablations.paired": run as `python -m ablations.paired`
    synopsis: str            # what follows the module name in the usage line
    about: str               # what the command does, a paragraph
    options: tuple[Option, ...] = ()
    rest: str = ""           # what the other `key=value` arguments are (e.g. training overrides); "": none allowed
    examples: tuple[str, ...] = ()
    positional: str = ""     # what a bare argument (no `=`) is, if the command takes one; "": refused
    notes: tuple[str, ...] = ()  # lines after the options: exceptions, where else options come from

    @property
    def name(self) -> str:
        return f"python -m {self.module}"

    def help(self) -> str:
        """The usage, every option with its default, what else the command takes, examples."""
        spelled = {o.key: f"{o.key}={'true' if o.switch else 'VALUE'}" for o in self.options}
        width = max([len(s) + 4 for s in spelled.values()] + [0])
        lines = [f"usage: {self.name} {self.synopsis}".rstrip(), "", textwrap.fill(" ".join(self.about.split()), 118), ""]
        if self.options:
            lines.append("options (key=value):")
        for o in self.options:
            default = "" if o.default is None or o.switch and o.default is False else f" (default {shown(o.default)})"
            lines += wrapped(f"  {spelled[o.key]}", (o.help + default).strip(), width)
        lines += wrapped("other key=value arguments: ", self.rest, 2) if self.rest else \
            ["no other arguments" + (f" than {self.positional}" if self.positional else "")]
        for n in self.notes:
            lines += wrapped("", n, 2)
        if self.examples:
            lines += ["", "examples:", *(f"  {self.name} {e}" for e in self.examples)]
        return "\n".join(lines)

    def parse(self, argv: list[str]) -> tuple[dict, list[str]]:
        """argv -> (every option's value, the other arguments in order). Raises HelpRequested on -h/--help,
        CommandLineError on an argument this command does not take."""
        if any(a in HELP for a in argv):
            raise HelpRequested
        argv, renamed = self.modernize(argv)
        if renamed:  # one line for all of them: the command still runs
            print(f"{self.name}: {' '.join(old for old, _ in renamed)} is spelled "
                  f"{' '.join(new for _, new in renamed)} now", file=sys.stderr)
        values, rest, seen = {o.key: o.default for o in self.options}, [], set()
        for a in argv:
            key, eq, text = a.partition("=")
            option = self.keys.get(key)
            if option is not None and eq:
                try:
                    value = option.parse(text)
                except (TypeError, ValueError) as e:
                    raise CommandLineError(f"{self.module}: {a}: {e}") from None
                if option.many and key in seen:
                    value = [*listed(values[key]), *listed(value)]
                values[key] = value
                seen.add(key)
            elif eq and self.rest or not eq and self.positional and not a.startswith("-"):
                rest.append(a)
            else:
                raise CommandLineError(self.unknown(a))
        return values, rest

    def given(self, argv: list[str]) -> set[str]:
        """The options the command line names, in either spelling: an option given as `null` (`sd=null`) overrides
        a value read from elsewhere (a config file's), which its default None would not."""
        return {a.partition("=")[0] for a in self.modernize(argv)[0] if a.partition("=")[0] in self.keys}

    @property
    def keys(self) -> dict[str, Option]:
        return {o.key: o for o in self.options}

    def modernize(self, argv: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
        """The old flag spellings rewritten as key=value -> (argv, [(old, new)]). `--key value`, `--key=value` and a
        switch's `--key` (key=true) are read; any other argument is left as it is."""
        flags = {o.flag: o for o in self.options}
        out, renamed, i = [], [], 0
        while i < len(argv):
            a = argv[i]
            flag, eq, text = a.partition("=")
            option = flags.get(flag) if a.startswith("--") else None
            if option is not None and not eq and not option.switch:
                if i + 1 == len(argv):
                    raise CommandLineError(f"{self.module}: {a} needs a value: {option.key}=VALUE")
                i += 1
                a, text = f"{a} {argv[i]}", argv[i]
            new = a if option is None else f"{option.key}={text if eq or not option.switch else 'true'}"
            out.append(new)
            if option is not None:
                renamed.append((a, new))
            i += 1
        return out, renamed

    def unknown(self, arg: str) -> str:
        """One line: the argument, the closest option's spelling, where the list is."""
        key = arg.partition("=")[0].lstrip("-").replace("-", "_")
        close = difflib.get_close_matches(key, list(self.keys), n=1)
        hint = f"did you mean {close[0]}=...? " if close else ""
        if "=" in arg and not arg.startswith("-"):  # name the key, so the line says which part is wrong
            what = f"option {arg.partition('=')[0]!r} (in {arg!r})"
        else:
            what = f"{'option' if arg.startswith('-') else 'argument'} {arg!r}"
        return f"{self.module}: unknown {what}; {hint}options are key=value: {self.name} --help lists them"

    def parse_or_help(self, argv: list[str]) -> tuple[dict, list[str]]:
        """`parse`, but -h/--help prints the help and exits 0 (an error is left to the caller's own reporting)."""
        try:
            return self.parse(argv)
        except HelpRequested:
            print(self.help())
            raise SystemExit(0) from None

    def fail(self, error: Exception) -> int:
        """The analysis commands' one error line, `<module>: error: ...` (their historical form; the others print
        `error: <module>: ...` through `read`), the message's own leading `<module>: ` not repeated; -> exit
        status 2."""
        print(f"{self.module}: error: {str(error).removeprefix(self.module + ': ')}", file=sys.stderr)
        return 2

    def read(self, argv: list[str]) -> tuple[dict, list[str]]:
        """`parse` for a main(): prints the help and exits 0, or prints the one-line error and exits 2."""
        try:
            return self.parse_or_help(argv)
        except CommandLineError as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
