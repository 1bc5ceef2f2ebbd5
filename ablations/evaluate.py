"""Evaluate a recorded run at other context lengths: `python -m ablations.evaluate run_id=<id> [options]`.

    python -m ablations.evaluate run_id=<id> eval.contexts=[64,128,256,512] eval.mode=nonoverlap
    python -m ablations.evaluate run_id=<id> eval.mode=sliding eval.stride=16
    python -m ablations.evaluate run_id=<id> eval.mode=sliding position.scaling="{name: yarn, factor: 4, original_max: 64}"

The run's `checkpoints/final.ckpt` is scored on the validation split of the run's own data and tokenizer (from its
`config.yaml` artifact; defaults in conf/eval/default.yaml), at each context c of eval.contexts:

- nonoverlap: disjoint windows of c tokens; every token is scored once, the first of each window with no context
  (Press et al.'s "early token curse": short windows leave many tokens with little context).
- sliding: windows of c tokens advancing by eval.stride (null: c // 4); each window scores only the targets not
  scored before, so every token but the first window's is scored with at least c - stride tokens of context, and
  with stride 1 each token sees exactly min(c, its index) tokens before it.

Each window is an independent sequence with positions 0..c-1 (as in training). A scheme with a position table
(learned) is evaluated up to its block_size and refuses larger contexts with one line (exit 2) after evaluating the
others. Results are logged into the run itself, with the context as the metric step (MLflow names allow no `@`):
`eval/<mode>/bpb`, `eval/<mode>/loss` (nats/token), `eval/<mode>/tokens` (targets scored) and
`eval/<mode>/kv_cache_bytes` (bf16 KV cache after c tokens), so `eval/sliding/bpb@256` is the metric
`eval/sliding/bpb` at step 256; with position.scaling the prefix is `eval/<mode>/<name><factor>/` (e.g.
`eval/sliding/yarn4/bpb`). Tags `eval.<mode>[.<name><factor>].stride`, `eval.max_tokens` and, per scaling,
`eval.scaling.<name><factor>` (its resolved parameters) record how. bpb uses the split's tokens-per-byte ratio,
as `val/bpb` does.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

from modules.options import is_int

from .cli import Command, Option, yaml_options
from .compose import CONF_DIR

MODES = ("nonoverlap", "sliding")


COMMAND = Command(
    "ablations.evaluate", "run_id=<id> [eval.KEY=VALUE ...] [position.scaling={...}]", __doc__.split("\n\n")[0],
    options=(Option("run_id", "the MLflow run whose checkpoints/final.ckpt is scored", parse=str),
             Option("tracking.uri", "the store (default $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)", parse=str),
             Option("device", "where to score", "cpu", str),
             Option("threads", "torch intra-op threads"),
             Option("position.scaling", "a RoPE scaling to evaluate with, e.g. {name: yarn, factor: 4, "
                                        "original_max: 64}"),
             *yaml_options(CONF_DIR / "eval" / "default.yaml", "eval.")),
    examples=("run_id=<id> eval.contexts=[64,128,256,512] eval.mode=nonoverlap",
              "run_id=<id> eval.mode=sliding eval.stride=16"))


# ------------------------------------------------------------------------------------------------ windows
def windows(n_targets: int, context: int, mode: str, stride: int | None = None) -> list[tuple[int, int, int]]:
    """-> [(begin, end, n_score)]: feed inputs [begin, end) and score the last n_score of its targets, where
    target j is the token after input j. Every target in [0, n_targets) is scored exactly once."""
    if mode == "nonoverlap":
        return [(b, min(b + context, n_targets), min(b + context, n_targets) - b)
                for b in range(0, n_targets, context)]
    stride = stride or max(1, context // 4)
    out, scored = [], 0
    for end in range(min(context, n_targets), n_targets + stride, stride):
        end = min(end, n_targets)
        if end <= scored:
            break
        out.append((max(0, end - context), end, end - scored))
        scored = end
    return out


@torch.no_grad()
def score(model, tokens: torch.Tensor, context: int, mode: str, stride: int | None = None,
          batch_size: int = 8) -> tuple[float, int]:
    """Summed next-token NLL (nats) and number of targets scored over the 1-D token tensor `tokens`."""
    model.eval()
    device = model.wte.weight.device
    x, y = tokens[:-1], tokens[1:]
    wins = windows(len(x), context, mode, stride)
    by_len: dict[int, list] = {}
    for w in wins:  # same-length windows batch together (all but possibly the last)
        by_len.setdefault(w[1] - w[0], []).append(w)
    total, n = 0.0, 0
    for length, group in by_len.items():
        for i in range(0, len(group), batch_size):
            chunk = group[i:i + batch_size]
            xb = torch.stack([x[b:e] for b, e, _ in chunk]).to(device)  # (B, T)
            yb = torch.stack([y[b:e] for b, e, _ in chunk]).to(device)  # (B, T)
            nll = F.cross_entropy(model(xb).float().flatten(0, 1), yb.flatten(), reduction="none").view(len(chunk), -1)
            keep = torch.arange(length, device=device)[None, :] >= torch.tensor(
                [length - k for _, _, k in chunk], device=device)[:, None]  # (B, T): the last n_score targets
            total += float(nll[keep].double().sum())
            n += int(keep.sum())
    return total, n


# ------------------------------------------------------------------------------------------------ options
def parse_args(argv: list[str]):
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from .errors import ConfigError

    defaults = OmegaConf.load(CONF_DIR / "eval" / "default.yaml")
    COMMAND.parse_or_help(argv)  # -h/--help, an unknown option: the values are merged onto the defaults below
    try:
        given = OmegaConf.from_dotlist(argv)
    except OmegaConfBaseException as e:
        raise ConfigError(f"cannot parse the arguments ({str(e).splitlines()[0]}): python -m ablations.evaluate --help lists the options") from None
    base = OmegaConf.create({"run_id": None, "tracking": {"uri": None}, "device": "cpu", "threads": None,
                             "position": {"scaling": None}, "eval": defaults})
    o = OmegaConf.to_container(OmegaConf.merge(base, given), resolve=True)
    if not o["run_id"]:
        raise ConfigError(f"run_id=<MLflow run id> is required: python -m ablations.evaluate run_id=<id>")
    e = o["eval"]
    ctx = e["contexts"] if isinstance(e["contexts"], list) else [e["contexts"]]
    if not ctx or not all(is_int(c, 1) for c in ctx):
        raise ConfigError(f"eval.contexts={e['contexts']!r}: expected a list of integers >= 1, e.g. [64,128,256,512]")
    e["contexts"] = sorted(set(ctx))
    if e["mode"] not in MODES:
        raise ConfigError(f"eval.mode={e['mode']!r}: choose one of {', '.join(MODES)}")
    for key in ("stride", "max_tokens", "batch_size"):
        v = e[key]
        if v is not None and not is_int(v, 1):
            raise ConfigError(f"eval.{key}={v!r}: expected an integer >= 1" + (" or null" if key != "batch_size" else ""))
    if e["stride"] is not None and e["mode"] != "sliding":
        raise ConfigError(f"eval.stride={e['stride']} only applies to eval.mode=sliding: drop it or set the mode")
    if e["stride"] is not None and e["stride"] > min(e["contexts"]):
        raise ConfigError(f"eval.stride={e['stride']} exceeds the smallest context {min(e['contexts'])}: tokens "
                          f"would be skipped; use eval.stride <= {min(e['contexts'])}")
    return o


def scaling_label(scaling: dict | None) -> str:
    """`yarn4` for {name: yarn, factor: 4}; '' for none."""
    return "" if not scaling else f"{scaling['name']}{float(scaling['factor']):g}"


def metric_prefix(mode: str, scaling: dict | None) -> str:
    label = scaling_label(scaling)
    return f"eval/{mode}/{label}/" if label else f"eval/{mode}/"


# ------------------------------------------------------------------------------------------------ the command
def load_model(run_id: str, uri: str, scaling: dict | None):
    """-> (model, tokenizer, the run's recorded config), with position.scaling applied when given."""
    from modules.config import GPTConfig
    from modules.gpt import GPT

    from .errors import ConfigError
    from .generate import load_run
    from .rerun import fetch_config
    from .tracking import client

    model, tok, _ = load_run(run_id, uri)
    cfg, _ = fetch_config(client(uri), run_id, uri)
    if scaling is not None:
        mc = model.config.to_dict()
        if mc["position"]["name"] != "rope":
            raise ConfigError(f"position.scaling={scaling} needs a rope run; run {run_id} has "
                              f"position={mc['position']['name']}: drop position.scaling")
        mc["position"] = {**mc["position"], "scaling": scaling}
        scaled = GPT(GPTConfig.from_dict(mc))
        scaled.load_state_dict(model.state_dict())
        model = scaled.eval()
    return model, tok, cfg


def val_tokens(cfg, tok) -> tuple[torch.Tensor, float]:
    """-> (the run's validation split as int64 tokens, its tokens per UTF-8 byte)."""
    from .data import prepare_data
    from .errors import TokenizerError

    td = prepare_data(cfg.data, str(cfg.tokenizer.name))
    if td.tokenizer.hash != tok.hash:
        raise TokenizerError(f"the {tok.name} tokenizer of the corpus here (hash {td.tokenizer.hash[:12]}) differs "
                             f"from the run's ({tok.hash[:12]}): evaluate on the data the run was trained on")
    mm = td.memmap()
    return torch.from_numpy(mm[td.n_train:].astype("int64")), td.val_tokens_per_byte


def evaluate(o: dict, log=print) -> str | None:
    """Score, log into the run, print one line per context; -> the refusal line when contexts were refused."""
    from modules import accounting

    from .tracking import check_reachable, client, tracking_uri

    uri = o["tracking"]["uri"] or tracking_uri()  # else $MLFLOW_TRACKING_URI, else the default
    check_reachable(uri)
    if o["threads"]:
        torch.set_num_threads(int(o["threads"]))
    e, scaling = o["eval"], o["position"]["scaling"]
    model, tok, cfg = load_model(o["run_id"], uri, scaling)
    model.to(o["device"])
    scaling = model.config.position.scaling if scaling is not None else None  # with defaults filled in
    tokens, tokens_per_byte = val_tokens(cfg, tok)
    if e["max_tokens"] is not None:
        tokens = tokens[: e["max_tokens"] + 1]
    limit = model.config.variant("position").max_positions(model.config)
    ok = [c for c in e["contexts"] if limit is None or c <= limit]
    refused = [c for c in e["contexts"] if c not in ok]
    cl, prefix, mode = client(uri), metric_prefix(e["mode"], scaling), e["mode"]
    stride_tag = str(e["stride"]) if e["stride"] else "context//4"
    where = prefix.strip("/").replace("/", ".")  # eval.sliding or eval.sliding.yarn4: how these metrics were made
    cl.set_tag(o["run_id"], f"{where}.stride", stride_tag if mode == "sliding" else "context")
    cl.set_tag(o["run_id"], "eval.max_tokens", str(e["max_tokens"]))
    if scaling is not None:
        cl.set_tag(o["run_id"], f"eval.scaling.{scaling_label(scaling)}", json.dumps(scaling, sort_keys=True))
    for c in ok:
        t0 = time.perf_counter()
        nll, n = score(model, tokens, c, mode, e["stride"], e["batch_size"])
        loss = nll / n
        bpb = loss / math.log(2) * tokens_per_byte
        kv = accounting.kv_cache_bytes(model.config, seq_len=c)
        for name, value in (("bpb", bpb), ("loss", loss), ("tokens", n), ("kv_cache_bytes", kv)):
            cl.log_metric(o["run_id"], prefix + name, float(value), step=c)
        log(f"[evaluate] {prefix}bpb@{c} = {bpb:.4f} (loss {loss:.4f} nats/token, {n} tokens, "
            f"{time.perf_counter() - t0:.1f} s)")
    if not refused:
        return None
    name = model.config.position.name
    return (f"eval.contexts={refused} refused for run {o['run_id']}: position={name} has a table of {limit} "
            f"positions (block_size) and cannot go past it" + (f"; evaluated {ok}" if ok else "")
            + f"; use contexts <= {limit}")


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from modules.errors import AblationsError

    try:
        o = parse_args(sys.argv[1:] if argv is None else argv)
        refused = evaluate(o)
    except (AblationsError, ValueError) as e:  # ValueError: a bad position.scaling from the model config
        print(f"error: {e}", file=sys.stderr)
        return 2
    if refused:
        print(f"error: {refused}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
