"""What the int8 quantise's arithmetic costs on the device, per formulation.

    python benchmarks/quantise_cost.py [--json out.json]

Times (device only, `codegen/triton/timing.py`) an element-wise half -> int8 quantise over
BERT-base batch-32 tensors ([4096, 768] and [4096, 3072]) with each formulation of
`saturate(rint(x / scale))` below, and BERT's `add, add, layer norm` group writing its int8
quantise too (`group_tune_ab.layer_norm_group`) with each formulation in place of
`quantise.int8_code`, at every launch configuration the autotune tries:

* `f2i`: `quantise.int8_code` as it was: `div_rn`, clamp, `(r + MAGIC) - MAGIC`, NaN select, a
  float -> int8 conversion;
* `bits`: `div_rn`, clamp, then the integer read from the bits of `r + MAGIC` (its low byte:
  no float -> int conversion);
* `rcp` (not exact: x times 1/scale, to see what the division costs) and `none` (a plain cast:
  the memory floor);
* `current`: `quantise.int8_code` as it is now (`bits`), and `rows`: `quantise.int8_code_rows`
  (`saturating_quotient`: one reciprocal a program and two fma corrections an element, then
  the code from the bits), which row kernels use.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import triton  # noqa: E402
from group_tune_ab import _tensor, layer_norm_group  # noqa: E402

from pygraphx.codegen.triton.build import candidates  # noqa: E402
from pygraphx.codegen.triton.kernels import QuantOutput, kernel_source  # noqa: E402
from pygraphx.codegen.triton.timing import time_candidates  # noqa: E402

VARIANTS = """
import triton
import triton.language as tl

from pygraphx.codegen.triton.quantise import int8_code as q_current
from pygraphx.codegen.triton.quantise import int8_code_rows as q_rows


@triton.jit
def q_f2i(x, scale, MAGIC: tl.constexpr):
    v = tl.math.div_rn(x, scale)
    r = tl.minimum(tl.maximum(v, -128.0), 127.0)
    r = (r + MAGIC) - MAGIC
    return tl.where(v != v, -128.0, r).to(tl.int8)


@triton.jit
def q_bits(x, scale, MAGIC: tl.constexpr):
    v = tl.math.div_rn(x, scale)
    r = tl.minimum(tl.maximum(v, -128.0), 127.0)
    k = (r + MAGIC).to(tl.int32, bitcast=True)
    return tl.where(v != v, -128, k).to(tl.int8)


@triton.jit
def q_rcp(x, scale, MAGIC: tl.constexpr):
    v = x * (1.0 / scale)
    r = tl.minimum(tl.maximum(v, -128.0), 127.0)
    k = (r + MAGIC).to(tl.int32, bitcast=True)
    return tl.where(v != v, -128, k).to(tl.int8)


@triton.jit
def q_none(x, scale, MAGIC: tl.constexpr):
    return x.to(tl.int8)


@triton.jit
def elementwise(x_ptr, s_ptr, out_ptr, n, BLOCK: tl.constexpr, WHICH: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(s_ptr)
    if WHICH == 0:
        q = q_f2i(x, s, 12582912.0)
    elif WHICH == 1:
        q = q_bits(x, s, 12582912.0)
    elif WHICH == 2:
        q = q_rcp(x, s, 12582912.0)
    elif WHICH == 3:
        q = q_none(x, s, 12582912.0)
    elif WHICH == 4:
        q = q_current(x, s, 12582912.0)
    else:
        q = q_rows(x, s, 12582912.0)
    tl.store(out_ptr + offs, q, mask=mask)
"""
NAMES = ["f2i", "bits", "rcp", "none", "current", "rows"]


def _module(path: Path, text: str, name: str):
    import importlib.util

    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def elementwise_times(mod, scale: torch.Tensor) -> dict:
    found = {}
    for cols in (768, 3072):
        x = torch.randn(4096, cols, device="cuda").to(torch.float16) * 4
        out = torch.empty(4096, cols, dtype=torch.int8, device="cuda")
        n = x.numel()
        grid = (triton.cdiv(n, 1024),)
        runs = [
            lambda w=w, x=x, out=out, n=n, g=grid: mod.elementwise[g](
                x, scale, out, n, BLOCK=1024, WHICH=w, num_warps=4
            )
            for w in range(len(NAMES))
        ]
        times = time_candidates(runs)
        found[cols] = dict(zip(NAMES, (t * 1e3 for t in times), strict=True))
        print(f"  elementwise [4096, {cols}]: " + _fmt(found[cols]))
    return found


#: the import line of a generated kernel with a quantised output (`kernels._QUANT_IMPORT`)
QUANT_IMPORT = (
    "from pygraphx.codegen.triton.quantise import "
    "fp8_code, fp8_code_rows, int8_code, int8_code_rows"
)


def layer_norm_times(
    where: Path, scale: torch.Tensor, code: str = "int8", imports: dict | None = None
) -> dict:
    """BERT's layer-norm group quantising to `code` with each of `imports` (name -> the line
    that imports the row quantise in place of `QUANT_IMPORT`; by default `NAMES`' forms as
    `int8_code_rows`), at every launch configuration the autotune tries."""
    if imports is None:
        names = [n for n in NAMES if n != "none"]
        imports = {n: f"from quantise_variants import q_{n} as int8_code_rows" for n in names}
    _, group = layer_norm_group(4096)
    source = kernel_source(group, QuantOutput(code, store=True))
    assert QUANT_IMPORT in source.source, "the generated import line changed"
    xs = [_tensor(d) for d in group.inputs]
    out = torch.empty(4096, 768, dtype=torch.float16, device="cuda")
    qtype = torch.int8 if code == "int8" else torch.uint8
    q = torch.empty(4096, 768, dtype=qtype, device="cuda")
    found = {}
    for name, line in imports.items():
        text = source.source.replace(QUANT_IMPORT, line)
        kernel = _module(where / f"ln_{code}_{name}.py", text, f"ln_{code}_{name}").kernel
        options = candidates(source)
        runs = [lambda c=c, k=kernel: k[(4096,)](*xs, out, scale, q, **c) for c in options]
        times = time_candidates(runs)
        found[name] = {f"w{c['num_warps']}": t * 1e3 for c, t in zip(options, times, strict=True)}
        print(f"  layer norm + {code} ({name}): " + _fmt(found[name]))
    return found


def _fmt(times: dict) -> str:
    return "  ".join(f"{k} {v:6.2f} us" for k, v in times.items())


def run_ab(description: str, variants: str, module: str, timers: dict) -> int:
    """Parse `--json`, write `variants` as the importable module `module` (in a temporary
    folder also on the path) and call each of `timers` (name -> f(module, folder, scale))
    with a 0.05 scale; their results (by name) go to the JSON file."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print(f"{sys.argv[0]} needs a CUDA/ROCm GPU", file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    scale = torch.tensor([0.05], dtype=torch.float32, device="cuda")
    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, tmp)
        mod = _module(Path(tmp) / f"{module}.py", variants, module)
        result = {name: timer(mod, Path(tmp), scale) for name, timer in timers.items()}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


def main() -> int:
    timers = {
        "elementwise": lambda mod, _, scale: elementwise_times(mod, scale),
        "layer_norm": lambda _, tmp, scale: layer_norm_times(tmp, scale),
    }
    return run_ab(__doc__.splitlines()[0], VARIANTS, "quantise_variants", timers)


if __name__ == "__main__":
    sys.exit(main())
