"""The sizes of the ladder study (issue 37; docs/ladder.md, "Sizes"): for each width, the known-results model at that
width (4 layers, 4 heads, context 64, tinyshakespeare characters), its parameters and training FLOPs per token, the
tokens that keep the known-results study's tokens per parameter, the batch, steps and FLOP budget that spend them,
and the epochs of the train split that makes. Prints a Markdown table.

    python scripts/ladder_sizes.py --data /path/to/tinyshakespeare.txt --widths 32 48 64 96 128

The known-results rung is conf/verdict/known-results.yaml's size (its budget, the experiment's batch: 1,500 steps of
32 x 64 tokens at width 128); every other width trains the same tokens per parameter, with the largest batch of
--batches that still gives at least --min-steps optimizer steps.
"""
import argparse
from pathlib import Path

from omegaconf import OmegaConf

from ablations.budget import steps_for_budget, tokens_per_step
from ablations.compose import compose
from ablations.splits import split_docs
from modules import accounting

KNOWN = Path(__file__).resolve().parents[1] / "conf" / "verdict" / "known-results.yaml"


def model_config(vocab: int, overrides=()) -> tuple[dict, int]:
    """The known-results model (its experiment composed, the char vocabulary filled in) with `overrides`, and its
    batch size."""
    cfg = compose(["experiment=known-results", f"model.vocab_size={vocab}", *overrides])
    return OmegaConf.to_container(cfg.model, resolve=True), int(cfg.data.batch_size)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="tinyshakespeare's input.txt")
    parser.add_argument("--widths", type=int, nargs="+", default=[32, 48, 64, 96])
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 16, 8, 4])
    parser.add_argument("--min-steps", type=int, default=300)
    parser.add_argument("--hold", choices=["tokens-per-param", "tokens"], default="tokens-per-param")
    args = parser.parse_args(argv)
    text = Path(args.data).read_text(encoding="utf-8")
    train, _ = split_docs([("input.txt", text)], 0.1)  # the char tokenizer: one token per character
    n_train, vocab = sum(len(t) for t in train), len(set(text))
    size = OmegaConf.load(KNOWN).sizes[0]
    known, known_batch = model_config(vocab, size.overrides)
    block = known["block_size"]
    known_steps = steps_for_budget(float(size.budget_flops), known, known_batch)
    tpp = known_steps * tokens_per_step(known_batch, block) / accounting.param_counts(known)["params"]
    print(f"train split: {n_train:,} tokens (vocabulary {vocab}); known-results: {tpp:.4f} tokens per parameter\n")

    def row(width, n, fpt, batch, steps, budget):
        tokens = steps * tokens_per_step(batch, block)
        print(f"| {width} | {n:,} | {fpt:,} | {tokens:,} | {batch} | {steps:,} | {budget:.5g} | "
              f"{tokens / n_train:.2f} |")

    print("| width | params | FLOPs/token | tokens | batch | steps | budget_flops | epochs |")
    print("|---|---|---|---|---|---|---|---|")
    for w in args.widths:
        cfg, _ = model_config(vocab, [f"model.n_embd={w}"])
        n, fpt = accounting.param_counts(cfg)["params"], accounting.flops_per_token(cfg)
        if args.hold == "tokens":  # the known-results rung's batch and steps: the same tokens at every width
            batch, steps = known_batch, known_steps
        else:
            fits = [b for b in args.batches if tpp * n / tokens_per_step(b, block) >= args.min_steps]
            batch = fits[0] if fits else args.batches[-1]
            steps = round(tpp * n / tokens_per_step(batch, block))
        # half a step over the steps' FLOPs, at 5 digits: the harness's floor(budget / FLOPs per step) is `steps`
        budget = float(f"{(steps + 0.5) * tokens_per_step(batch, block) * fpt:.5g}")
        assert steps_for_budget(budget, cfg, batch) == steps, (w, budget, steps)
        row(w, n, fpt, batch, steps, budget)
    n, fpt = accounting.param_counts(known)["params"], accounting.flops_per_token(known)
    row(f"{known['n_embd']} (known-results)", n, fpt, known_batch, known_steps, float(size.budget_flops))


if __name__ == "__main__":
    main()
