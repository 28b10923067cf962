"""Compile Triton kernels with Triton's real compiler for GPU targets, no GPU needed.

Run as a script in a fresh process (the interpreter, once used, leaves `triton.language`
patched in its process): `python aot_compile.py JOBS.json`. Each job names its kernel either
as a generated source file (`path`, whose `kernel` is compiled with constexpr `BLOCK` =
`block`) or as a `@triton.jit` function of an importable module (`kernel`: "module:name",
with its `constexprs`); and gives its `signature`, and optionally `attrs` (the arguments
Triton's launcher would mark 16-divisible: aligned pointers and strides), `options`
(`num_warps`, `num_stages`), `targets` ([backend, arch, warp size] lists; default sm_90 and
gfx942) and a `name`. Prints `ok <target> <name> shared=<bytes>` per compile, or
`fail <target> <name>: <error>` and goes on; exits 1 when any compile failed. Tests call
`run_jobs`, which runs it so.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

TARGETS = [("cuda", 90, 32), ("hip", "gfx942", 64)]


def _kernel(job: dict):
    """The job's `@triton.jit` function and its constexprs."""
    if "path" in job:
        spec = importlib.util.spec_from_file_location(f"aot_{len(sys.modules)}", job["path"])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.kernel, {"BLOCK": job["block"]}
    module_name, attr = job["kernel"].split(":")
    return getattr(importlib.import_module(module_name), attr), job.get("constexprs", {})


def _compile(job: dict, target: tuple) -> int:
    """Compile `job` for `target`; its shared memory in bytes."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn, constexprs = _kernel(job)
    names = list(fn.arg_names)
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in job.get("attrs", [])}
    src = ASTSource(fn=fn, signature=job["signature"], constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget(*target), options=job.get("options"))
    assert compiled.asm, job.get("name", job.get("path"))
    return int(compiled.metadata.shared)


def _reason(exc: BaseException) -> str:
    """The innermost kernel line a `CompilationError` points at, and the root cause."""
    chain = [exc]
    while chain[-1].__cause__ is not None:
        chain.append(chain[-1].__cause__)
    where = ""
    for err in chain:
        lines = str(err).strip().splitlines()
        carets = [i for i, line in enumerate(lines) if line.strip() == "^"]
        if lines and lines[0].startswith("at ") and carets and carets[-1] > 1:
            where = f"{lines[0]} {lines[carets[-1] - 1].strip()}"
    root = chain[-1]
    return f"{where} <- {type(root).__name__}: {root}".replace("\n", " | ")


def main(jobs_path: str) -> int:
    """Compile every job for each of its targets; 1 when any compile failed."""
    failed = 0
    for job in json.loads(open(jobs_path).read()):
        name = job.get("name", job.get("path"))
        for target in job.get("targets", TARGETS):
            try:
                shared = _compile(job, tuple(target))
            except Exception as exc:  # noqa: BLE001 - each failure is reported, exit status 1
                failed += 1
                print("fail", target[0], name + ":", _reason(exc), flush=True)
                continue
            print("ok", target[0], name, f"shared={shared}", flush=True)
    return 1 if failed else 0


def run_jobs(jobs: list[dict], where: Path, timeout: int = 600) -> list[str]:
    """Compile `jobs` in a fresh process without `TRITON_INTERPRET`, importing this checkout
    (files under `where`); the `ok` lines. An AssertionError lists every compile that
    failed."""
    path = where / "jobs.json"
    path.write_text(json.dumps(jobs))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = str(Path(__file__).resolve().parents[2])  # this checkout's pygraphx and tests
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    run = subprocess.run(
        [sys.executable, __file__, str(path)], capture_output=True, text=True, env=env,
        timeout=timeout,
    )  # fmt: skip
    lines = run.stdout.splitlines()
    failed = [line for line in lines if line.startswith("fail ")]
    assert run.returncode == 0 and not failed, "\n".join(failed) or run.stderr[-3000:]
    return [line for line in lines if line.startswith("ok ")]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
