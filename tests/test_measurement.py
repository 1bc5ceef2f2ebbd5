"""The measurement path against known answers: the train/val boundary of the token windows, val/bpb on a known text
with the gpt2 tokenizer, Welch's t-test and CI on a published worked example, and flops_per_token against
PyTorch's FlopCounterMode on the real model.

FLOP convention (modules.accounting.flops_per_token): training FLOPs per token = forward + backward of every matrix
multiply (2 FLOPs per multiply-add forward, 4 backward): all Linear layers including the lm_head (a matmul even when
tied to the embedding); embedding lookups, norms, biases, activations and softmax are not counted; attention
scores and values are charged 6 * n_layer * n_head * (d_qk + d_v) * T_att per token with T_att the full context
(no halving for the causal mask, as PaLM), or the window W for sliding attention: what a windowed kernel needs,
while a dense masked kernel still multiplies all T keys.
"""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from modules import accounting
from modules.config import GPTConfig
from modules.gpt import GPT

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------------- split boundary
def index_token_data(tmp_path, n_train, n_val):
    """A TokenData whose token at index i is i itself, so a batch shows exactly which indices it read."""
    from ablations.data import TokenData
    from ablations.tokenizers import ByteTokenizer

    path = tmp_path / "tokens.bin"
    np.arange(n_train + n_val, dtype=np.uint16).tofile(path)
    return TokenData(path, "uint16", n_train, n_val, n_val, "test", ByteTokenizer())


def read_indices(loader, limit=400):
    seen = []
    for i, (x, y) in enumerate(loader):
        assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one
        seen.append(torch.cat((x, y[:, -1:]), dim=1))  # the whole window of block_size + 1 tokens
        if i + 1 == limit:
            break
    return torch.cat(seen)


@pytest.mark.parametrize("n_train", [9, 11, 40])
def test_train_windows_end_exactly_at_the_last_train_token(tmp_path, n_train):
    """With block_size 8 a window holds 9 tokens; n_train=9 leaves exactly one possible window: all of train.
    No window may read index n_train (the first val token), and the last train token must be reachable."""
    from ablations.data import TokenDataModule

    dm = TokenDataModule(index_token_data(tmp_path, n_train, 30), block_size=8, batch_size=4, seed=0)
    w = read_indices(dm.train_dataloader())
    assert int(w.max()) == n_train - 1  # reaches the boundary, never crosses it
    assert int(w.min()) == 0


@pytest.mark.parametrize("n_val", [9, 10, 17, 37])
def test_val_windows_start_exactly_at_the_first_val_token(tmp_path, n_val):
    """Val windows are spread from the first val token to the last possible start; with n_val=10 there is room
    for one window only (start 0), so the last val token is not read, but none is read past the file."""
    from ablations.data import TokenDataModule

    n_train = 50
    dm = TokenDataModule(index_token_data(tmp_path, n_train, n_val), block_size=8, batch_size=3, seed=0,
                         val_windows=16)
    w = read_indices(dm.val_dataloader())
    assert int(w.min()) == n_train  # no train token, and the first val token is used
    assert int(w.max()) <= n_train + n_val - 1  # nothing past the file
    if n_val != 10:
        assert int(w.max()) == n_train + n_val - 1  # the last window ends at the last val token


# ------------------------------------------------------------------------------------------ val/bpb
# One document; val_fraction 0.1 cuts at the line break near 90% of the characters: the last line is the val
# split. It has 51 characters but 60 UTF-8 bytes (ï é è û are 2 bytes, — 3, € 3).
TRAIN_LINES = [f"line {i}: the quick brown fox jumps over the lazy dog..\n"[:50] + "\n" for i in range(9)]
VAL_TEXT = "Naïve café owners serve crème brûlée—twice, at 9€!\n"
VAL_BYTES = 60


@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory, train_here):
    import tiktoken

    tiktoken.get_encoding("gpt2")  # conftest points TIKTOKEN_CACHE_DIR at the shared BPE files
    cwd = tmp_path_factory.mktemp("bpb")
    corpus = cwd / "known.txt"
    corpus.write_text("".join(TRAIN_LINES) + VAL_TEXT, encoding="utf-8")
    args = {"model": "tiny", "model.block_size": 8, "model.n_embd": 16, "model.n_head": 2, "model.n_layer": 1,
            "data": "text", "data.path": str(corpus), "tokenizer": "gpt2", "data.batch_size": 2,
            "data.val_windows": 4, "trainer.max_steps": 2, "trainer.val_check_interval": 1,
            "trainer.log_every_n_steps": 1, "trainer.enable_progress_bar": "false", "generate.max_new_tokens": 2,
            "generate.bench_decode_tokens": 2, "generate.bench_prefill_tokens": 8,
            "tracking.uri": f"sqlite:///{cwd}/mlflow.db", "checkpoint.dir": str(cwd / "ckpt"),
            "data.cache_dir": str(cwd / "cache")}
    train_here(cwd, [f"{k}={v}" for k, v in args.items()])  # in process: the metrics, not the CLI, are under test
    return cwd


@pytest.mark.slow
def test_val_bpb_is_loss_in_bits_times_tokens_per_byte_of_the_val_text(gpt2_run):
    import tiktoken
    from mlflow import MlflowClient

    assert len(VAL_TEXT.encode("utf-8")) == VAL_BYTES
    n_tokens = len(tiktoken.get_encoding("gpt2").encode_ordinary(VAL_TEXT))
    assert n_tokens != VAL_BYTES and n_tokens != len(VAL_TEXT)  # tokens, characters and bytes all differ
    c = MlflowClient(tracking_uri=f"sqlite:///{gpt2_run}/mlflow.db")
    (run,) = c.search_runs([c.get_experiment_by_name("ablations").experiment_id])
    loss = {m.step: m.value for m in c.get_metric_history(run.info.run_id, "val/loss")}
    bpb = {m.step: m.value for m in c.get_metric_history(run.info.run_id, "val/bpb")}
    assert loss and set(loss) == set(bpb)
    for step, nats_per_token in loss.items():  # bits/byte = nats/token / ln 2 * tokens / bytes
        assert bpb[step] == pytest.approx(nats_per_token / math.log(2) * n_tokens / VAL_BYTES, rel=1e-9)
    assert run.data.metrics["final_val_bpb"] == pytest.approx(
        run.data.metrics["final_val_loss"] / math.log(2) * n_tokens / VAL_BYTES, rel=1e-9)


# ------------------------------------------------------------------------------------------ Welch
# A published worked example (R's t.test, Welch by default, quoted in the stats.stackexchange answer on Welch
# confidence intervals): ts1 = 11 9 10 11 10 12 9 11 12 9, ts2 = 11 13 10 13 12 9 11 12 12 11 ->
# t = -1.8325, df = 17.9, p-value = 0.08356, 95 percent confidence interval -2.1469104 0.1469104.
# By hand: means 10.4 and 11.4, variances 12.4/9 and 14.4/9, se = sqrt(0.29778) = 0.54569, t = -1/0.54569.
TS1 = [11, 9, 10, 11, 10, 12, 9, 11, 12, 9]
TS2 = [11, 13, 10, 13, 12, 9, 11, 12, 12, 11]


def test_welch_ci_and_p_value_match_the_worked_example():
    from analysis.stats import welch

    r = welch(TS1, TS2)
    assert r["delta"] == pytest.approx(-1.0, abs=1e-12)
    assert r["ci_low"] == pytest.approx(-2.1469104, abs=5e-7)
    assert r["ci_high"] == pytest.approx(0.1469104, abs=5e-7)
    assert r["p_value"] == pytest.approx(0.08356, abs=5e-6)
    assert r["df"] == pytest.approx(17.9, abs=0.05)
    assert r["verdict"] == "not significant"
    flipped = welch(TS2, TS1)  # the difference is signed: b's mean subtracted from a's
    assert flipped["ci_low"] == pytest.approx(-0.1469104, abs=5e-7)
    assert flipped["ci_high"] == pytest.approx(2.1469104, abs=5e-7)


# ------------------------------------------------------------------------------------------ FLOPs
FLOP_VARIANTS = {
    "gpt2": {},
    "gqa-swiglu-rope": dict(position="rope", mlp="swiglu", attention={"name": "gqa", "n_kv_head": 2}),
    "mla": dict(position="rope", attention={"name": "mla", "kv_latent_dim": 12, "rope_dim": 4}),
    "alibi-untied-bias": dict(position="alibi", tie_weights=False, bias=True),
    "mqa-qknorm-relu2": dict(attention="mqa", norm={"name": "rmsnorm", "qk_norm": True}, mlp="relu2"),
}


def counted_flops_per_token(model, B=2):
    """FlopCounterMode's count for one forward + backward, per token. SDPA runs on its math backend, which
    FlopCounterMode sees as two batched matmuls (the fused CPU kernel is not counted by torch's table)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    T, V = model.config.block_size, model.config.vocab_size
    x = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(0))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(x).view(-1, V), x.view(-1)).backward()
    return counter.get_total_flops() / (B * T)


@pytest.mark.parametrize("name", list(FLOP_VARIANTS))
def test_flops_per_token_equals_flop_counter_mode(name):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_embd=32, **FLOP_VARIANTS[name]))
    assert counted_flops_per_token(model) == accounting.flops_per_token(model.config)


def test_sliding_window_flops_charge_the_window_not_the_dense_kernel():
    """The formula charges W keys per query. The blocked sliding kernel (issue 12) multiplies each block of W queries
    with its own block of keys and the previous one (2W keys; W in the first block), not all T keys as a dense
    masked SDPA would: the counted difference is exactly the attention term for those extra keys, O(T * W)."""
    torch.manual_seed(0)
    L, nh, hs, T, W = 2, 4, 8, 32, 8
    model = GPT(GPTConfig(vocab_size=64, block_size=T, n_layer=L, n_head=nh, n_embd=nh * hs,
                          attention={"name": "sliding", "window": W}))
    keys_per_query = (W * W + (T // W - 1) * W * 2 * W) / T  # 14 here: 8 in the first block, 16 after
    extra = 6 * L * nh * 2 * hs * (keys_per_query - W)
    assert counted_flops_per_token(model) - accounting.flops_per_token(model.config) == extra
    assert extra < 6 * L * nh * 2 * hs * (T - W)  # less than a dense (T, T) kernel would add
