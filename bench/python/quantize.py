"""Static int8 quantisation of the model, calibrated on real-photo crops, with the layers that lose
top-1 agreement with fp32 kept in fp32.

    python quantize.py MODEL.onnx CALIBRATION.npy SELECTION.npy OUT.onnx REPORT.json
        [--threads 2] [--batch 32] [--target-agreement 0.97] [--min-speedup 1.8] [--max-steps 8]

CALIBRATION.npy and SELECTION.npy hold normalised fp32 NCHW tensors of two disjoint sets of crops,
exported by `ndpipe-bench infer` (preprocessed by the store's own Rust code). Calibration sets the
activation ranges; the selection set alone decides which settings and layers to keep (the bench
measures the final agreement on a third, held-out set).

1. Tries quantiser settings (QDQ vs QOperator, per-channel vs per-tensor weights, asymmetric vs
   symmetric activations, MinMax / Entropy / Percentile calibration) and keeps the one with the
   best agreement among those at least --min-speedup times as fast as fp32.
2. Sensitivity per op group (the stem, each MBConv block with its residual add, the head): the
   agreement (and logit error) when that group alone stays fp32. No single node (measured once:
   at most +0.4 points) and no group but the first block recovers much alone: the error builds
   up layer after layer from the input, and the early layers are where keeping fp32 pays.
3. Greedy: keeps groups in fp32 from the input on, one more group a step, until the agreement
   reaches --target-agreement or --max-steps steps; every step is recorded (agreement against
   speed), and the model written is the best step still at least --min-speedup times fp32's speed.
Writes OUT.onnx and REPORT.json (settings tried, sensitivity, greedy steps, nodes kept fp32).
"""

import argparse
import json
import os
import re
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_static,
)
from onnxruntime.quantization.shape_inference import quant_pre_process

# Images per calibration run, and runs per range update (bounds the memory the calibrator holds).
CALIB_BATCH = 16
CALIB_STRIDE = 4
QUANTISABLE = ("Conv", "Add", "Gemm", "GlobalAveragePool")


class Reader(CalibrationDataReader):
    """Calibration batches, with the range selection quantize_static's strided collection uses."""

    def __init__(self, data):
        self.batches = [data[i : i + CALIB_BATCH] for i in range(0, len(data), CALIB_BATCH)]
        self.set_range(0, len(self.batches))

    def __len__(self):
        return len(self.batches)

    def set_range(self, start_index, end_index):
        self.items = iter({"input": b} for b in self.batches[start_index:end_index])

    def get_next(self):
        return next(self.items, None)


class Search:
    def __init__(self, args, tmp):
        self.args = args
        self.tmp = tmp
        self.prepared = os.path.join(self.tmp, "prepared.onnx")
        quant_pre_process(args.model, self.prepared, skip_symbolic_shape=True)
        self.calib = np.load(args.calibration).astype(np.float32)
        # Whole batches only, so the strided calibration divides evenly.
        per_stride = CALIB_BATCH * CALIB_STRIDE
        self.calib = self.calib[: len(self.calib) // per_stride * per_stride]
        self.select = np.load(args.selection).astype(np.float32)
        self.fp32 = self.session(args.model)
        self.fp32_logits = self.logits(self.fp32)
        self.fp32_top1 = self.fp32_logits.argmax(axis=1)
        self.fp32_speed = None
        graph = onnx.load(self.prepared).graph
        self.groups = op_groups([n.name for n in graph.node if n.op_type in QUANTISABLE])

    def session(self, path):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.args.threads
        opts.inter_op_num_threads = 1
        return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])

    def logits(self, sess):
        rows = [
            sess.run(["logits"], {"input": self.select[i : i + self.args.batch]})[0]
            for i in range(0, len(self.select), self.args.batch)
        ]
        return np.concatenate(rows)

    def throughput(self, sess):
        sess.run(["logits"], {"input": self.select[: self.args.batch]})
        started = time.perf_counter()
        self.logits(sess)
        return len(self.select) / (time.perf_counter() - started)

    def speedup(self, sess):
        """int8 over fp32 images per second, alternating the two, the best of each of 3 runs."""
        fp32, int8 = 0.0, 0.0
        for _ in range(3):
            fp32 = max(fp32, self.throughput(self.fp32))
            int8 = max(int8, self.throughput(sess))
        return int8 / fp32

    def quantise(self, setting, exclude, out):
        method = setting["calibration"]
        extra = {"CalibStridedMinMax": CALIB_STRIDE}
        if method == "Percentile":
            extra["CalibPercentile"] = 99.999
        if setting["symmetric_activations"]:
            extra["ActivationSymmetric"] = True
        quantize_static(
            self.prepared,
            out,
            Reader(self.calib),
            quant_format=QuantFormat.QDQ if setting["format"] == "QDQ" else QuantFormat.QOperator,
            per_channel=setting["per_channel"],
            activation_type=QuantType.QInt8 if setting["symmetric_activations"] else QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            nodes_to_exclude=list(exclude),
            calibrate_method=getattr(CalibrationMethod, method),
            calibration_cache_path=os.path.join(self.tmp, f"ranges-{method}.json"),
            extra_options=extra,
        )
        return self.session(out)

    def evaluate(self, setting, exclude, with_speed):
        sess = self.quantise(setting, exclude, os.path.join(self.tmp, "candidate.onnx"))
        logits = self.logits(sess)
        agreement = float((logits.argmax(axis=1) == self.fp32_top1).mean())
        error = float(np.mean((logits - self.fp32_logits) ** 2))
        speedup = self.speedup(sess) if with_speed else None
        return agreement, error, speedup


def op_groups(names):
    """Quantisable nodes in graph order, grouped: "stem", "block K" (a residual add joins the block
    before it), "head" (the rest)."""
    groups = {}
    current = "stem"
    for name in names:
        block = re.search(r"_blocks_(\d+)_", name)
        if "stem" in name:
            current = "stem"
        elif block:
            current = f"block {block.group(1)}"
        elif not re.match(r"block\d+_add", name):
            current = "head"
        groups.setdefault(current, []).append(name)
    return list(groups.items())


SETTINGS = [
    {"format": "QDQ", "per_channel": True, "symmetric_activations": False, "calibration": "MinMax"},
    {"format": "QDQ", "per_channel": True, "symmetric_activations": False, "calibration": "Entropy"},
    {"format": "QDQ", "per_channel": True, "symmetric_activations": False, "calibration": "Percentile"},
    {"format": "QDQ", "per_channel": False, "symmetric_activations": False, "calibration": "MinMax"},
    {"format": "QDQ", "per_channel": True, "symmetric_activations": True, "calibration": "MinMax"},
    {"format": "QOperator", "per_channel": True, "symmetric_activations": False, "calibration": "MinMax"},
]


def main():
    p = argparse.ArgumentParser()
    for name in ("model", "calibration", "selection", "out", "report"):
        p.add_argument(name)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--target-agreement", type=float, default=0.97)
    p.add_argument("--min-speedup", type=float, default=1.8)
    p.add_argument("--max-steps", type=int, default=8)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="ndpipe-int8-") as tmp:
        run(args, Search(args, tmp))


def log(msg):
    print(f"[quantize] {msg}", flush=True)


def run(args, search):
    log(f"{len(search.calib)} calibration and {len(search.select)} selection tensors")

    tries = []
    for setting in SETTINGS:
        agreement, error, speedup = search.evaluate(setting, [], with_speed=True)
        tries.append({**setting, "agreement": agreement, "logit_mse": error, "speedup": speedup})
        log(f"tried {setting}: agreement {agreement:.3f}, speed-up {speedup:.2f}x")
    fast = [t for t in tries if t["speedup"] >= args.min_speedup] or tries
    best = max(fast, key=lambda t: (t["agreement"], -t["logit_mse"]))
    setting = {k: best[k] for k in SETTINGS[0]}
    log(f"base setting {setting}")

    sensitivity = []
    for group, names in search.groups:
        agreement, error, _ = search.evaluate(setting, names, with_speed=False)
        sensitivity.append({"group": group, "agreement": agreement, "logit_mse": error})
        log(f"{group} alone in fp32: agreement {agreement:.3f}")

    kept, steps = [], []
    agreement, error, speedup = best["agreement"], best["logit_mse"], best["speedup"]
    prefix = []
    for group, names in search.groups[: args.max_steps]:
        prefix = prefix + names
        a, e, sp = search.evaluate(setting, prefix, with_speed=True)
        better = a > agreement or (a == agreement and e < error)
        accepted = sp >= args.min_speedup and better
        steps.append({"group": group, "agreement": a, "logit_mse": e, "speedup": sp, "kept": accepted})
        log(f"up to {group} in fp32: agreement {a:.3f}, speed-up {sp:.2f}x -> {accepted}")
        if accepted:
            kept = list(prefix)
            agreement, error, speedup = a, e, sp
        if a >= args.target_agreement:
            break

    search.quantise(setting, kept, args.out)
    report = {
        "calibration_tensors": len(search.calib),
        "selection_tensors": len(search.select),
        "tries": tries,
        "setting": setting,
        "sensitivity": sensitivity,
        "steps": steps,
        "kept_fp32": kept,
        "selection_agreement": agreement,
        "selection_speedup": speedup,
    }
    with open(args.report, "w") as f:
        json.dump(report, f, indent=1)
    log(f"wrote {args.out}: kept fp32 {kept}; selection agreement {agreement:.3f}, speed-up {speedup:.2f}x")


if __name__ == "__main__":
    main()
