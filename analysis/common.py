"""Sections shared by several report kinds: the n-gram floor, the paired throughput and the Regenerate command.

Each reads what the kind's load put into the context: `ctx.floor` (analysis/floor.py), `ctx.floor_arms` ((label,
mean val bpb) per arm), `ctx.paired` / `ctx.paired_path` (--paired FILE) and `ctx.option_args`.
"""
from __future__ import annotations

import shlex

from analysis.engine import section
from analysis.floor import FLOOR_COMMAND, floor_blocks
from analysis.paired import paired_blocks
from analysis.store import display_uri


@section("floor")
def floor_section(ctx) -> list:
    """The n-gram floor of the runs' data beside each arm's mean val bpb."""
    return floor_blocks(ctx.floor, ctx.floor_arms, FLOOR_COMMAND)


@section("paired")
def paired_section(ctx) -> list:
    return paired_blocks(ctx.paired, ctx.paired_path)


def command(ctx, program: str = "analysis.report") -> str:
    """The command that regenerates this report (query, store, the options it was given) into DIR."""
    args = ["python", "-m", program, ctx.query, "--tracking-uri", display_uri(ctx.tracking_uri), *ctx.option_args]
    return " ".join(shlex.quote(a) for a in args) + " --out DIR"


@section("regenerate")
def regenerate_section(ctx) -> list:
    return [("h2", "Regenerate"), ("code", command(ctx))]
