"""Version numbers: the package, the highest ONNX opset the frontend targets."""

__version__ = "0.1.0"
ONNX_OPSET = 23
