#!/usr/bin/env python3
"""Known-answer check of the converted model, with onnxruntime on real photos.

    check_model.py OUTDIR PHOTODIR [--report FILE] [--compare-norms]

OUTDIR holds model.json, the ONNX file and imagenet_classes.txt; PHOTODIR the
scikit-image sample photos (fetch_samples.sh). Preprocessing: RGB, resize the
shorter side to 256 (PIL bilinear), centre crop 224, then (x/255 - mean) / std
with mean/std from model.json. Exits 1 with a message when a check fails.
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper
from PIL import Image

RESIZE, CROP = 256, 224
# photo -> (how many top classes to look in, accepted class indices, description)
KNOWN = {
    "chelsea.png": (5, {281, 282, 285}, "a cat class (tabby / tiger cat / Egyptian cat) in top-5"),
    "coffee.png": (1, {967}, "espresso as top-1"),
    "rocket.jpg": (5, {657, 744}, "missile or projectile in top-5"),
}
# Feature L2 norms from an independent export of the same weights (torch 1.13 +
# efficientnet-lite-pytorch, ecosystem.md section 2.A). The class checks above
# survive small graph mistakes (e.g. "same" padding on the wrong side); these do not.
REFERENCE_FEATURE_L2 = {"chelsea.png": 15.44, "coffee.png": 13.92, "rocket.jpg": 13.73}
L2_TOL = 0.02
BATCH_PHOTOS = ["chelsea.png", "coffee.png", "rocket.jpg", "astronaut.png"]
TOL = 1e-4
NORMS = {  # alternatives compared by --compare-norms, in 0..1 pixel scale
    "tf-lite (0.5, 0.5)": ([0.5] * 3, [0.5] * 3),
    "tf-lite exact (127/255, 128/255)": ([127 / 255] * 3, [128 / 255] * 3),
    "imagenet (0.485.., 0.229..)": ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
}


def fail(msg):
    print(f"CHECK FAILED: {msg}", file=sys.stderr)
    sys.exit(1)


def load_pixels(path):
    """Photo -> u8 [224, 224, 3] RGB after resize-256 + centre crop."""
    im = Image.open(path).convert("RGB")
    w, h = im.size
    s = RESIZE / min(w, h)
    w, h = max(RESIZE, round(w * s)), max(RESIZE, round(h * s))
    im = im.resize((w, h), Image.BILINEAR)
    left, top = (w - CROP) // 2, (h - CROP) // 2
    return np.asarray(im.crop((left, top, left + CROP, top + CROP)), dtype=np.uint8)


def normalise(pixels, mean, std):
    x = (pixels.astype(np.float32) / 255.0 - np.float32(mean)) / np.float32(std)
    return np.ascontiguousarray(x.transpose(2, 0, 1))  # HWC -> CHW


def softmax(z):
    z = z.astype(np.float64) - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("photodir")
    ap.add_argument("--report", help="write top-5 per photo and batch diffs as JSON")
    ap.add_argument("--compare-norms", action="store_true", help="score the known answers under other normalisations")
    args = ap.parse_args()

    with open(os.path.join(args.outdir, "model.json")) as f:
        manifest = json.load(f)
    model_path = os.path.join(args.outdir, manifest["model_file"])
    with open(os.path.join(args.outdir, manifest["classes_file"])) as f:
        classes = f.read().splitlines()
    if len(classes) != manifest["num_classes"]:
        fail(f"{len(classes)} class names for {manifest['num_classes']} classes")
    out_names = [manifest["outputs"]["features"], manifest["outputs"]["logits"]]

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model_path, opts, providers=["CPUExecutionProvider"])
    inp = manifest["input"]

    def run(x):
        return sess.run(out_names, {inp: x})

    photos = sorted(p for p in os.listdir(args.photodir) if p.lower().endswith((".png", ".jpg", ".jpeg")))
    missing = [p for p in KNOWN if p not in photos]
    if missing:
        fail(f"photos missing from {args.photodir}: {missing} (run fetch_samples.sh)")
    pixels = {p: load_pixels(os.path.join(args.photodir, p)) for p in photos}
    mean, std = manifest["mean"], manifest["std"]

    # Top-5 of every photo, one image per run.
    report = {"model": manifest["name"], "mean": mean, "std": std, "photos": {}}
    single = {}
    t0 = time.perf_counter()
    for p in photos:
        feats, logits = run(normalise(pixels[p], mean, std)[None])
        single[p] = (feats[0], logits[0])
    per_image_ms = (time.perf_counter() - t0) * 1000 / len(photos)
    failures = []
    for p in photos:
        feats, logits = single[p]
        prob = softmax(logits)
        top = np.argsort(-prob)[:5]
        report["photos"][p] = {
            "top5": [{"index": int(i), "name": classes[i], "prob": round(float(prob[i]), 5)} for i in top],
            "feature_l2": round(float(np.linalg.norm(feats)), 4),
        }
        print(f"{p:24s} " + " | ".join(f"{classes[i].split(',')[0]} {prob[i]:.3f}" for i in top))
        if p in KNOWN:
            k, want, desc = KNOWN[p]
            if not want & {int(i) for i in top[:k]}:
                failures.append(f"{p}: expected {desc}, got {[classes[i] for i in top[:k]]}")
        ref = REFERENCE_FEATURE_L2.get(p)
        if ref is not None and manifest["name"] == "efficientnet-lite0":
            l2 = float(np.linalg.norm(feats))
            if abs(l2 - ref) > L2_TOL:
                failures.append(f"{p}: feature L2 norm {l2:.3f}, reference {ref} (graph differs from the torch model)")

    # features are exactly the FC input: logits == features @ W^T + b.
    graph = onnx.load(model_path, load_external_data=False).graph
    inits = {t.name: t for t in graph.initializer}
    fc = [n for n in graph.node if n.op_type == "Gemm" and out_names[1] in n.output]
    if len(fc) != 1 or fc[0].input[0] != out_names[0]:
        fail("logits are not produced by one Gemm over the features output")
    w = numpy_helper.to_array(inits[fc[0].input[1]]).astype(np.float64)
    b = numpy_helper.to_array(inits[fc[0].input[2]]).astype(np.float64)
    trans_b = any(a.name == "transB" and a.i == 1 for a in fc[0].attribute)
    fc_diff = max(
        float(np.abs(f.astype(np.float64) @ (w.T if trans_b else w) + b - l).max()) for f, l in single.values()
    )
    if fc_diff > TOL:
        failures.append(f"logits != features @ W^T + b (max abs diff {fc_diff:.2e})")

    # A batch of 4 equals 4 single runs.
    batch = np.stack([normalise(pixels[p], mean, std) for p in BATCH_PHOTOS])
    feats, logits = run(batch)
    batch_diff = max(
        max(float(np.abs(feats[i] - single[p][0]).max()), float(np.abs(logits[i] - single[p][1]).max()))
        for i, p in enumerate(BATCH_PHOTOS)
    )
    if batch_diff > TOL:
        failures.append(f"batch of {len(BATCH_PHOTOS)} differs from single runs by {batch_diff:.2e}")
    report.update(
        fc_max_abs_diff=fc_diff,
        batch_vs_single_max_abs_diff=batch_diff,
        onnxruntime=ort.__version__,
        per_image_ms=round(per_image_ms, 2),
    )
    print(
        f"fc check: max |features@W^T+b - logits| = {fc_diff:.2e}; "
        f"batch of {len(BATCH_PHOTOS)} vs single: max abs diff = {batch_diff:.2e}; "
        f"{per_image_ms:.1f} ms/image (onnxruntime {ort.__version__})"
    )

    if args.compare_norms:
        print("known-answer probabilities per normalisation (chelsea: sum of cat classes):")
        for label, (m, s) in NORMS.items():
            probs = {p: softmax(run(normalise(pixels[p], m, s)[None])[1][0]) for p in KNOWN}
            row = {p: float(probs[p][sorted(KNOWN[p][1])].sum()) for p in KNOWN}
            tops = {p: classes[int(np.argmax(probs[p]))].split(",")[0] for p in KNOWN}
            report.setdefault("norms", {})[label] = {"mean": m, "std": s, "known_prob": row, "top1": tops}
            print(f"  {label:34s} " + "  ".join(f"{p} {row[p]:.3f} (top-1 {tops[p]})" for p in KNOWN))

    if args.report:
        with open(args.report, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
    if failures:
        fail("; ".join(failures))
    print("known-answer check passed")


if __name__ == "__main__":
    main()
