"""`ops.literal_views.wide_vector`: the float32 value of the rounded vector a view of a
`RoundedLiteral` repeats, given only where the view does repeat it, in order (checked on the
view's own values at compile time: rounding the wide vector must give them). Oracle: numpy's
indexing of the same vector (the view's values as the ops compute them are not used to build
the expectations)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from pygraphx.ir.argument import RoundedLiteral
from pygraphx.ir.program import Program
from pygraphx.ops import make_op
from pygraphx.ops.literal_views import wide_vector

BF = ml_dtypes.bfloat16
RNG = np.random.default_rng(151)


def _literal(shape: tuple[int, ...], dtype=BF):  # noqa: ANN202
    """A module and a rounded literal of `shape` whose float32 values differ from the rounded
    ones (so a wrong `wide` could not pass as the rounded values)."""
    wide = (RNG.standard_normal(shape) * 7).astype(np.float32)
    low = wide.astype(dtype)
    assert not np.array_equal(low.astype(np.float32), wide)
    m = Program().get_main_module()
    return m, m.add_literal(RoundedLiteral(low, wide)), wide


def _views(m, ins, *ops):  # noqa: ANN202
    for name, attrs in ops:
        ins = m.add_instruction(make_op(name, **attrs), [ins])
    return ins


@pytest.mark.parametrize("dtype", [BF, np.float16])
def test_broadcast_bias_gives_the_wide_vector(dtype) -> None:
    m, lit, wide = _literal((16,), dtype)
    view = _views(m, lit, ("broadcast", {"axis": 1, "out_lens": (2, 16, 5, 3)}))
    got = wide_vector(view, 16)
    assert got is not None and np.array_equal(got, wide)
    assert wide_vector(lit, 16) is not None  # the literal itself
    # a (1, 16, 1, 1) literal reshaped and broadcast, as a folded batch norm's bias
    m, lit, wide = _literal((1, 16, 1, 1), dtype)
    view = _views(m, lit, ("multibroadcast", {"out_lens": (1, 16, 4, 4)}))
    assert np.array_equal(wide_vector(view, 16), wide.reshape(16))
    row = _views(m, lit, ("reshape", {"dims": (16,)}),
                 ("multibroadcast", {"out_lens": (3, 7, 16)}))  # fmt: skip
    assert np.array_equal(wide_vector(row, 16), wide.reshape(16))  # a GEMM's bias


def test_reordering_view_gives_none() -> None:
    """A permutation of the 16 values (reshape to 4x4, transpose, reshape back): the vector's
    size and shape pass, its order does not."""
    m, lit, wide = _literal((16,))
    view = _views(
        m,
        lit,
        ("reshape", {"dims": (4, 4)}),
        ("transpose", {"permutation": (1, 0)}),
        ("reshape", {"dims": (1, 16, 1, 1)}),
        ("multibroadcast", {"out_lens": (1, 16, 3, 3)}),
    )
    assert not np.array_equal(wide.reshape(4, 4).T.reshape(16), wide)  # (it does reorder)
    assert wide_vector(view, 16) is None


def test_sliced_and_repeated_view_gives_none() -> None:
    """The first 8 values, each repeated twice (16 values again): part of the vector."""
    m, lit, wide = _literal((16,))
    view = _views(
        m,
        lit,
        ("slice", {"axes": (0,), "starts": (0,), "ends": (8,)}),
        ("reshape", {"dims": (8, 1)}),
        ("multibroadcast", {"out_lens": (8, 2)}),
        ("reshape", {"dims": (1, 16)}),
    )
    assert wide_vector(view, 16) is None
    every_other = _views(m, lit, ("step", {"axes": (0,), "steps": (2,)}))
    assert wide_vector(every_other, 8) is None  # (8 of the 16: the size already differs)


def test_vector_broadcast_along_the_wrong_axis_is_still_found() -> None:
    """The values repeated along any one axis of n values count (the callers check which
    axis varies); a 2-D array is no vector."""
    m, lit, wide = _literal((16,))
    col = _views(m, lit, ("reshape", {"dims": (16, 1)}),
                 ("multibroadcast", {"out_lens": (16, 16)}))  # fmt: skip
    assert np.array_equal(wide_vector(col, 16), wide)
    m, lit, _ = _literal((2, 8))
    assert wide_vector(lit, 16) is None
