"""Compile generated kernel sources with Triton's real compiler for GPU targets, no GPU needed.

Run as a script in a fresh process (the interpreter, once used, leaves `triton.language`
patched in its process): `python aot_compile.py JOBS.json`, where each job gives a source
file, its signature and its `BLOCK`; prints one `ok <target> <file>` line per compile.
"""

from __future__ import annotations

import importlib.util
import json
import sys

TARGETS = [("cuda", 90, 32), ("hip", "gfx942", 64)]


def main(jobs_path: str) -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    for job in json.loads(open(jobs_path).read()):
        spec = importlib.util.spec_from_file_location(f"aot_{len(sys.modules)}", job["path"])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for target in TARGETS:
            src = ASTSource(fn=module.kernel, signature=job["signature"],
                            constexprs={"BLOCK": job["block"]})  # fmt: skip
            compiled = triton.compile(src, target=GPUTarget(*target))
            assert compiled.asm, job["path"]
            print("ok", target[0], job["path"], flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
