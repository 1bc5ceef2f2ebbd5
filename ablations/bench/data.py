"""Section `data`: how fast corpora are prepared and read, and that memory does not grow with the corpus.

On corpora generated here (English-like prose: words drawn by their frequency in the standard library's comments
and docstrings, in sentences and paragraphs, ~3 KB documents, written as parquet shards like FineWeb-edu's):

- prepare (section `prepare`): `python -m ablations.prepare` end to end, a process of its own from launch to exit
  (parquet -> gpt2 shards with checksums and manifest, `num_proc` = the threads), in MB of text (and tokens) per
  second, against tiktoken's own `encode_ordinary_batch` with the same number of threads on the same texts already
  in memory (the physical reference: it only encodes), and tiktoken's `encode_ordinary` in one thread (the rate of
  one core); with how much of prepare's time was start-up (its last line). Target >= 0.8x. Rounds alternate them;
  the best of each is kept. 32 MB of text (--quick: 16 MB).
- loader: tokens/sec of the training loader (`TokenDataModule`, windows of gpt2-124m's 1024 + 1 tokens across
  shards) against tokens/sec of one gpt2-124m training step (forward, backward, AdamW) on this device. Target >= 20x.
- resume (section `prepare-resume`): `python -m ablations.prepare` killed (kill -9) once ~60% of its train shards are
  written, then re-run: the re-run's seconds as a fraction of an uninterrupted prepare's, end to end (start-up
  included) and for the tokenizing pass alone (prepare's last line), and that the shards come out the same (64 MB
  of text, --quick: 16 MB, in shards of 300k tokens).
- memory: peak memory of `python -m ablations.prepare` and of a short `python -m ablations.run` (model=tiny, 40
  steps) on a corpus of ~100 MB and on one of ~1 GB (--quick: 10 MB and 100 MB), sampled every 0.25 s over the process tree: PSS (every
  page, shared ones split between the processes that map them) and private anonymous memory (RSS minus file-backed
  and shared pages). The peak must not grow with the corpus.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from ablations.compose import CONF_DIR, compose
from ablations.prepare import prepare

from .core import Bench, Figures, Section, fmt, model_dict, section
from .timing import best_time, ratio_summary
from .train import BareTrainer

REPO = CONF_DIR.parent
DOC_BYTES = 3000


# -------------------------------------------------------------------------------------------- the corpus
def word_table(max_files: int = 400) -> tuple[list[str], np.ndarray]:
    """(words, probabilities) of lowercase words in the standard library's text (a fixed, offline sample)."""
    counts: dict[str, int] = {}
    base = Path(sysconfig.get_paths()["stdlib"])
    for p in sorted(base.glob("*.py"))[:max_files]:
        for w in re.findall(r"[a-z]{2,14}", p.read_text(encoding="utf-8", errors="ignore")):
            counts[w] = counts.get(w, 0) + 1
    words = sorted(counts, key=lambda w: (-counts[w], w))[:20000]
    freq = np.array([counts[w] for w in words], dtype=np.float64)
    return words, freq / freq.sum()


def documents(total_bytes: int, seed: int = 0):
    """English-like documents of ~DOC_BYTES bytes until `total_bytes` (deterministic in seed)."""
    words, p = word_table()
    rng = np.random.default_rng(seed)
    made = 0
    while made < total_bytes:
        ids = rng.choice(len(words), size=DOC_BYTES // 6, p=p)
        lens = rng.integers(6, 24, size=len(ids) // 6 + 1)
        sentences, i = [], 0
        for n in lens:
            chunk = [words[k] for k in ids[i:i + n]]
            if not chunk:
                break
            sentences.append(" ".join(chunk).capitalize() + rng.choice([".", ".", ".", "?", "!", ","]))
            i += n
        paras = [" ".join(sentences[j:j + 5]) for j in range(0, len(sentences), 5)]
        doc = "\n\n".join(paras)
        made += len(doc)
        yield doc


def write_corpus(folder: Path, total_bytes: int, seed: int = 0, file_bytes: int = 64 << 20) -> int:
    """Parquet files of ~file_bytes of text each (row groups of 1,000 documents), -> documents written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    k, n, rows, size, writer = 0, 0, [], 0, None
    for doc in documents(total_bytes, seed):
        rows.append(doc)
        size += len(doc)
        n += 1
        if len(rows) == 1000:
            if writer is None:
                writer = pq.ParquetWriter(folder / f"train-{k:05d}.parquet", pa.schema([("text", pa.string())]))
            writer.write_table(pa.table({"text": rows}))
            rows = []
            if size >= file_bytes:
                writer.close()
                writer, size, k = None, 0, k + 1
    if rows:
        writer = writer or pq.ParquetWriter(folder / f"train-{k:05d}.parquet", pa.schema([("text", pa.string())]))
        writer.write_table(pa.table({"text": rows}))
    if writer is not None:
        writer.close()
    return n


def hf_overrides(folder: Path, cache: Path, num_proc: int, shards: Path | None = None) -> list[str]:
    out = ["data=hf", f"data.path={folder}", "data.streaming=true", f"data.num_proc={num_proc}",
           f"data.cache_dir={cache}", "tokenizer=gpt2"]
    return out + ([f"data.shards_dir={shards}"] if shards else [])


# ------------------------------------------------------------------------------------------ measurements
def prepare_vs_tiktoken(folder: Path, work: Path, threads: int, rounds: int, log) -> dict:
    """MB/s of `python -m ablations.prepare` (end to end: its own process, launch to exit) and of tiktoken's batch
    encoder on the same texts, best of rounds, the two in alternating order, and their ratio per round (geometric
    mean, 95% interval: timing.ratio_summary); with the start-up seconds prepare's last line reports and
    the CPU seconds of each (less moved by other jobs' load than wall time)."""
    import resource


    import pyarrow.parquet as pq

    from ablations.tokenizers import load_tiktoken_gpt2

    def cpu(who: int) -> float:
        use = resource.getrusage(who)
        return use.ru_utime + use.ru_stime

    texts = [t for f in sorted(folder.glob("*.parquet")) for t in pq.read_table(f).column("text").to_pylist()]
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    enc = load_tiktoken_gpt2()
    one = texts[:max(1, len(texts) // threads)]
    one_mb = sum(len(t.encode("utf-8")) for t in one) / 1e6
    got = {k: [] for k in ("prepare", "prepare_startup_sec", "prepare_cpu_sec", "tiktoken_batch",
                           "tiktoken_batch_cpu_sec", "tiktoken_one")}
    shards = None

    def ours(r):
        nonlocal shards
        if shards is not None:
            shutil.rmtree(shards)
        shards, c0, t0 = work / f"shards-{r}", cpu(resource.RUSAGE_CHILDREN), time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "ablations.prepare",
                              *hf_overrides(folder, work / "cache", threads, shards)],
                             cwd=work, env=_child_env(), capture_output=True, text=True)
        got["prepare"].append(mb / (time.perf_counter() - t0))
        got["prepare_cpu_sec"].append(cpu(resource.RUSAGE_CHILDREN) - c0)
        if out.returncode:
            raise RuntimeError(f"prepare failed: {out.stderr.strip().splitlines()[-1:]}")
        got["prepare_startup_sec"].append(float(re.search(r"([0-9.]+) s \([0-9]+%\) of it start-up",
                                                          out.stdout).group(1)))

    def theirs(r):
        c0, t0 = cpu(resource.RUSAGE_SELF), time.perf_counter()
        enc.encode_ordinary_batch(texts, num_threads=threads)
        got["tiktoken_batch"].append(mb / (time.perf_counter() - t0))
        got["tiktoken_batch_cpu_sec"].append(cpu(resource.RUSAGE_SELF) - c0)

    for r in range(rounds):
        for run in ((ours, theirs) if r % 2 == 0 else (theirs, ours)):
            run(r)
        t0 = time.perf_counter()
        for t in one:
            enc.encode_ordinary(t)
        got["tiktoken_one"].append(one_mb / (time.perf_counter() - t0))
        log(f"data: round {r + 1}: prepare {got['prepare'][-1]:.2f} MB/s end to end "
            f"({got['prepare_startup_sec'][-1]:.1f} s start-up, {got['prepare_cpu_sec'][-1]:.1f} s CPU), tiktoken "
            f"batch {got['tiktoken_batch'][-1]:.2f} MB/s ({got['tiktoken_batch_cpu_sec'][-1]:.1f} s CPU), tiktoken "
            f"one thread {got['tiktoken_one'][-1]:.2f} MB/s")
    m = json.loads((shards / "manifest.json").read_text())
    tokens = m["splits"]["train"]["tokens"] + m["splits"]["val"]["tokens"]
    best = got["prepare"].index(max(got["prepare"]))
    return {"text_mb": mb, "documents": len(texts), "tokens": tokens, "processes": threads,
            "prepare_mb_per_sec": max(got["prepare"]), "prepare_tokens_per_sec": max(got["prepare"]) * tokens / mb,
            "prepare_startup_sec": got["prepare_startup_sec"][best], "prepare_sec": mb / max(got["prepare"]),
            "tiktoken_batch_mb_per_sec": max(got["tiktoken_batch"]),
            "tiktoken_one_thread_mb_per_sec": max(got["tiktoken_one"]),
            "ratio": max(got["prepare"]) / max(got["tiktoken_batch"]),
            "cpu_ratio": min(got["tiktoken_batch_cpu_sec"]) / min(got["prepare_cpu_sec"]),
            "per_round": ratio_summary(got["tiktoken_batch"], got["prepare"]), "rounds": got, "shards": str(shards)}


def _child_env() -> dict:
    """This checkout first on the path of a child `python -m ablations...`, one thread per process (as users run
    it)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1"}


def loader_vs_step(shards: Path, device: str, steps: int, log) -> dict:
    """Training loader tokens/s against one gpt2-124m training step's tokens/s."""
    import torch
    from omegaconf import OmegaConf

    from ablations.data import TokenDataModule, open_shards
    from ablations.shards import read_manifest
    from ablations.tokenizers import build_tokenizer

    cfg = compose(["model=gpt2-124m", "tokenizer=gpt2"])
    model_cfg = model_dict(cfg)
    block = int(model_cfg["block_size"])
    td = open_shards(shards, read_manifest(shards), build_tokenizer("gpt2"))
    dm = TokenDataModule(td, block, int(cfg.data.batch_size), seed=0)
    it = iter(dm.train_dataloader())
    next(it)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 3.0:
        x, _ = next(it)
        n += x.numel()
    loader = n / (time.perf_counter() - t0)
    batch = 1 if device == "cpu" else int(cfg.data.batch_size)  # a 124M step on CPU: one sequence is seconds
    x, y = next(it)
    windows = torch.cat((x[:batch], y[:batch, -1:]), dim=1)[None]  # (1, B, T+1): a real batch of the loader
    trainer = BareTrainer(model_cfg, windows, "32-true", False, OmegaConf.to_container(cfg.optim), device)
    step = batch * block / best_time(trainer.step, steps, device)  # after one untimed warm-up step
    log(f"data: gpt2-124m training step: {step:,.0f} tokens/s")
    return {"loader_tokens_per_sec": loader, "step_tokens_per_sec": step, "ratio": loader / step,
            "step_batch": batch, "loader_batch": int(cfg.data.batch_size), "block_size": block}


def peak_memory(cmd: list[str], cwd: Path) -> dict:
    """Run `cmd`; -> its wall time and the peak PSS and private anonymous bytes of its process tree."""
    import psutil

    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=_child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = {"pss": 0, "anon": 0, "main_rss": 0}

    def sample():
        root = psutil.Process(proc.pid)
        while proc.poll() is None:
            pss = anon = 0
            with contextlib.suppress(psutil.Error):
                for p in [root, *root.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        mi = p.memory_info()
                        anon += mi.rss - mi.shared
                        pss += p.memory_full_info().pss
                peak["main_rss"] = max(peak["main_rss"], root.memory_info().rss)
            peak["pss"], peak["anon"] = max(peak["pss"], pss), max(peak["anon"], anon)
            time.sleep(0.25)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, err = proc.communicate()
    th.join()
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed: {err.strip().splitlines()[-1] if err.strip() else ''}")
    return {**peak, "wall_sec": time.perf_counter() - t0}


def resume_after_kill(folder: Path, work: Path, threads: int, shard_tokens: int, log) -> dict:
    """Wall seconds of an uninterrupted `python -m ablations.prepare` and of its re-run after a kill -9 once ~60% of
    its train shards are written."""
    env = _child_env()

    def cmd(cache):
        return [sys.executable, "-m", "ablations.prepare", *hf_overrides(folder, cache, threads),
                f"data.shard_tokens={shard_tokens}"]

    def timed(cache):
        t0 = time.perf_counter()
        r = subprocess.run(cmd(cache), cwd=work, env=env, capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"prepare failed: {r.stderr.strip().splitlines()[-1:]}")
        return time.perf_counter() - t0, r.stdout, json.loads(next(cache.glob("tokens/*/manifest.json")).read_text())

    whole, first, ref = timed(work / "whole")
    n = {s: len(ref["splits"][s]["shards"]) for s in ("train", "val")}
    cache = work / "killed"
    p = subprocess.Popen(cmd(cache), cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while p.poll() is None and len(list(cache.glob("tokens/*/train-*.bin"))) < 0.6 * n["train"]:
        time.sleep(0.01)
    p.kill()  # SIGKILL
    p.wait()
    at = {s: len(list(cache.glob(f"tokens/*/{s}-*.bin"))) for s in n}
    time.sleep(1.0)  # its workers notice the parent is gone (they poll every 0.5 s) and exit
    rerun, out, m = timed(cache)
    passes = [float(re.search(r"shards \| ([0-9.]+) s", o).group(1)) for o in (first, out)]  # the pass alone
    log(f"data: prepare {whole:.1f} s; killed after {at['train']}/{n['train']} train and {at['val']}/{n['val']} val "
        f"shards; re-run {rerun:.1f} s = {rerun / whole:.2f} of the whole (tokenizing pass {passes[1]:.1f} of "
        f"{passes[0]:.1f} s)")
    return {"whole_sec": whole, "rerun_sec": rerun, "fraction": rerun / whole, "pass_sec": passes[0],
            "rerun_pass_sec": passes[1], "pass_fraction": passes[1] / passes[0], "shards": n, "killed_at": at,
            "resumed": "resuming after" in out, "same_shards": m["splits"] == ref["splits"],
            "shard_tokens": shard_tokens, "processes": threads}


def memory_flat(work: Path, sizes: tuple[int, int], threads: int, log) -> dict:
    """Peak memory of prepare and of a short training run, on a small and a 10x larger generated corpus."""
    out = {}
    for size in sizes:
        folder, cache, tag = work / f"corpus-{size >> 20}MB", work / f"cache-{size >> 20}MB", f"{size >> 20}MB"
        log(f"data: generating a {tag} corpus")
        t0 = time.perf_counter()
        docs = write_corpus(folder, size, seed=size)
        log(f"data: {docs:,} documents in {time.perf_counter() - t0:.0f} s; preparing it")
        prep = peak_memory([sys.executable, "-m", "ablations.prepare", *hf_overrides(folder, cache, threads)], work)
        log(f"data: prepared {tag} in {prep['wall_sec']:.0f} s; training on it")
        train = peak_memory([sys.executable, "-m", "ablations.run", *hf_overrides(folder, cache, threads),
                             "model=tiny", "data.batch_size=32", "trainer.max_steps=40", "trainer.val_check_interval=20",
                             "data.val_windows=32",
                             "trainer.enable_progress_bar=false", "threads=1", f"tracking.uri=sqlite:///{work}/mlflow.db",
                             f"checkpoint.dir={work}/ckpt-{tag}", "generate.max_new_tokens=4",
                             "generate.bench_decode_tokens=4"], work)
        text_mb = size / 1e6
        m = json.loads(next((cache / "tokens").glob("*/manifest.json")).read_text())
        tokens = m["splits"]["train"]["tokens"] + m["splits"]["val"]["tokens"]
        out[tag] = {"text_mb": text_mb, "documents": docs, "tokens": tokens, "prepare": prep, "train": train,
                    "prepare_mb_per_sec": text_mb / prep["wall_sec"], "prepare_tokens_per_sec": tokens / prep["wall_sec"]}
        shutil.rmtree(folder)
        shutil.rmtree(cache)
    return out


def _threads(bench: Bench) -> int:
    return bench.opts.threads or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                  else os.cpu_count() or 1)


@section
class Data(Section):
    name, order = "data", 80

    def run(self, bench: Bench, rates: dict[str, dict], earlier: dict) -> Figures:
        import torch

        threads = _threads(bench)
        quick = bench.opts.quick
        work = Path(tempfile.mkdtemp(prefix="ablations-bench-data-"))
        try:
            corpus = work / "tokenize"
            write_corpus(corpus, (16 if quick else 32) << 20)
            with contextlib.redirect_stdout(sys.stderr):  # prepare's lines are the bench's log
                shards, _, _ = prepare(compose(hf_overrides(corpus, work / "cache", threads, work / "shards")).data,
                                       "gpt2", verify=False)
            nthreads = torch.get_num_threads()
            load = loader_vs_step(shards, bench.device, bench.opts.steps or 2, bench.log)
            torch.set_num_threads(nthreads)
            sizes = (10 << 20, 100 << 20) if quick else (100 << 20, 1000 << 20)
            mem = memory_flat(work, sizes, threads, bench.log)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        small, large = mem.values()
        gib = 2**30

        def peaks(which):
            return (f"PSS {small[which]['pss'] / gib:.2f} -> {large[which]['pss'] / gib:.2f} GiB, private "
                    f"{small[which]['anon'] / gib:.2f} -> {large[which]['anon'] / gib:.2f} GiB "
                    f"(x{large[which]['pss'] / small[which]['pss']:.2f} for x{large['text_mb'] / small['text_mb']:.0f}"
                    f" the text)")

        sm, lg = list(mem)
        rows = [("data: loader vs gpt2-124m training step",
                 f"{fmt(load['loader_tokens_per_sec'], 'tokens/s')} vs {fmt(load['step_tokens_per_sec'], 'tokens/s')}"
                 f" = {load['ratio']:,.0f}x (target >= 20x; >= 20x for any device training at up to "
                 f"{fmt(load['loader_tokens_per_sec'] / 20, 'tokens/s')})"),
                (f"data: peak memory, prepare {sm} -> {lg}", peaks("prepare")),
                (f"data: peak memory, train {sm} -> {lg}", peaks("train")),
                (f"data: prepare rate, {lg} corpus", f"{large['prepare_mb_per_sec']:.2f} MB/s = "
                 f"{fmt(large['prepare_tokens_per_sec'], 'tokens/s')} end to end, `python -m ablations.prepare` "
                 f"({large['prepare']['wall_sec']:.0f} s, {threads} processes, {large['tokens']:,} tokens)")]
        return Figures({"data": {"loader": load, "memory": mem}}, rows)


def on_generated_corpus(megabytes: int, measure):
    """measure(corpus folder, work folder) on a corpus of `megabytes` MB of text generated in a temporary folder,
    removed after -> what measure returns."""
    work = Path(tempfile.mkdtemp(prefix="ablations-bench-data-"))
    try:
        write_corpus(work / "corpus", megabytes << 20)
        return measure(work / "corpus", work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@section
class Prepare(Section):
    name, order = "prepare", 79

    def run(self, bench: Bench, rates: dict[str, dict], earlier: dict) -> Figures:
        threads = _threads(bench)
        tok = on_generated_corpus(16 if bench.opts.quick else 32, lambda corpus, work: prepare_vs_tiktoken(
            corpus, work, threads, bench.rounds if not bench.opts.quick else 2, bench.log))
        per = tok["per_round"]
        ci = "" if per["ratio_ci_low"] is None else f" [{per['ratio_ci_low']:.2f}, {per['ratio_ci_high']:.2f}]"
        row = (f"{tok['prepare_mb_per_sec']:.2f} MB/s end to end with {threads} workers vs tiktoken "
               f"encode_ordinary_batch {threads} threads {tok['tiktoken_batch_mb_per_sec']:.2f} MB/s = "
               f"{tok['ratio']:.2f}x best of each (target >= 0.8x; per round {per['ratio']:.2f}x{ci}; in CPU seconds "
               f"{tok['cpu_ratio']:.2f}x; {tok['text_mb']:.0f} MB of text, "
               f"{fmt(tok['prepare_tokens_per_sec'], 'tokens/s')}; start-up "
               f"{tok['prepare_startup_sec']:.1f} s of prepare's {tok['prepare_sec']:.1f} s; tiktoken one thread "
               f"{tok['tiktoken_one_thread_mb_per_sec']:.2f} MB/s)")
        return Figures({"prepare": tok}, [("data: prepare (parquet -> gpt2 shards)", row)])


@section
class PrepareResume(Section):
    name, order = "prepare-resume", 81

    def run(self, bench: Bench, rates: dict[str, dict], earlier: dict) -> Figures:
        threads = _threads(bench)
        r = on_generated_corpus(16 if bench.opts.quick else 64, lambda corpus, work: resume_after_kill(
            corpus, work, threads, 300_000, bench.log))
        n, at = r["shards"], r["killed_at"]
        row = (f"{r['rerun_sec']:.1f} s re-run vs {r['whole_sec']:.1f} s uninterrupted = {r['fraction']:.2f} of the "
               f"whole end to end, {r['pass_fraction']:.2f} of its tokenizing pass ({r['rerun_pass_sec']:.1f} of "
               f"{r['pass_sec']:.1f} s) (kill -9 after {at['train']}/{n['train']} train and {at['val']}/{n['val']} "
               f"val shards of {r['shard_tokens']:,} tokens; {threads} process{'es' * (threads > 1)}; same shards: "
               f"{'yes' if r['same_shards'] and r['resumed'] else 'NO'})")
        return Figures({"prepare_resume": r}, [("data: prepare re-run after kill -9 at ~60%", row)])
