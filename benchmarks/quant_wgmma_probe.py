"""Why the 8-bit Triton GEMMs lag on Hopper: what Triton compiles them to, and how fast.

    python benchmarks/quant_wgmma_probe.py [--json out.json] [--aot]

For a conv-like product (M = 32*56*56, N = 64, K = 576: ResNet-50's 3x3 64-channel layer as
an implicit GEMM) and a BERT-base one (M = 4096, N = 3072, K = 768), one small GEMM kernel in
four operand flavours, each at a few tile configurations:

* `int8`: int8 tiles, int32 sums (`quant_kernels._int8_gemm_kernel`'s main loop);
* `fp8_bytes`: fp8 e4m3 read as bytes and bitcast after the load (float32 sums, promoted every
  32 products: the repository's `_dot8`);
* `fp8_ptr`: the pointers bitcast to fp8 before the load (the same sums);
* `fp16`: half tiles, float32 sums (what Triton pipelines best).

Each compiled kernel reports its TTGIR facts: the MMA version (3 = Hopper's wgmma), the
`warp_group_dot_wait` pendings in the loop (0 = each MMA waited for at once; 1 = the next
iteration's MMA issued while this one runs), `local_load`s in the loop (an operand going
through registers), registers, spills, shared memory; and its median time (CUDA, do_bench).
Also the real `quant_conv_kernels._conv_kernel` (int8, 3x3) at fixed tiles and, as peers,
cuBLAS (`torch.matmul` half, `torch._int_mm`, `torch._scaled_mm`) and cuDNN half.

`--aot` compiles for sm_90 without a GPU (Triton's own compiler, no timing).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

INT8, FP8_BYTES, FP8_PTR, FP16 = 0, 1, 2, 3
FLAVOURS = {"int8": INT8, "fp8_bytes": FP8_BYTES, "fp8_ptr": FP8_PTR, "fp16": FP16}
SHAPES = {"conv3x3_64": (32 * 56 * 56, 64, 576), "bert_ffn_up": (4096, 3072, 768)}
#: (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) per shape; the first is the flavours' common one
CONFIGS = {
    "conv3x3_64": [
        (128, 64, 64, 4, 4), (128, 128, 64, 4, 4), (128, 64, 64, 4, 3), (256, 64, 64, 8, 4),
        (64, 64, 64, 4, 5),
    ],
    "bert_ffn_up": [
        (128, 128, 128, 8, 3), (128, 256, 128, 8, 3), (128, 128, 128, 4, 3), (128, 128, 64, 4, 4),
        (128, 128, 256, 8, 2), (256, 128, 128, 8, 3),
    ],
}  # fmt: skip
#: how many of a shape's configurations each flavour runs (int8: all)
RUNS = {"int8": 99, "fp8_bytes": 1, "fp8_ptr": 2, "fp16": 1}


@triton.jit
def _probe_kernel(
    a_ptr, w_ptr, out_ptr, M, N, K, stride_am, stride_wn, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DT: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    num_m, num_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    group = 8 * num_n
    first_m = (pid // group) * 8
    size_m = tl.minimum(num_m - first_m, 8)
    rows = (first_m + (pid % group) % size_m) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = ((pid % group) // size_m) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    if DT == 2:
        a_ptr = a_ptr.to(tl.pointer_type(tl.float8e4nv), bitcast=True)
        w_ptr = w_ptr.to(tl.pointer_type(tl.float8e4nv), bitcast=True)
    if DT == 0:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ks
        a_mask = (rows[:, None] < M) & (kk[None, :] < K)
        a = tl.load(a_ptr + rows[:, None] * stride_am + kk[None, :], mask=a_mask, other=0.0)
        w_mask = (cols[None, :] < N) & (kk[:, None] < K)
        w = tl.load(w_ptr + cols[None, :] * stride_wn + kk[:, None], mask=w_mask, other=0.0)
        if DT == 0:
            acc = tl.dot(a, w, acc, out_dtype=tl.int32)
        elif DT == 1:
            a8, w8 = a.to(tl.float8e4nv, bitcast=True), w.to(tl.float8e4nv, bitcast=True)
            acc = tl.dot(a8, w8, acc, out_dtype=tl.float32, max_num_imprecise_acc=32)
        elif DT == 2:
            acc = tl.dot(a, w, acc, out_dtype=tl.float32, max_num_imprecise_acc=32)
        else:
            acc = tl.dot(a, w, acc, out_dtype=tl.float32)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    y = acc.to(tl.float32).to(tl.float16)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], y, mask=mask)


def facts(ttgir: str, ptx: str) -> dict:
    """What the TTGIR / PTX of one kernel say about its MMA and its main loop."""
    loop = ttgir[ttgir.find("scf.for") :]
    loop = loop[: loop.find("scf.yield")]
    return {
        "mma": sorted(set(re.findall(r"versionMajor = (\d)", ttgir))),
        "pendings": [int(p) for p in re.findall(r"pendings = (\d+)", ttgir)],
        "loop_local_loads": loop.count("ttg.local_load"),
        "loop_local_allocs": loop.count("ttg.local_alloc"),
        "async_copies": ttgir.count("ttg.async_copy_global_to_local"),
        "wgmma": ptx.count("wgmma.mma_async"),
        "mma_sync": ptx.count("mma.sync"),
    }


def _operands(flavour: int, m: int, n: int, k: int, dev: str):
    a = torch.randint(-8, 8, (m, k), device=dev, dtype=torch.int8)
    w = torch.randint(-8, 8, (n, k), device=dev, dtype=torch.int8)
    if flavour in (FP8_BYTES, FP8_PTR):  # the bytes of small fp8 values
        a = (a.float() / 4).to(torch.float8_e4m3fn).view(torch.uint8)
        w = (w.float() / 4).to(torch.float8_e4m3fn).view(torch.uint8)
    elif flavour == FP16:
        a, w = a.half(), w.half()
    return a, w


def run_probe(flavour: int, shape: str, config: tuple, timed: bool) -> dict:
    """Compile (and on CUDA time) `_probe_kernel` for one flavour, shape and configuration."""
    m, n, k = SHAPES[shape]
    bm, bn, bk, warps, stages = config
    a, w = _operands(flavour, m, n, k, "cuda")
    out = torch.empty(m, n, device="cuda", dtype=torch.half)
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)

    def launch():
        return _probe_kernel[grid](
            a, w, out, m, n, k, a.stride(0), w.stride(0), out.stride(0),
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, DT=flavour, num_warps=warps, num_stages=stages,
        )  # fmt: skip

    kernel = launch()
    row = facts(kernel.asm["ttgir"], kernel.asm["ptx"])
    row.update(regs=kernel.n_regs, spills=kernel.n_spills, smem=kernel.metadata.shared)
    row["exact"] = bool(torch.equal(out, _reference(flavour, a, w)))
    if timed:
        row["ms"] = median_ms(launch)
        row["tops"] = 2 * m * n * k / row["ms"] / 1e9
    return row


def _reference(flavour: int, a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The product in float64 (exact for these small operands), rounded to half."""
    if flavour in (FP8_BYTES, FP8_PTR):
        a, w = a.view(torch.float8_e4m3fn), w.view(torch.float8_e4m3fn)
    return (a.double() @ w.double().t()).half()


def median_ms(fn) -> float:
    fn()
    torch.cuda.synchronize()
    return float(triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median"))


def aot_probe(flavour: int, shape: str, config: tuple) -> dict:
    """`run_probe`'s facts from an sm_90 compile without a GPU."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    bm, bn, bk, warps, stages = config
    ty = {INT8: "i8", FP8_BYTES: "u8", FP8_PTR: "u8", FP16: "fp16"}[flavour]
    sig = {"a_ptr": "*" + ty, "w_ptr": "*" + ty, "out_ptr": "*fp16"}
    sig.update({name: "i32" for name in ("M", "N", "K", "stride_am", "stride_wn", "stride_om")})
    consts = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "DT": flavour}
    sig.update({name: "constexpr" for name in consts})
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(9)}
    src = ASTSource(fn=_probe_kernel, signature=sig, constexprs=consts, attrs=attrs)
    options = {"num_warps": warps, "num_stages": stages}
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    row = facts(compiled.asm["ttgir"], compiled.asm["ptx"])
    row["smem"] = compiled.metadata.shared
    return row


def conv_rows() -> dict:
    """The real int8 convolution kernel (3x3, 64 channels, 56x56, batch 32) at fixed tiles,
    and cuDNN half on the same layer."""
    import torch.nn.functional as F

    from pygraphx.targets.gpu import quant_conv_kernels as qck
    from pygraphx.targets.gpu import quant_kernels as qk

    n, c, h, w_, c_out = 32, 64, 56, 56, 64
    cl = torch.channels_last
    x8 = torch.randint(-8, 8, (n, c, h, w_), device="cuda", dtype=torch.int8).contiguous(
        memory_format=cl
    )
    w8 = torch.randint(-8, 8, (c_out, 9 * c), device="cuda", dtype=torch.int8)
    scale = torch.rand(c_out, device="cuda") * 1e-3
    out = torch.empty(n * h * w_, c_out, device="cuda", dtype=torch.half)
    extra, codes = qk._epilogue_args(scale, None, None)
    args = (
        x8, w8, scale, out, n * h * w_, c_out, 9 * c, c, h, w_, h, w_, *_nhwc_strides(x8),
        w8.stride(0), out.stride(0), 1, 1, 1, 1, 1, 1, 3,
    )  # fmt: skip
    rows = {}
    for bm, bn, bk, warps, stages in CONFIGS["conv3x3_64"][:3]:
        config = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}

        def launch(config=config, warps=warps, stages=stages):
            return qck._conv_kernel[qk._grid(n * h * w_, c_out, config)](
                *args, *extra, **codes, FP8=False, MODE=qck.IMPLICIT, **config,
                num_warps=warps, num_stages=stages,
            )  # fmt: skip

        kernel = launch()
        row = facts(kernel.asm["ttgir"], kernel.asm["ptx"])
        row.update(regs=kernel.n_regs, spills=kernel.n_spills, smem=kernel.metadata.shared)
        row["ms"] = median_ms(launch)
        rows[f"conv_int8 {bm}x{bn}x{bk} w{warps} s{stages}"] = row
    xh = torch.randn(n, c, h, w_, device="cuda").half().contiguous(memory_format=cl)
    wh = torch.randn(c_out, c, 3, 3, device="cuda").half().contiguous(memory_format=cl)
    rows["cudnn_fp16"] = {"ms": median_ms(lambda: F.conv2d(xh, wh, None, 1, 1))}
    return rows


def _nhwc_strides(x: torch.Tensor) -> tuple[int, int, int, int]:
    sn, sc, sh, sw = x.stride()
    return sn, sh, sw, sc


def peer_rows(shape: str) -> dict:
    """cuBLAS on the same product: half matmul, int8 `_int_mm` (int32 out), fp8 `_scaled_mm`."""
    m, n, k = SHAPES[shape]
    a, w = _operands(INT8, m, n, k, "cuda")
    ah, wh = a.half(), w.half()
    af, wf = (a.float() / 4).to(torch.float8_e4m3fn), (w.float() / 4).to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    return {
        "cublas_fp16": {"ms": median_ms(lambda: ah @ wh.t())},
        "cublas_int_mm": {"ms": median_ms(lambda: torch._int_mm(a, w.t()))},
        "cublas_scaled_mm": {
            "ms": median_ms(
                lambda: torch._scaled_mm(af, wf.t(), scale_a=one, scale_b=one, out_dtype=torch.half)
            )
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--aot", action="store_true", help="compile for sm_90 only (no GPU)")
    args = ap.parse_args()
    timed = not args.aot
    if timed:
        print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    print(f"triton {triton.__version__}")
    result: dict = {}
    for shape, configs in CONFIGS.items():
        rows = {}
        for name, flavour in FLAVOURS.items():
            for config in configs[: RUNS[name]]:
                key = f"{name} {config[0]}x{config[1]}x{config[2]} w{config[3]} s{config[4]}"
                try:
                    rows[key] = (
                        run_probe(flavour, shape, config, timed)
                        if timed
                        else aot_probe(flavour, shape, config)
                    )
                except Exception as exc:  # noqa: BLE001 - a probe reports, it does not stop
                    rows[key] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                print(f"  {shape} {key}: {rows[key]}", flush=True)
        if timed:
            rows.update(peer_rows(shape))
            if shape == "conv3x3_64":
                rows.update(conv_rows())
            for key in [k for k in rows if k.startswith(("cublas", "cudnn", "conv_"))]:
                print(f"  {shape} {key}: {rows[key]}", flush=True)
        result[shape] = rows
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
