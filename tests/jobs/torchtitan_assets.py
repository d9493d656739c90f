"""Make the assets torchtitan's `llama3_debugmodel` reads, locally (the wheel ships none).

Run with torchtitan's own interpreter (it needs the `tokenizers` package):
``python torchtitan_assets.py OUT``. Writes

- ``OUT/tokenizer``: a byte-level BPE tokenizer of vocabulary 2000 (the model's is 2048),
  bos ``<|begin_of_text|>`` and eos ``<|end_of_text|>``: ``tokenizer.json`` and the
  ``tokenizer_config.json`` torchtitan's HuggingFaceTokenizer reads them from. Pass the folder
  as ``--hf-assets-path``.
- ``OUT/c4_test``: 2000 synthetic JSON lines ``{"text": ...}``, a local dataset folder read
  as torchtitan reads its ``c4_test`` (``load_dataset(path, split="train")``). Pass it as
  ``--dataloader.dataset-path``.

Deterministic: the same bytes every time. Imports nothing of bisect-prefetch.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

VOCAB = 2000
LINES = 2000
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
WORDS = ("the model trains on sharded parameters and every rank gathers its units before "
         "forward while backward prefetches the previous layer so that communication overlaps "
         "compute a drift between two runs of the same seed means something in the schedule "
         "changed numbers that should not change").split()


def texts() -> list[str]:
    rng = random.Random(2024)
    out = []
    for i in range(LINES):
        words = [rng.choice(WORDS) for _ in range(rng.randint(40, 160))]
        out.append(f"Document {i}. " + " ".join(words).capitalize() + ".")
    return out


def main(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    lines = texts()
    data = out / "c4_test"
    data.mkdir(parents=True, exist_ok=True)
    (data / "data.json").write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(lines, trainer)
    folder = out / "tokenizer"
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": BOS, "eos_token": EOS, "add_bos_token": True, "add_eos_token": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
