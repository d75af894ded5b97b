"""Put a tiny random GPT-2 into a Hugging Face cache folder, laid out as the hub client leaves a
download (`models--ORG--NAME/snapshots/REV/`, `refs/main`), so `from_pretrained(ORG/NAME)` finds it
offline. Used by the level-4 tests; nothing is downloaded.

    python hf_cache.py CACHE_DIR [REPO_ID]
"""

from __future__ import annotations

import sys
from pathlib import Path

TEST_MODEL = "krefine-test/tiny-gpt2"
REVISION = "0" * 40


def make_cached_model(cache: Path, repo_id: str = TEST_MODEL) -> Path:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = folder / "snapshots" / REVISION
    snapshot.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    GPT2LMHeadModel(config).save_pretrained(snapshot)
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / "main").write_text(REVISION)
    return snapshot


if __name__ == "__main__":
    make_cached_model(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else TEST_MODEL)
