"""Published findings the known-results report checks (analysis/known_results.py), typed from the papers as data.

One `Finding` per row of the report: the citation, the paper's setting, its number or direction with the table or
figure it comes from, the direction it implies for our comparison (`expected`: better / worse / equivalent: the
arm's loss against the baseline's), and where our number comes from (`source`):

- `protocol`: the verdict of `arm` against the baseline in the known-results protocol (conf/verdict/known-results.yaml);
- `lr-sensitivity`: the lr stage of that protocol, `arm` against the baseline: how many grid lrs land within the
  tolerance of each arm's best (Wortsman et al. 2023 measure sensitivity over the lr range);
- `extrapolation`: reports/extrapolation (context.csv): `arm`'s change in val bpb from the training context to 8x it;
- `lr-transfer`: reports/lr-transfer (its committed store): whether the best lr stayed put across width under μP.

A number here is the paper's, as printed; where a paper reports no number comparable to ours the row gives the
direction and the table or figure that shows it.
"""
from __future__ import annotations

from dataclasses import dataclass

BETTER, WORSE, EQUIVALENT = "better", "worse", "equivalent"


@dataclass(frozen=True)
class Finding:
    key: str
    citation: str
    paper_setting: str
    paper_result: str  # the paper's number or direction, with its table or figure
    expected: str  # better / worse / equivalent: the arm against the baseline, as the paper found
    source: str  # protocol | lr-sensitivity | extrapolation | lr-transfer
    arm: str  # the arm (protocol, lr-sensitivity), the position scheme (extrapolation), the optimizer (lr-transfer)


FINDINGS = (
    Finding("rope", "Su et al. 2021, RoFormer (arXiv:2104.09864); EleutherAI 2021, 'Rotary Embeddings: A Relative "
                    "Revolution' (blog)",
            "BERT-style and GPT-style pre-training, learned or sinusoidal absolute positions as the baseline",
            "rotary positions converge faster to a lower loss than absolute ones (RoFormer Fig. 3; EleutherAI's "
            "GPT-NeoX comparisons on OpenWebText2 and enwik8)", BETTER, "protocol", "rope"),
    Finding("rmsnorm", "Zhang & Sennrich 2019, Root Mean Square Layer Normalization (NeurIPS); Narang et al. 2021, "
                       "Do Transformer Modifications Transfer (EMNLP)",
            "RNN and Transformer NMT (Zhang & Sennrich); T5-base pre-training on C4 (Narang et al.)",
            "quality comparable to LayerNorm at 7-64% less running time (Zhang & Sennrich, abstract); a "
            "slightly lower pre-training loss than LayerNorm (Narang et al., Table 1)", EQUIVALENT, "protocol",
            "rmsnorm"),
    Finding("swiglu", "Shazeer 2020, GLU Variants Improve Transformer (arXiv:2002.05202)",
            "T5-base span-filling pre-training on C4, parameter- and FLOP-matched FFNs (d_ff 3072 -> 2048)",
            "held-out log-perplexity 1.944 against GELU's 1.983 at 65,536 steps, 1.636 against 1.679 at 524,288 "
            "(Table 1)", BETTER, "protocol", "swiglu"),
    Finding("geglu", "Shazeer 2020, GLU Variants Improve Transformer (arXiv:2002.05202)",
            "T5-base span-filling pre-training on C4, parameter- and FLOP-matched FFNs (d_ff 3072 -> 2048)",
            "held-out log-perplexity 1.942 against GELU's 1.983 at 65,536 steps, 1.633 against 1.679 at 524,288 "
            "(Table 1)", BETTER, "protocol", "geglu"),
    Finding("gqa", "Ainslie et al. 2023, GQA (EMNLP; arXiv:2305.13245)",
            "T5-XXL uptrained from multi-head checkpoints; summarization, translation and QA",
            "GQA-8 average 47.1 against multi-head's 47.2 at a fifth of its inference time (Table 1): quality kept "
            "with 8 KV heads", EQUIVALENT, "protocol", "gqa"),
    Finding("mqa", "Shazeer 2019, Fast Transformer Decoding: One Write-Head is All You Need (arXiv:1911.02150); "
                   "Ainslie et al. 2023 (arXiv:2305.13245)",
            "WMT14 EN-DE Transformer and a billion-word LM (Shazeer); T5-XXL uptrained (Ainslie et al.)",
            "a small quality loss for one KV head: average 46.6 against multi-head's 47.2 (Ainslie et al., "
            "Table 1); slightly worse perplexity and BLEU than multi-head (Shazeer, Table 1)", WORSE, "protocol",
            "mqa"),
    Finding("qknorm", "Wortsman et al. 2023, Small-scale proxies for large-scale Transformer training "
                      "instabilities (arXiv:2309.14322)",
            "decoder-only LMs of 9M-1.2B parameters on C4, lrs 3e-4 to 3e-1",
            "at its best lr qk-layernorm changes the final loss little (Fig. 1)", EQUIVALENT, "protocol", "qknorm"),
    Finding("qknorm-lr", "Wortsman et al. 2023, Small-scale proxies for large-scale Transformer training "
                         "instabilities (arXiv:2309.14322)",
            "decoder-only LMs of 9M-1.2B parameters on C4, lrs 3e-4 to 3e-1",
            "qk-layernorm lowers lr sensitivity: the final loss stays near the best over a wider range of lrs "
            "(Fig. 1; their 'LR sensitivity')", BETTER, "lr-sensitivity", "qknorm"),
    Finding("alibi", "Press et al. 2021, Train Short, Test Long: ALiBi (ICLR 2022; arXiv:2108.12409)",
            "WikiText-103 LMs trained at L = 512, evaluated at longer L (non-overlapping windows)",
            "perplexity keeps improving as the evaluation context grows past L (Fig. 1), where "
            "sinusoidal and rotary get worse", BETTER, "extrapolation", "alibi"),
    Finding("mup", "Yang et al. 2022, Tensor Programs V: μTransfer (arXiv:2203.03466)",
            "Transformers on WikiText-2 at widths 128-8192, Adam",
            "under μP the best lr stays put as the width grows (and wider is better), under SP it shifts (Fig. 1)",
            BETTER, "lr-transfer", "adamw"),
)
