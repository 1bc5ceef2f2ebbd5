"""Published findings the known-results report checks (analysis/known_results.py), typed from the papers as data.

One `Finding` per row of the report: the citation, the paper's setting, its number or direction with the table or
figure it comes from, the direction it implies for our comparison (`expected`: better / worse / equivalent: the
arm's loss against the baseline's), and where our number comes from (`source`):

- `protocol`: the verdict of `arm` against the baseline in the known-results protocol (conf/verdict/known-results.yaml);
- `lr-sensitivity`: the lr stage of that protocol, `arm` against the baseline: how many grid lrs land within the
  tolerance of each arm's best (Wortsman et al. 2023 measure sensitivity over the lr range);
- `extrapolation`: reports/extrapolation (context.csv): `arm`'s change in val bpb from the training context to 8x it;
- `lr-transfer`: reports/lr-transfer/480-steps (its committed store), judged by the three-part hypothesis stated
  before its runs (hypothesis.md there): lr transfer, μP no worse than tuned SP at the widest width, wider is better.

A number here is the paper's, as printed; where a paper reports no number comparable to ours the row gives the
direction and the table or figure that shows it. Every row was checked against the source text (2026-12-02; `checked`
says where: the paper's own text through an ar5iv/arXiv copy, or a public page quoting its table). A claim that could
not be found in a source says so inside `paper_result`, so the report shows it: "[not verified ...]".
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
    checked: str = ""  # where paper_setting and paper_result were checked against the source text


FINDINGS = (
    Finding("rope", "Su et al. 2021, RoFormer (arXiv:2104.09864); EleutherAI 2021, 'Rotary Embeddings: A Relative "
                    "Revolution' (blog) and its eval-harness follow-up",
            "RoFormer: BERT-base MLM on BookCorpus + Wikipedia, RoPE replacing BERT's position encoding (sec. 4.2), "
            "and a 12-layer char-level Performer LM on enwik8 with and without RoPE (sec. 4.4); EleutherAI: 1.3B "
            "GPT-style LMs on the Pile, 100k steps, rotary vs learned absolute positions",
            "faster convergence of the MLM loss than BERT (sec. 4.2.3, Fig. 3 left); with RoPE the Performer converges "
            "faster to a lower loss (sec. 4.4.2, Fig. 3 right); EleutherAI: LAMBADA ppl 7.156 rotary vs 7.940 learned, "
            "'not a very strong trend' over the other tasks [the blog post's own OpenWebText2/enwik8 runs: not "
            "verified against its text]", BETTER, "protocol", "rope",
            checked="RoFormer text sec. 4.2-4.4 and Fig. 3 caption; blog.eleuther.ai/rotary-embeddings-eval-harness "
                    "table; the main blog post's experiments only through a summary"),
    Finding("rmsnorm", "Zhang & Sennrich 2019, Root Mean Square Layer Normalization (NeurIPS); Narang et al. 2021, "
                       "Do Transformer Modifications Transfer (EMNLP)",
            "several tasks and architectures, LayerNorm as the baseline (Zhang & Sennrich); T5-base (223M) "
            "encoder-decoder pre-training, pre-LayerNorm baseline (Narang et al.)",
            "quality comparable to LayerNorm at 7-64% less running time (Zhang & Sennrich, abstract); pre-training "
            "loss 2.167 ± 0.008 early and 1.821 final against LayerNorm's 2.182 ± 0.005 and 1.838, 3.68 vs 3.50 "
            "steps/s (Narang et al., Table 1)", EQUIVALENT, "protocol", "rmsnorm",
            checked="Zhang & Sennrich abstract (NeurIPS page); Narang et al. Table 1 as quoted in course notes on "
                    "GitHub"),
    Finding("swiglu", "Shazeer 2020, GLU Variants Improve Transformer (arXiv:2002.05202)",
            "T5-base span-filling pre-training on C4, parameter- and FLOP-matched FFNs (d_ff 3072 -> 2048)",
            "held-out log-perplexity 1.944 (run std 0.010) against GELU's 1.983 (0.005) at 65,536 steps, 1.636 "
            "against 1.679 at 524,288 (Table 1)", BETTER, "protocol", "swiglu",
            checked="paper text (copies on GitHub): sec. 3.1-3.2 (C4, span filling, d_ff), Table 1; several "
                    "independent quotes of Table 1 agree"),
    Finding("geglu", "Shazeer 2020, GLU Variants Improve Transformer (arXiv:2002.05202)",
            "T5-base span-filling pre-training on C4, parameter- and FLOP-matched FFNs (d_ff 3072 -> 2048)",
            "held-out log-perplexity 1.942 (run std 0.004) against GELU's 1.983 (0.005) at 65,536 steps, 1.633 "
            "against 1.679 at 524,288 (Table 1)", BETTER, "protocol", "geglu",
            checked="as for swiglu"),
    Finding("gqa", "Ainslie et al. 2023, GQA (EMNLP; arXiv:2305.13245)",
            "T5-XXL uptrained from multi-head checkpoints with 5% of the pre-training compute, GQA/MQA in decoder "
            "self- and cross-attention; summarization (CNN/DM, arXiv, PubMed, MediaSum, MultiNews), WMT, TriviaQA",
            "GQA-8 average 47.1 against multi-head's 47.2, at 0.28 s against 1.51 s inference time per sample "
            "(Table 1): quality kept with 8 KV heads", EQUIVALENT, "protocol", "gqa",
            checked="abstract; Table 1 as quoted by several pages (all four rows agree)"),
    Finding("mqa", "Shazeer 2019, Fast Transformer Decoding: One Write-Head is All You Need (arXiv:1911.02150); "
                   "Ainslie et al. 2023 (arXiv:2305.13245)",
            "WMT14 EN-DE 6-layer encoder-decoder and a Billion-Word decoder LM, FFN widened to match parameters "
            "(Shazeer); T5-XXL uptrained (Ainslie et al.)",
            "a small quality loss for one KV head: dev ln(PPL) 1.439 vs 1.424 and dev BLEU 26.5 vs 26.7 (Shazeer, "
            "Table 1; test BLEU with beam 4 is 28.5 vs 28.4, the one column where it wins), Billion-Word dev "
            "perplexity 30.2 vs 29.9 (Shazeer, Table 3); average 46.6 against multi-head's 47.2 (Ainslie et al., "
            "Table 1)", WORSE, "protocol", "mqa",
            checked="Shazeer 2019 full text (ar5iv copy): sec. 4.1-4.2, Tables 1 and 3; Ainslie et al. Table 1 as for "
                    "gqa"),
    Finding("qknorm", "Wortsman et al. 2023, Small-scale proxies for large-scale Transformer training "
                      "instabilities (arXiv:2309.14322)",
            "pre-LN decoder-only LMs on C4 (RoPE, AdamW, 1e5 steps, batch 256 x 512) up to 1.2B non-embedding "
            "parameters, lrs {3e-4, 1e-3, ..., 3e-1} (sec. 2.1-2.2)",
            "qk-layernorm is their default; it lets models train to low loss at high lrs, e.g. 1.2B at lr 0.3 (sec. "
            "3.1.1) [that it leaves the loss at the best lr unchanged is read off Fig. 1's curves: not verified "
            "against the paper text, which gives no number for it]", EQUIVALENT, "protocol", "qknorm",
            checked="full text (ar5iv copy): sec. 2.1, 2.2, 3.1.1, Fig. 1 caption"),
    Finding("qknorm-lr", "Wortsman et al. 2023, Small-scale proxies for large-scale Transformer training "
                         "instabilities (arXiv:2309.14322)",
            "pre-LN decoder-only LMs on C4 (RoPE, AdamW, 1e5 steps, batch 256 x 512) up to 1.2B non-embedding "
            "parameters, lrs {3e-4, 1e-3, ..., 3e-1} (sec. 2.1-2.2)",
            "'Qk-layernorm reduces LR sensitivity, but LR sensitivity still increases with model scale' (Fig. 1); "
            "their LR sensitivity is the mean excess over the best loss across the 7 lrs (sec. 2.2), ours counts the "
            "lrs within the margin of the best", BETTER, "lr-sensitivity", "qknorm",
            checked="full text (ar5iv copy): sec. 2.2, 3.1.1, Fig. 1 caption"),
    Finding("alibi", "Press et al. 2021, Train Short, Test Long: ALiBi (ICLR 2022; arXiv:2108.12409)",
            "WikiText-103 LMs trained at L = 512 or 1024, evaluated at longer L with nonoverlapping windows (the "
            "paper's default, sec. 2)",
            "perplexity does not degrade past L where sinusoidal, rotary and T5 bias do (Fig. 1); it improves, "
            "19.73 at 512 to 18.40 at 3072 for L = 512 and 18.66 to 17.92 at 3024 for L = 1024 (Appendix Tables 2-3), "
            "peaking near 2L (sec. 1); the gain is mostly the early-token curse avoided: with a stride-1 sliding "
            "window it turns slightly worse, 17.98 to 18.3 (Appendix B, Table 15)", BETTER, "extrapolation",
            "alibi",
            checked="sec. 1-2 and Fig. 1 caption (paper text); Appendix Tables 2, 3, 15 as quoted by a page on GitHub"),
    Finding("mup", "Yang et al. 2022, Tensor Programs V: μTransfer (arXiv:2203.03466)",
            "post-LN Transformers on WikiText-2, 5 epochs, widths 128-8192, Adam, training loss",
            "under μP the best lr stays put as the width grows and the loss improves monotonically with width, under "
            "SP the optimum shifts and width-8192 underperforms μP even at its best lr (Fig. 1, sec. 3-5)", BETTER,
            "lr-transfer", "adamw",
            checked="full text: Fig. 1 caption and legend, sec. 3 (setup), sec. 4-5, footnote 11 (post-LN)"),
)


# arm -> the direction its paper found, for the findings the verdict protocol decides (the forest plot's marks)
EXPECTED = tuple((f.arm, f.expected) for f in FINDINGS if f.source == "protocol")
