"""`python -m ablations.export`: a recorded run becomes a Hugging Face directory that transformers loads with our
logits and our token ids, that lm_eval runs on (offline, on a task file of our own), that is logged to the run
with --log; combinations without a Hugging Face architecture are refused with one line.
(The per-architecture weight mapping is checked in test_reference_hf.py.)"""
import json
import os
import subprocess
import sys

import pytest
import torch

from ablations import export as ex
from modules.config import GPTConfig
from modules.gpt import GPT

TEXT = "ROMEO: O, she doth teach the torches to burn bright!\n\tNaïve café — 9€ 😀 \x00 end"


# ------------------------------------------------------------------------------------------------ tokenizers
def hf_round_trip(tok, tmp_path, text):
    from transformers import AutoTokenizer

    ex.hf_tokenizer(tok, 64).save_pretrained(tmp_path)
    theirs = AutoTokenizer.from_pretrained(tmp_path)
    ids = theirs(text, add_special_tokens=False)["input_ids"]
    return ids, theirs.decode(ids), theirs


def test_byte_tokenizer_round_trips_our_ids(tmp_path):
    from ablations.tokenizers import ByteTokenizer

    tok = ByteTokenizer()
    ids, back, theirs = hf_round_trip(tok, tmp_path, TEXT)
    assert ids == tok.encode(TEXT) == list(TEXT.encode("utf-8"))  # the id of a byte is its value
    assert back == TEXT
    assert theirs.eos_token_id == tok.sep_id == 0


def test_char_tokenizer_round_trips_our_ids(tmp_path):
    from ablations.tokenizers import CharTokenizer

    tok = CharTokenizer.from_texts([TEXT, "xyz"], with_separator=True)
    ids, back, theirs = hf_round_trip(tok, tmp_path, TEXT)
    assert ids == tok.encode(TEXT)
    assert back == TEXT
    assert theirs.eos_token_id == tok.sep_id


def test_gpt2_tokenizer_files_give_tiktoken_ids(tmp_path):
    from ablations.tokenizers import GPT2Tokenizer

    tok = GPT2Tokenizer()
    text = TEXT.replace("\x00", "")
    ids, back, theirs = hf_round_trip(tok, tmp_path, text)
    assert ids == tok.encode(text)
    assert back == text
    assert theirs.eos_token_id == 50256 and len(theirs) == 50257


# ------------------------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize("kw, named", [
    (dict(norm={"name": "layernorm", "placement": "post"}), "norm.placement=pre (got post)"),
    (dict(position="sinusoidal"), "position=learned (got sinusoidal)"),
    (dict(norm="dyt"), "norm=layernorm (got dyt)"),
    (dict(position="t5bias"), "position=learned (got t5bias)"),
    (dict(mlp="relu2"), "mlp=gelu (got relu2)"),
    (dict(position="rope", norm="rmsnorm", mlp="swiglu", attention={"name": "sliding", "window": 4},
          bias=True), "bias=false (got true)"),
    (dict(position="alibi", norm="layernorm", mlp={"name": "gelu", "approximate": "none"}, bias=True),
     "bias=false (got true)"),
    (dict(position="rope", norm="rmsnorm", mlp="swiglu", attention="mla"), "attention.latent_norm=true (got false)"),
])
def test_combinations_without_an_hf_architecture_are_refused_naming_the_setting(kw, named):
    model = GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=16, **kw))
    with pytest.raises(ex.ExportError, match="no Hugging Face architecture fits") as e:
        ex.architecture(model)
    assert named in str(e.value) and "\n" not in str(e.value)


# ------------------------------------------------------------------------------------------------ end to end
@pytest.fixture(scope="module")
def llama_run(tmp_path_factory, shakespeare_path, train_here):
    """A 2-step Llama-style run (rope, rmsnorm, swiglu, gqa) on bytes, recorded in its own MLflow store (trained in
    this process: export reads the recorded run, the training CLI is tested in tests/test_harness_run.py)."""
    cwd = tmp_path_factory.mktemp("export")
    uri = f"sqlite:///{cwd}/mlflow.db"
    args = {"model": "tiny", "position": "rope", "norm": "rmsnorm", "mlp": "swiglu", "attention": "gqa",
            "attention.n_kv_head": 2, "data": "shakespeare", "data.path": str(shakespeare_path), "tokenizer": "byte",
            "data.batch_size": 2, "data.val_windows": 2, "trainer.max_steps": 2, "trainer.val_check_interval": 2,
            "trainer.enable_progress_bar": "false", "generate.max_new_tokens": 2, "generate.bench_decode_tokens": 2,
            "tracking.uri": uri, "checkpoint.dir": str(cwd / "ckpt"), "data.cache_dir": str(cwd / "cache")}
    run_id = train_here(cwd, [f"{k}={v}" for k, v in args.items()])["run_id"]
    from mlflow import MlflowClient

    c = MlflowClient(tracking_uri=uri)
    (run,) = c.search_runs([c.get_experiment_by_name("ablations").experiment_id])
    assert run.info.run_id == run_id
    return cwd, uri, run_id


@pytest.mark.slow
def test_export_loads_in_transformers_with_our_logits_and_is_logged(llama_run, capsys):
    from mlflow import MlflowClient
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ablations.generate import load_run

    cwd, uri, run_id = llama_run
    out = cwd / "hf"
    assert ex.main([f"run_id={run_id}", f"out={out}", f"tracking.uri={uri}", "log=true"]) == 0
    assert "exported Llama" in capsys.readouterr().out
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    ours, tok, _ = load_run(run_id, uri)
    theirs = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").float().eval()
    assert type(theirs).__name__ == "LlamaForCausalLM"
    ids = torch.tensor([tok.encode("ROMEO: O, she doth teach the torches")[:32]])
    with torch.no_grad():
        assert (ours.float()(ids) - theirs(ids).logits).abs().max().item() <= 1e-4
    assert AutoTokenizer.from_pretrained(out)("Naïve")["input_ids"] == list("Naïve".encode())
    logged = {a.path for a in MlflowClient(tracking_uri=uri).list_artifacts(run_id, "hf")}
    assert {"hf/config.json", "hf/model.safetensors", "hf/tokenizer.json"} <= logged


@pytest.mark.slow
def test_lm_eval_runs_offline_on_the_export(llama_run, tmp_path):
    cwd, _, _ = llama_run
    out = cwd / "hf"
    if not (out / "config.json").is_file():  # run alone: export first (no --log)
        _, uri, run_id = llama_run
        assert ex.main([f"run_id={run_id}", f"out={out}", f"tracking.uri={uri}"]) == 0
    data = tmp_path / "tiny.jsonl"
    data.write_text("\n".join(json.dumps(d) for d in [
        {"question": "ROMEO: O, she doth teach the torches to", "choices": [" burn", " qzx"], "answer": 0},
        {"question": "First Citizen: Before we proceed any further, hear me", "choices": [" speak.", " zq."],
         "answer": 0}]) + "\n")
    (tmp_path / "tiny.yaml").write_text(
        "task: ablations_tiny\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\noutput_type: multiple_choice\n"
        'doc_to_text: "{{question}}"\ndoc_to_choice: "{{choices}}"\ndoc_to_target: "{{answer}}"\n'
        "metric_list:\n  - metric: acc\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_DATASETS_CACHE=str(tmp_path / "ds-cache"))
    r = subprocess.run([sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
                        f"pretrained={out},dtype=float32", "--tasks", "ablations_tiny", "--include_path",
                        str(tmp_path), "--device", "cpu", "--batch_size", "1", "--output_path",
                        str(tmp_path / "results")], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    (results,) = list((tmp_path / "results").rglob("results*.json"))
    acc = json.loads(results.read_text())["results"]["ablations_tiny"]["acc,none"]
    assert 0.0 <= acc <= 1.0


@pytest.mark.slow
def test_refused_run_exits_2_with_one_line(llama_run, tmp_path, capsys):
    """A post-norm checkpoint, logged like a harness run (the real run's checkpoint with the model swapped)."""
    from mlflow import MlflowClient

    from ablations.checkpoints import load_final_checkpoint

    _, uri, run_id = llama_run
    c = MlflowClient(tracking_uri=uri)
    ck = load_final_checkpoint(c.download_artifacts(run_id, "checkpoints/final.ckpt", str(tmp_path)))
    cfg = dict(ck["model_config"], norm={"name": "rmsnorm", "placement": "post"})
    ck.update(model_config=cfg, state_dict=GPT(GPTConfig.from_dict(cfg)).state_dict())
    path = tmp_path / "post" / "final.ckpt"
    path.parent.mkdir()
    torch.save(ck, path)
    run = c.create_run(c.get_run(run_id).info.experiment_id, tags={"tokenizer_hash": ck["tokenizer_hash"]})
    c.log_artifact(run.info.run_id, str(path), artifact_path="checkpoints")
    c.set_terminated(run.info.run_id)
    assert ex.main([f"run_id={run.info.run_id}", f"out={tmp_path / 'hf'}", f"tracking.uri={uri}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "does not export" in err and "norm.placement=pre (got post)" in err
    assert not (tmp_path / "hf").exists()
