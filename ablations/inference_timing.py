"""Batch-1 inference timings (prefill, decode with and without the KV cache), shared by `train` (after training)
and `python -m ablations.bench`; sampling text is `ablations.generate`.

The timed forward calls are the ones `GPT.generate` makes: a prefill that fills a fresh KV cache, then one token
per step against it; "no cache" recomputes the whole context for every new token (generate(use_cache=False))."""
from __future__ import annotations

import time

import torch


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def prefill(model, prompt: torch.Tensor, cache_dtype) -> None:
    """One prefill as generate() does it: the whole prompt through the model, filling a fresh cache."""
    cache = model.new_cache(prompt.size(0), dtype=cache_dtype)
    model(prompt, attention_mask=torch.ones_like(prompt), cache=cache)


@torch.no_grad()
def decode_cached(model, prompt: torch.Tensor, new_tokens: int, cache_dtype, device) -> tuple[float, int, int]:
    """Prefill (untimed), then time new_tokens greedy decode steps against the cache
    -> (seconds per token, cache bytes after the prefill, cache bytes at the end)."""
    cache = model.new_cache(1, dtype=cache_dtype)
    one = torch.ones(1, 1, dtype=torch.long, device=prompt.device)
    logits = model(prompt, attention_mask=torch.ones_like(prompt), cache=cache)
    nbytes = int(cache.nbytes)
    nxt = logits[:, -1, :].float().argmax(dim=-1, keepdim=True)  # (1, 1)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(new_tokens):
        logits = model(nxt, attention_mask=one, cache=cache)
        nxt = logits[:, -1, :].float().argmax(dim=-1, keepdim=True)
    sync(device)
    return (time.perf_counter() - t0) / new_tokens, nbytes, int(cache.nbytes)


@torch.no_grad()
def decode_uncached(model, prompt: torch.Tensor, max_tokens: int, seconds: float, device) -> float:
    """Decode by recomputing the whole context each token -> seconds per token (the best one). Stops after
    max_tokens or once `seconds` are spent (at least 2 tokens): at long contexts each token is a full prefill."""
    idx = prompt
    mask = torch.ones_like(idx)
    times = []
    for _ in range(max_tokens):
        sync(device)
        t0 = time.perf_counter()
        logits = model(idx, attention_mask=mask)
        nxt = logits[:, -1, :].float().argmax(dim=-1, keepdim=True)
        sync(device)
        times.append(time.perf_counter() - t0)
        idx = torch.cat((idx, nxt), dim=1)
        mask = torch.cat((mask, torch.ones_like(nxt)), dim=1)
        if len(times) >= 2 and sum(times) >= seconds:
            break
    return min(times)


@torch.no_grad()
def generation_benchmark(model, prompt: torch.Tensor, decode_tokens: int, prefill_tokens: int,
                         autocast_dtype=None, cache_dtype=None, rounds: int = 3) -> dict:
    """Batch-1 prefill tokens/sec, cached and uncached decode tokens/sec (best of `rounds`: the machine may be
    shared), and the cache bytes measured once the context is full. `prompt` is (1, >= block_size) token ids."""
    model.eval()
    dev = next(model.parameters()).device
    T = model.config.block_size
    n_new = max(1, min(int(decode_tokens), T // 2))
    n_pre = max(1, min(int(prefill_tokens), T))
    ctx = (torch.autocast(dev.type, dtype=autocast_dtype) if autocast_dtype is not None
           else torch.autocast(dev.type, enabled=False))
    x = prompt[:, :n_pre].to(dev)  # (1, n_pre)
    p = prompt[:, :max(1, T - n_new)].to(dev)  # (1, T - n_new): decoding n_new tokens fills the context
    with ctx:
        prefill(model, x, cache_dtype)  # warm-up
        best_prefill, best_decode, best_nocache, nbytes = float("inf"), float("inf"), float("inf"), 0
        for _ in range(rounds):
            t0 = time.perf_counter()
            prefill(model, x, cache_dtype)
            sync(dev)
            best_prefill = min(best_prefill, time.perf_counter() - t0)
            sec, _, nbytes = decode_cached(model, p, n_new, cache_dtype, dev)
            best_decode = min(best_decode, sec)
            best_nocache = min(best_nocache, decode_uncached(model, p, n_new, float("inf"), dev))
    return {"prefill_tokens_per_sec": x.size(1) / best_prefill, "decode_tokens_per_sec": 1 / best_decode,
            "decode_tokens_per_sec_nocache": 1 / best_nocache, "kv_cache_bytes_measured": nbytes}
