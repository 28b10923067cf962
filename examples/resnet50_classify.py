"""Seed 001's Python ResNet-50 example, written for pygraphx.

The script is the MIGraphX tutorial's, with `import pygraphx as migraphx`, a random image instead
of cv2.imread, and the built-in ResNet-50 written to disk when no model path is given:

    python examples/resnet50_classify.py [ResNet50.onnx] [--target ref]
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

import pygraphx as migraphx


def ReadImage(inputShape: list[int]) -> np.ndarray:  # noqa: N802 - the seed's name
    # a random 8-bit image in HWC order stands in for cv2.imread + cv2.resize
    rng = np.random.default_rng(0)
    resizedImage = rng.integers(0, 256, (inputShape[2], inputShape[3], 3)).astype("uint8")
    resizedImage_Float = resizedImage.astype("float32")
    srcImage_CHW = np.transpose(resizedImage_Float, (2, 0, 1))

    mean = np.array([127.5, 127.5, 127.5])
    scale = np.array([0.0078125, 0.0078125, 0.0078125])
    inputData = np.zeros(inputShape).astype("float32")
    for i in range(srcImage_CHW.shape[0]):
        inputData[0, i, :, :] = (srcImage_CHW[i, :, :] - mean[i]) * scale[i]
    for i in range(inputData.shape[0]):
        if i != 0:
            inputData[i, :, :, :] = inputData[0, :, :, :]
    return inputData


def main(argv: list[str] | None = None) -> np.ndarray:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("onnx", nargs="?", help="ResNet50.onnx (default: the built-in model)")
    parser.add_argument("--target", default="ref")
    args = parser.parse_args(argv)
    path = args.onnx
    if path is None:
        from pygraphx.models import get_model

        path = os.path.join(tempfile.mkdtemp(), "ResNet50.onnx")
        with open(path, "wb") as f:
            f.write(get_model("resnet50").SerializeToString())

    # 加载模型 (load the model)
    model = migraphx.parse_onnx(path)

    print("inputs:")
    inputs = model.get_inputs()
    for key, value in inputs.items():
        print("{}:{}".format(key, value))  # noqa: UP032 - the seed's code
    print("outputs:")
    outputs = model.get_outputs()
    for key, value in outputs.items():
        print("{}:{}".format(key, value))  # noqa: UP032 - the seed's code

    inputName = list(model.get_inputs().keys())[0]
    inputShape = inputs[inputName].lens()

    # 编译模型 (compile)
    model.compile(t=migraphx.get_target(args.target), device_id=0)

    image = ReadImage(inputShape)

    # 推理 (inference)
    results = model.run({inputName: image})

    result = results[0]
    outputShape = result.get_shape()
    outputSize = outputShape.lens()
    numberOfOutput = outputShape.elements()
    print("output lens:", outputSize, "elements:", numberOfOutput)

    result = np.array(results[0])
    print(result)
    print("top-5 classes:", np.argsort(result[0])[::-1][:5].tolist())
    return result


if __name__ == "__main__":
    main()
