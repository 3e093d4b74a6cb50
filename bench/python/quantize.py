"""Static int8 quantisation of the model, calibrated on tensors of stored photos.

    python quantize.py MODEL.onnx CALIBRATION.npy OUT.onnx

CALIBRATION.npy holds normalised fp32 NCHW tensors exported by `ndpipe bench infer`. Uses
onnxruntime's QDQ format with per-channel weights, which runs on VNNI int8 kernels on CPUs that
have them.
"""

import sys

import numpy as np
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
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
    quantize_static(
        prepared,
        out,
        Reader(data),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
    )
    print(f"quantised {model} -> {out} with {len(data)} calibration tensors")


if __name__ == "__main__":
    main()
