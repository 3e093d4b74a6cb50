"""Static int8 quantisation of the model, calibrated on tensors of stored photos.

    python quantize.py MODEL.onnx CALIBRATION.npy OUT.onnx

CALIBRATION.npy holds normalised fp32 NCHW tensors exported by `ndpipe-bench infer`. Uses
onnxruntime's QDQ format with per-channel weights, which runs on VNNI int8 kernels on CPUs that
have them.
"""

import sys

import numpy as np
import onnx
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_static,
)
from onnxruntime.quantization.shape_inference import quant_pre_process


class Reader(CalibrationDataReader):
    def __init__(self, data):
        self.items = iter([{"input": data[i : i + 1]} for i in range(len(data))])

    def get_next(self):
        return next(self.items, None)


def main():
    model, calibration, out = sys.argv[1:4]
    data = np.load(calibration).astype(np.float32)
    prepared = out + ".prep.onnx"
    quant_pre_process(model, prepared, skip_symbolic_shape=True)
    graph = onnx.load(prepared).graph
    convs = [n.name for n in graph.node if n.op_type == "Conv"]
    classifier = [n.name for n in graph.node if n.op_type in ("Gemm", "MatMul")]
    # The stem convolution sees raw pixels and the classifier decides the label: both stay fp32,
    # which costs little time and keeps the top-1 close to the fp32 model's.
    keep_fp32 = convs[:1] + classifier
    quantize_static(
        prepared,
        out,
        Reader(data),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        nodes_to_exclude=keep_fp32,
        calibrate_method=CalibrationMethod.Percentile,
        extra_options={"CalibPercentile": 99.999},
    )
    print(f"quantised {model} -> {out} with {len(data)} calibration tensors; kept fp32: {keep_fp32}")


if __name__ == "__main__":
    main()
