"""The README's PyTorch example, run as written against a local HTTP server
that answers ``GET /v1/photos/{id}`` with Fashion-MNIST PNGs, as a store would."""

import io
import re
from pathlib import Path

import numpy as np
import pytest

from conftest import SampleServer, fashion_mnist, need

torch = need("torch")
Image = need("PIL.Image")

README = Path(__file__).resolve().parents[3] / "README.md"


def example():
    text = README.read_text()
    section = text[text.index("## Python: training through the cache"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def png(pixels):
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture
def store():
    n = 1500
    images = fashion_mnist("train-images-idx3-ubyte.gz", n)
    labels = fashion_mnist("train-labels-idx1-ubyte.gz", n).astype(np.int64)
    photo_ids = [7000 + 3 * i for i in range(n)]  # a store's ids are not the dataset's
    server = SampleServer({p: png(img) for p, img in zip(photo_ids, images)})
    yield server, photo_ids, labels
    server.close()


def test_the_readme_example_trains_through_the_cache(store, capsys):
    server, photo_ids, labels = store
    test_x = torch.from_numpy(fashion_mnist("t10k-images-idx3-ubyte.gz", 500)
                              .reshape(500, -1) / 255.0).float()
    test_y = torch.from_numpy(fashion_mnist("t10k-labels-idx1-ubyte.gz", 500).astype(np.int64))
    accuracies = []

    def evaluate(body, head):
        with torch.no_grad():
            accuracies.append(float((head(body(test_x)).argmax(1) == test_y).float().mean()))
        return accuracies[-1]

    def training_set(url):
        assert url == server.url
        return photo_ids, labels

    code = example().replace('"http://127.0.0.1:8080"', repr(server.url))
    torch.manual_seed(0)
    scope = {"training_set": training_set, "evaluate": evaluate}
    exec(compile(code, str(README), "exec"), scope)

    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 5 and len(accuracies) == 5
    assert accuracies[-1] > 0.65, accuracies
    stats = scope["stats"]
    assert stats["exact_hits"] > 0 and stats["reads_per_request"] < 1.0
    assert server.requests < 0.9 * 5 * len(photo_ids)  # the cache saved reads
