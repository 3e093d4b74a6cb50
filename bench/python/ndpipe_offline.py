"""A straightforward Python port of NDPipe's offline-inference loop, the peer of `ndpipe-bench infer`.

As in the artifact (Offline_inference/inference_test.py): one gzip-compressed fp32 CHW tensor file
per image; a loader thread reads and decompresses the next batch while onnxruntime runs the
current one (prefetch depth 1). Same model, same thread count as the Rust side.

    python ndpipe_offline.py MODEL.onnx TENSOR_DIR --batch 32 --threads 2 [--noop]

--noop replaces the model with nothing, which measures how fast the loader alone can feed an
accelerator. Prints one JSON line: images, seconds, model_seconds.
"""

import argparse
import gzip
import json
import os
import queue
import threading
import time

import numpy as np


def loader(files, batch, out):
    for i in range(0, len(files), batch):
        arrays = []
        for path in files[i : i + batch]:
            with open(path, "rb") as f:
                raw = gzip.decompress(f.read())
            arrays.append(np.frombuffer(raw, dtype=np.float32).reshape(3, 224, 224))
        out.put(np.stack(arrays))
    out.put(None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("tensors")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--noop", action="store_true")
    args = ap.parse_args()

    files = sorted(os.path.join(args.tensors, f) for f in os.listdir(args.tensors) if f.endswith(".gz"))
    session = None
    if not args.noop:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads
        opts.inter_op_num_threads = 1
        session = ort.InferenceSession(args.model, opts, providers=["CPUExecutionProvider"])
        session.run(None, {"input": np.zeros((1, 3, 224, 224), np.float32)})

    batches = queue.Queue(maxsize=1)
    started = time.perf_counter()
    thread = threading.Thread(target=loader, args=(files, args.batch, batches), daemon=True)
    thread.start()
    images = 0
    model_seconds = 0.0
    while True:
        batch = batches.get()
        if batch is None:
            break
        if session is not None:
            t = time.perf_counter()
            session.run(None, {"input": batch})
            model_seconds += time.perf_counter() - t
        images += len(batch)
    seconds = time.perf_counter() - started
    thread.join()
    print(json.dumps({"images": images, "seconds": seconds, "model_seconds": model_seconds}))


if __name__ == "__main__":
    main()
