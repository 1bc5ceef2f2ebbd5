"""What every section of the bench shares: the options, the run's context (`Bench`), the section registry (filled
by `@section`; cli.py imports the sections), the composed model and the number format of the table."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
Row = tuple[str, str]  # (name, figures): one line of the printed table


@dataclass(frozen=True)
class Options:
    """The command's options (see the package docstring); `None` = the section's default."""
    json: Path = Path("bench.json")
    mlflow: bool = False
    quick: bool = False
    no_compile: bool = False
    threads: int | None = None
    device: str = "cpu"
    contexts: list[int] | None = None
    new_tokens: int | None = None
    inference_dtype: str = "fp32"
    peak_flops: float | None = None
    rounds: int | None = None
    window: float | None = None
    steps: int | None = None
    force_emulated: bool = False


@dataclass(frozen=True)
class PrecisionPlan:
    """The precisions the bench trains in, those it skips (precision -> why) and the GEMM probe's peaks."""
    run: list[str]
    skipped: dict[str, str]
    peaks: dict[str, float]

    def line(self) -> str:
        return (f"skipped {'; '.join(self.skipped.values())}; --force-emulated runs "
                f"{'them' if len(self.skipped) > 1 else 'it'}")


@dataclass(frozen=True)
class Bench:
    """What a section is given: the composed config, its model as a dict, the options, and the run's timing."""
    overrides: list[str]
    cfg: DictConfig
    model: dict
    opts: Options
    window: float  # seconds each item is timed per round
    rounds: int  # interleaved rounds
    log: Callable[[str], None] = lambda msg: None
    # decided once by the runner (ceilings.plan_precisions) when a chosen section uses_precisions, else None
    precisions: PrecisionPlan | None = None

    @property
    def device(self) -> str:
        return self.opts.device

    @property
    def cuda(self) -> bool:
        return self.opts.device.startswith("cuda")

    @property
    def batch_size(self) -> int:
        return int(self.cfg.data.batch_size)



@dataclass
class Figures:
    """What a section made: top-level keys of the JSON (flattened into MLflow metrics with --mlflow) and rows of
    the printed table."""
    values: dict = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)


class Section:
    """One section of the bench; subclass it in a module of this package and decorate it with `@section`.

    Phases, for every section selected: `check` (refuse bad options before anything is measured), `work` (items
    timed side by side with the other sections' in the shared interleaved rounds), then `run` in `order`.
    """
    name: str = ""
    order: int = 0  # position in the table and the JSON
    needs: tuple[str, ...] = ()  # sections that run whenever this one does (train needs the ceilings: MFU)
    uses_precisions: bool = False  # trains in (or times) bench.precisions: the run says once what they skip
    warmup: int = 1  # untimed calls of each shared-round item before the rounds

    def check(self, bench: Bench) -> None:
        """Raise SystemExit with one line for options this section cannot use."""

    def work(self, bench: Bench) -> dict[str, Callable[[], float]]:
        """name -> fn() doing one unit of work and returning its amount, for the shared interleaved rounds."""
        return {}

    def run(self, bench: Bench, rates: dict[str, dict], earlier: dict) -> Figures:
        """rates: this section's `work` items -> {"best", "best_round", "median"} amount/sec; earlier: the JSON
        so far (the header and the sections before this one)."""
        raise NotImplementedError


_SECTIONS: dict[str, type[Section]] = {}


def section(cls: type[Section]) -> type[Section]:
    """Class decorator: registers a Section subclass under its `name`."""
    other = _SECTIONS.get(cls.name)
    if not cls.name or (other is not None and other is not cls):
        raise ValueError(f"bench section {cls.__module__}.{cls.__qualname__}: name {cls.name!r} is empty or taken")
    _SECTIONS[cls.name] = cls
    return cls


def registered() -> dict[str, type[Section]]:
    """name -> Section class of every section imported so far, in table order."""
    return dict(sorted(_SECTIONS.items(), key=lambda kv: kv[1].order))


def build_model(model_cfg: dict, device: str = "cpu"):
    from modules.config import GPTConfig
    from modules.gpt import GPT

    return GPT(GPTConfig.from_dict(model_cfg)).to(device)


def model_dict(cfg: DictConfig) -> dict:
    """The composed model config as a plain dict, with a vocabulary size even where only the corpus knows it."""
    model = OmegaConf.to_container(cfg.model, resolve=True)
    if model.get("vocab_size") is None:  # char tokenizer: vocabulary size is only known after reading the corpus
        model["vocab_size"] = 65
    return model


def fmt(value, unit: str = "", digits: int = 3) -> str:
    """A figure with an SI prefix: fmt(1.5e9, "B/s") -> "1.5 GB/s"."""
    if value is None:
        return "n/a"
    if isinstance(value, (float, int)):
        value = float(value)
        for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
            if abs(value) >= scale:
                return f"{value / scale:.{digits}g} {prefix}{unit}".strip()
        return f"{value:.{digits}g} {unit}".strip()
    return f"{value} {unit}".strip()
