"""Sample from a recorded run: `python -m ablations.generate run_id=<id> prompt="..." [options]`.

Options (key=value): temperature=0.8 top_k=50 top_p=null max_new_tokens=200 seed=0 num_samples=1
tokenizer=<byte|char|gpt2> (refused unless it is the run's tokenizer) tracking.uri=<uri> (else $MLFLOW_TRACKING_URI,
else sqlite:///mlflow.db). The run's `checkpoints/final.ckpt` artifact is loaded with weights_only=True; its recorded
tokenizer must match the run's `tokenizer_hash` tag and the tokenizer rebuilt here.
"""
from __future__ import annotations

import os
import sys
import tempfile

from .cli import Command, Option
from .compose import CONF_DIR

# prompt, temperature, top_k, top_p, max_new_tokens: the `generate:` block of conf/config.yaml (also what a training
# run samples its sample.txt with); the rest are this command's own.
_CONF = CONF_DIR / "config.yaml"
SAMPLING = ("prompt", "temperature", "top_k", "top_p", "max_new_tokens")


def defaults() -> dict:
    from omegaconf import OmegaConf

    g = OmegaConf.load(_CONF).generate
    return {"run_id": None, **{k: g[k] for k in SAMPLING}, "seed": 0, "num_samples": 1, "tokenizer": None,
            "tracking.uri": None, "device": "cpu"}


HELPS = {"run_id": "the MLflow run to sample from (ablations.run's summary line prints it)",
         "prompt": "the text the samples continue (\\n for a newline)", "temperature": "0: greedy",
         "top_k": "sample among the k likeliest tokens (null: all)", "top_p": "nucleus sampling (null: off)",
         "max_new_tokens": "tokens per sample", "seed": "the sampling RNG seed", "num_samples": "samples to print",
         "tokenizer": "byte | char | gpt2: refused unless it is the run's tokenizer",
         "tracking.uri": "the store (default $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)", "device": "cpu | cuda"}


# the defaults: conf/config.yaml's generate: block
COMMAND = Command("ablations.generate", 'run_id=<id> [prompt="..."] [key=value ...]', __doc__.split("\n\n")[0],
                  options=tuple(Option(k, HELPS[k], v, str) for k, v in defaults().items()),
                  examples=('run_id=<id> prompt="ROMEO:" temperature=0.5 num_samples=3',))


def parse_args(argv: list[str]) -> dict:
    from .errors import ConfigError

    opts, _ = COMMAND.parse_or_help(argv)
    if not opts["run_id"]:
        raise ConfigError("run_id=<MLflow run id> is required (the summary line of ablations.run prints it)")

    def num(key, cast, lo=None, hi=None):
        v = opts[key]
        if v is None or (isinstance(v, str) and v.lower() in ("null", "none", "")):
            return None
        try:
            v = cast(v)
        except ValueError:
            raise ConfigError(f"{key}={opts[key]!r} is not a {cast.__name__}") from None
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise ConfigError(f"{key}={v} is out of range [{lo}, {hi if hi is not None else 'inf'}]")
        return v

    opts["temperature"] = num("temperature", float, 0.0) or 0.0
    opts["top_k"] = num("top_k", int, 1)
    opts["top_p"] = num("top_p", float, 0.0, 1.0)
    opts["max_new_tokens"] = num("max_new_tokens", int, 1) or 1
    opts["seed"] = num("seed", int, 0) or 0
    opts["num_samples"] = num("num_samples", int, 1) or 1
    opts["prompt"] = opts["prompt"].replace("\\n", "\n")  # prompt="ROMEO:\n" from a shell
    return opts


def load_run(run_id: str, uri: str, tokenizer_name: str | None = None):
    """-> (model, tokenizer, checkpoint dict) of an MLflow run, refusing a tokenizer mismatch."""
    from mlflow.exceptions import MlflowException

    from modules.config import GPTConfig
    from modules.gpt import GPT

    from .errors import CheckpointError, TokenizerError
    from .tokenizers import tokenizer_from_identity
    from .tracking import check_reachable, client, get_run
    from .checkpoints import load_final_checkpoint

    check_reachable(uri)
    cl = client(uri)
    run = get_run(cl, run_id, uri)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = cl.download_artifacts(run_id, "checkpoints/final.ckpt", tmp)
        except (MlflowException, OSError):  # no such artifact
            raise CheckpointError(f"run {run_id} has no checkpoints/final.ckpt artifact (status "
                                  f"{run.info.status}): only finished runs can be sampled") from None
        ck = load_final_checkpoint(path)
    ident = ck["tokenizer"]
    if tokenizer_name and tokenizer_name != ident.get("name"):
        raise TokenizerError(f"tokenizer={tokenizer_name} does not match the checkpoint's tokenizer "
                             f"{ident.get('name')!r}: drop tokenizer= or pass tokenizer={ident.get('name')}")
    tag = run.data.tags.get("tokenizer_hash")
    if tag and tag != ck.get("tokenizer_hash"):
        raise TokenizerError(f"checkpoint tokenizer hash {str(ck.get('tokenizer_hash'))[:12]} does not match the "
                             f"run's tokenizer_hash tag {tag[:12]}: the artifact is not this run's")
    tok = tokenizer_from_identity(ident)
    if tok.hash != ck.get("tokenizer_hash"):
        raise TokenizerError(f"the {tok.name} tokenizer here (hash {tok.hash[:12]}) differs from the checkpoint's "
                             f"({str(ck.get('tokenizer_hash'))[:12]}): use the tokenizer files the run used")
    try:
        model = GPT(GPTConfig.from_dict(ck["model_config"]))
        model.load_state_dict(ck["state_dict"])
    except (RuntimeError, ValueError, TypeError) as e:  # shape/key mismatch, an invalid or unknown config field
        raise CheckpointError(f"run {run_id}: the checkpoint does not load into modules.gpt.GPT "
                              f"({str(e).splitlines()[0][:160]})") from None
    return model.eval(), tok, ck


def sample(model, ids: list[int], max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None,
           seed: int, num_samples: int = 1, autocast_dtype=None) -> list[list[int]]:
    """`num_samples` continuations of the token ids `ids` (its last block_size), on the model's device, seeded."""
    import torch

    dev = next(model.parameters()).device
    x = torch.tensor([ids[-model.config.block_size:]] * num_samples, dtype=torch.long, device=dev)
    gen = torch.Generator(device=dev).manual_seed(seed)
    ctx = (torch.autocast(dev.type, dtype=autocast_dtype) if autocast_dtype is not None
           else torch.autocast(dev.type, enabled=False))
    with torch.no_grad(), ctx:
        out = model.generate(x, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, generator=gen)
    return out.tolist()


def sample_text(model, tok, g, autocast_dtype, seed: int) -> str:
    """A training run's `sample.txt`: `g.max_new_tokens` tokens after `g.prompt` (the config's `generate:` block)."""
    from .errors import TokenizerError

    try:
        ids = tok.encode(str(g.prompt)) or [tok.sep_id or 0]
    except TokenizerError:  # a char tokenizer without the prompt's characters
        ids = [tok.sep_id or 0]
    (row,) = sample(model, ids, int(g.max_new_tokens), float(g.temperature),
                    int(g.top_k) if g.get("top_k") else None, float(g.top_p) if g.get("top_p") else None, seed,
                    autocast_dtype=autocast_dtype)
    return tok.decode(row)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from .errors import AblationsError

    try:
        from .tracking import tracking_uri

        o = parse_args(sys.argv[1:] if argv is None else argv)
        uri = o["tracking.uri"] or tracking_uri()  # else $MLFLOW_TRACKING_URI, else the default
        model, tok, _ = load_run(o["run_id"], uri, o["tokenizer"])
        model.to(o["device"])
        ids = tok.encode(o["prompt"]) or [tok.sep_id or 0]
        out = sample(model, ids, o["max_new_tokens"], o["temperature"], o["top_k"], o["top_p"], o["seed"],
                     o["num_samples"])
    except AblationsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for i, row in enumerate(out):
        if o["num_samples"] > 1:
            print(f"--- sample {i}")
        print(tok.decode(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
