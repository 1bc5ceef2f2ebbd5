"""Shared test set-up: offline data and tokenizer files from ../shared, tiny and deterministic."""
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = (REPO.parent / "shared").resolve()

# tiktoken reads its GPT-2 BPE files from here instead of downloading them.
if (SHARED / "tiktoken-cache").is_dir():
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(SHARED / "tiktoken-cache"))
# The README's command sets it relative (../shared/tiktoken-cache): make it absolute, so the CLI subprocesses that
# tests start in their own temporary directories find the files too.
if os.environ.get("TIKTOKEN_CACHE_DIR"):
    os.environ["TIKTOKEN_CACHE_DIR"] = os.path.abspath(os.environ["TIKTOKEN_CACHE_DIR"])
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("HYDRA_FULL_ERROR", "0")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shakespeare_path() -> Path:
    path = SHARED / "data" / "tinyshakespeare.txt"
    if not path.is_file():
        pytest.fail(f"tinyshakespeare.txt not found at {path}: tests expect the shared/ folder beside the checkout")
    return path


@pytest.fixture
def one_thread():
    """Tiny models run fastest on one thread, and CI's two cores are shared: more threads only contend."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
