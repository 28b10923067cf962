"""atheris harness: `pygraphx.loads` on mutated saved-program (.pgx) bytes.

Most mutations of a .pgx file stop at the SHA-256 check, so half of the inputs are re-sealed
(header length and digest recomputed: `fuzz.targets.reseal`) to reach the msgpack decoder and
the program rebuilder, as a deliberate attacker would. Any exception other than
`SerializationError` is a crash. Usage (from the repository root):

    python -m fuzz.pgx_load fuzz/corpus/pgx -max_total_time=600 -rss_limit_mb=4096
"""

from __future__ import annotations

import random
import sys

import atheris

with atheris.instrument_imports(include=["pygraphx"]):
    from fuzz.targets import load_pgx_bytes, reseal


def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
    mutated = atheris.Mutate(data, max_size)
    if random.Random(seed).random() < 0.5:
        return reseal(mutated)
    return mutated


def main() -> None:
    atheris.Setup(sys.argv, load_pgx_bytes, custom_mutator=custom_mutator)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
