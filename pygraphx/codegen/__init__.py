"""Code generation from one description of the maths.

`trace.py` turns a fused `pointwise` / `fused_reduce` group of the IR into torch-free data (a
`GroupTrace`: inputs with lens/strides/dtypes, the steps as ops-handler primitive calls, the
reduction and the output) and runs that description through any `OpsHandler` (numpy, torch);
`triton/` writes it as a Triton kernel. Sits above `runtime`, below `targets`: imports only
`ir` and `ops`.
"""
