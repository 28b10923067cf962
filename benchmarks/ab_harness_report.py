"""The A/B harness's checks and report (`benchmarks/ab_harness.py` has the whole story): the
outputs compared with ONNX Runtime's and with the first variant's, each output alone (`compare`:
who is off, against which tolerance), the printed table (`print_table`, `print_steps`,
`print_after`: the forms the notes quote) and the JSON record of one model (`case_record`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from benchmarks.ab_harness_timing import CLOCK_NAMES, Stats, Timing

TOL = {"f32": 1e-3, "bf16": 1e-1}


def rel_err(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """Relative RMS difference of `got` from `want`, pooled over all outputs (kept in the JSON
    as `*_pooled`; the check judges each output alone: `rel_errs`)."""
    if len(got) != len(want):
        raise ValueError(f"{len(got)} outputs against {len(want)}")
    pairs = zip(got, want, strict=True)
    num = sum(float(((np.asarray(g, np.float64) - w) ** 2).sum()) for g, w in pairs)
    den = sum(float((np.asarray(w, np.float64) ** 2).sum()) for w in want)
    if den == 0:
        return 0.0 if num == 0 else float("inf")
    return (num / den) ** 0.5


def rel_errs(got: list[np.ndarray], want: list[np.ndarray]) -> list[float]:
    """Relative RMS difference of each output of `got` from the same output of `want`."""
    if len(got) != len(want):
        raise ValueError(f"{len(got)} outputs against {len(want)}")
    return [rel_err([g], [w]) for g, w in zip(got, want, strict=True)]


def worst(errs: list[float], names: list[str]) -> tuple[float, str]:
    """The largest of `errs` (NaN counts as largest) and the name of its output."""
    if not errs:
        return 0.0, ""
    i = max(range(len(errs)), key=lambda k: (np.isnan(errs[k]), errs[k]))
    return errs[i], names[i] if i < len(names) else f"output {i}"


def output_names(data: bytes) -> list[str]:
    """The model's output names, in order (the external data is not read)."""
    import onnx

    model = onnx.load_from_string(data)
    return [o.name for o in model.graph.output]


def max_abs(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    return max(float(np.abs(np.asarray(g, np.float64) - w).max(initial=0.0))
               for g, w in zip(got, want, strict=True))  # fmt: skip


@dataclass
class Comparison:
    """Each variant's outputs against ORT float32 (`want`; None: `--no-ort`) and against the
    first variant's: per output (`errs`, `diffs`), the worst output's figure and name (`err`,
    `err_at`, `diff`, `diff_at`), the pooled figures and max abs differences (the JSON's), each
    variant's tolerance (`tols`; against the first variant the looser of the two, `tol_ref`),
    and who is off: `apart` (off the first variant), `bad` (blamed)."""

    first: str
    want: list[np.ndarray] | None
    onames: list[str]
    errs: dict[str, list[float]]
    err: dict[str, float]
    err_at: dict[str, str]
    diff: dict[str, float]
    diff_at: dict[str, str]
    err_pooled: dict[str, float]
    diff_pooled: dict[str, float]
    abs_ort: dict[str, float]
    abs_first: dict[str, float]
    tols: dict[str, float]
    tol_ref: dict[str, float]
    apart: list[str]
    bad: list[str]


def compare(outs: dict[str, list[np.ndarray]], want: list[np.ndarray] | None, onames: list[str],
            is_bf16: dict[str, bool], tol: float | None) -> Comparison:  # fmt: skip
    """`outs` (by variant, the first declared first) checked against `want` and against the
    first variant's; `is_bf16`: which take the bf16 tolerance (`tol`: one for all instead)."""
    names = list(outs)
    first = names[0]
    nan = float("nan")
    # each output judged alone (a small output badly wrong must not hide under a big one's
    # figures): the worst output's rel. RMS error, and its name; the pooled figure in the JSON
    errs = {n: rel_errs(o, want) if want else [nan] * len(o) for n, o in outs.items()}
    diffs = {n: rel_errs(o, outs[first]) for n, o in outs.items()}
    err, err_at = {}, {}
    diff, diff_at = {}, {}
    for n in names:
        err[n], err_at[n] = worst(errs[n], onames) if want else (nan, "")
        diff[n], diff_at[n] = worst(diffs[n], onames)
    err_pooled = {n: rel_err(o, want) if want else nan for n, o in outs.items()}
    diff_pooled = {n: rel_err(o, outs[first]) for n, o in outs.items()}
    abs_ort = {n: max_abs(o, want) if want else nan for n, o in outs.items()}
    abs_first = {n: max_abs(o, outs[first]) for n, o in outs.items()}
    # each variant's own tolerance (a bf16 one does not loosen the others'); against the
    # reference, the looser of the two
    tols = {n: tol if tol is not None else TOL["bf16" if is_bf16[n] else "f32"]
            for n in names}  # fmt: skip
    tol_ref = {n: max(tols[n], tols[first]) for n in names}
    # who is blamed: with ORT, a variant off the oracle, or off a reference that is itself
    # within tolerance of it; without ORT only the pair is known (`new vs old`: either may be
    # the wrong one)
    off_ort = [n for n in names if want is not None and not err[n] <= tols[n]]
    apart = [n for n in names if not diff[n] <= tol_ref[n]]
    if want is not None:
        bad = [n for n in names if n in off_ort or (n in apart and first not in off_ort)]
    else:
        bad = [f"{n} vs {first}" for n in apart]
    return Comparison(first, want, onames, errs, err, err_at, diff, diff_at, err_pooled,
                      diff_pooled, abs_ort, abs_first, tols, tol_ref, apart, bad)  # fmt: skip


def print_table(out, spec: str, threads: int, dtype: str, rounds: int, runs: int, cname: str,
                order: list[str], adaptation: str, stats: Stats, cmp: Comparison,
                described: dict[str, str], spread: bool) -> None:  # fmt: skip
    """The `#` header line, the table (one line a variant, as declared) and with `spread` the
    25th percentile blocks and paired ratios."""
    names, first = list(described), cmp.first
    med, best, paired = stats.med, stats.best, stats.paired
    print(f"# {spec} t{threads}: {adaptation}; run order "
          f"{', '.join(order)} (reversed every round{'; rotated' if len(order) > 2 else ''}); "
          f"ratios to {first}", file=out)  # fmt: skip
    print(f"{spec} t{threads} {dtype}, {rounds} rounds x {runs} runs, "
          f"{CLOCK_NAMES[cname]} ms a run (median over blocks, best block, ratio of medians to "
          f"{first}, median of the rounds' difference from it; process CPU ms; rel RMS err vs "
          f"ORT f32, worst output; rel RMS diff vs {first}, worst output):",
          file=out)  # fmt: skip
    for n in names:
        print(f"  {n:10s} {med[n]:9.2f} (best {best[n]:9.2f})  {med[n] / med[first]:.3f}  "
              f"{paired[n]:+8.2f}  cpu {stats.cpu_med[n]:9.2f}  err {cmp.err[n]:.1e}  "
              f"diff {cmp.diff[n]:.1e}  {described[n]}", file=out)  # fmt: skip
    if spread:
        print(f"  (the 25th percentile block, ms a run; the median of the rounds' ratios to "
              f"{first})", file=out)  # fmt: skip
        for n in names:
            print(f"  {n:10s} p25 {stats.p25[n]:9.2f}  paired {stats.paired_ratio[n]:.3f}",
                  file=out)  # fmt: skip
    out.flush()


def print_steps(per: dict[str, dict[str, float]], out, gemm14_kinds: bool = True,
                fast: dict[str, dict[str, float]] | None = None) -> None:  # fmt: skip
    """The per-kind table; `fast`: each step's fastest too, after a `|`."""
    names = list(per)
    if gemm14_kinds:
        from benchmarks.gemm14_profile import KINDS
    else:
        KINDS = sorted({k for n in names for k in per[n]})  # noqa: N806
    print("  kind        " + " ".join(f"{n:>10s}" for n in names) + "  (ms a run, each step's "
          "median)" + (" | (each step's fastest)" if fast else ""), file=out)  # fmt: skip
    for k in (*KINDS, "sum"):
        tables = [per, fast] if fast else [per]
        row = [[sum(t[n].values()) if k == "sum" else t[n].get(k, 0.0) for n in names]
               for t in tables]  # fmt: skip
        if any(v for part in row for v in part):
            print(f"  {k:10s} " + " | ".join(" ".join(f"{v:10.2f}" for v in part)
                                            for part in row), file=out)  # fmt: skip


def print_after(out, spec: str, after: float | None, timing: Timing, said: bool,
                cmp: Comparison) -> None:  # fmt: skip
    """After the table (and the steps, a wrapper's extra): the machine after and during the
    timing (`said`: `--wait-quiet` given; the others' share is said anyway past 15 %), then a
    MISMATCH line for each variant off."""
    during, others = timing.during, timing.others
    first = cmp.first
    if after is not None:
        print(f"# {spec}: machine after the timing: busy {after:.0%} over 2 s", file=out)
    if said or others > 0.15:
        print(f"# {spec}: machine during the timing: busy {during:.0%}, of which others "
              f"{others:.0%}" + (" (NOT quiet)" if others > 0.15 else ""), file=out)  # fmt: skip
    for n in cmp.apart if cmp.want is None else ():
        print(f"MISMATCH {spec} {n} vs {first}: rel RMS diff {cmp.diff[n]:.1e} (output "
              f"{cmp.diff_at[n]!r}), tolerance {cmp.tol_ref[n]:.0e}; no ORT reference (--no-ort): "
              "either may be the wrong one", file=out)  # fmt: skip
    for n in cmp.bad if cmp.want is not None else ():
        print(f"MISMATCH {spec} {n}: rel RMS err vs ORT {cmp.err[n]:.1e} (output "
              f"{cmp.err_at[n]!r}), diff vs {first} {cmp.diff[n]:.1e} (output {cmp.diff_at[n]!r}), "
              f"tolerance {cmp.tols[n]:.0e} (vs {first} {cmp.tol_ref[n]:.0e})",
              file=out)  # fmt: skip
    out.flush()


def case_record(spec: str, threads: int, dtype: str, cname: str, rounds: int, runs: int,
                order: list[str], before: str | None, after: float | None, timing: Timing,
                adapt: dict, stats: Stats, cmp: Comparison, described: dict[str, str],
                is_bf16: dict[str, bool], steps: tuple[dict, dict, str | None],
                more) -> dict:  # fmt: skip
    """One model's figures as `ab_case` returns them (the JSON's `models` entry); `steps`:
    (ms a run by kind, the same of each step's fastest, the `--steps` failure or None)."""
    first, names = cmp.first, list(described)
    med = stats.med
    step_ms, step_fast, step_error = steps
    return {
        "spec": spec, "threads": threads, "dtype": dtype, "clock": cname,
        "rounds": rounds, "runs": runs, "first": first, "reference": first,
        "run_order": order, "quiet_before": before,
        "busy_after": after, "busy_during": timing.during,
        "busy_others_during": timing.others, "adaptation": adapt,
        "tol": max(cmp.tols.values()), "ok": not cmp.bad,
        "mismatch": cmp.bad,
        "variants": {n: {"settings": described[n], "median_ms": med[n],
                         "best_ms": stats.best[n], "ratio": med[n] / med[first],
                         "paired_diff_ms": stats.paired[n], "p25_ms": stats.p25[n],
                         "paired_ratio": stats.paired_ratio[n],
                         "max_abs_diff_first": cmp.abs_first[n],
                         "cpu_ms": stats.cpu_med[n], "rel_err_ort": cmp.err[n],
                         "rel_err_ort_output": cmp.err_at[n],
                         "rel_err_ort_pooled": cmp.err_pooled[n],
                         "rel_err_ort_outputs": dict(zip(cmp.onames, cmp.errs[n], strict=False)),
                         "max_abs_diff_ort": cmp.abs_ort[n], "rel_diff_first": cmp.diff[n],
                         "rel_diff_first_output": cmp.diff_at[n],
                         "rel_diff_first_pooled": cmp.diff_pooled[n], "tol": cmp.tols[n],
                         "tol_first": cmp.tol_ref[n], "bf16": is_bf16[n],
                         "blocks_ms": timing.times[n], "cpu_blocks_ms": timing.cpu[n]}
                     for n in names},
        "steps_ms": step_ms, "steps_fastest_ms": step_fast, "steps_error": step_error,
        "extra": more,
    }  # fmt: skip
