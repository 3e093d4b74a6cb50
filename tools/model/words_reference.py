"""Known answers of the words model (all-MiniLM-L6-v2) from the Python reference.

Embeds a fixed list of texts with sentence-transformers itself and writes them as JSON; the Rust
encoder's test (crates/ndpipe-model/tests/words.rs) must agree within a tolerance. Not part of
the setup (it needs torch); the output is committed. How it was produced:

    python3 -m venv --system-site-packages /tmp/refvenv      # Debian's python3-torch 1.13
    /tmp/refvenv/bin/pip install sentence-transformers==2.7.0 transformers==4.40.2 \
        'tokenizers<0.20' 'huggingface-hub<0.24' numpy==1.24.2 scipy==1.11.4 scikit-learn==1.3.2
    tools/model/setup_words.sh /tmp/words
    /tmp/refvenv/bin/python tools/model/words_reference.py /tmp/words \
        crates/ndpipe-model/tests/data/words_known_answers.json
"""

import json
import sys

import numpy as np
import sentence_transformers
import torch
import transformers
from sentence_transformers import SentenceTransformer

TEXTS = [
    "kitty",
    "coffee cup",
    "tabby cat",
    "T-shirt/top",
    "Ankle boot",
    "A man is eating food.",
    "pickup truck",
    "Crème brûlée, espresso & a croissant!",
    "qwxz zzkj",
    "the quick brown fox jumps over the lazy dog while the photographer waits for the light",
]


def main() -> None:
    model_dir, out = sys.argv[1], sys.argv[2]
    model = SentenceTransformer(model_dir, device="cpu")
    vectors = model.encode(TEXTS, batch_size=len(TEXTS), convert_to_numpy=True)
    norms = np.linalg.norm(vectors, axis=1)
    assert np.allclose(norms, 1.0, atol=1e-5), norms
    report = {
        "reference": {
            "sentence_transformers": sentence_transformers.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
        "dim": int(vectors.shape[1]),
        "texts": [
            {"text": t, "embedding": [round(float(x), 7) for x in v]}
            for t, v in zip(TEXTS, vectors)
        ],
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(report, f, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
