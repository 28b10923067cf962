"""Attention operators that static-shape IR ops cannot express.

Scaled dot-product attention itself is decomposed by the frontend into `dot`, `softmax` and
pointwise ops. Two jobs are operators here: `concat_past_present`, an in-place KV-cache update
whose position is a run-time value per batch entry (ONNX Runtime's GroupQueryAttention; MIGraphX
has an operator of the same name for the same job), and `linear_attention`, ONNX's
LinearAttention recurrence over the sequence (a loop with a state, like the RNN operators).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pygraphx.ir.shape import Shape
from pygraphx.ops.base import Op, ShapeError, check_arity, register_op


@register_op
class ConcatPastPresent(Op):
    """present [batch, heads, present_length, size] from a cache and new entries.

    Inputs: `past_lens` [batch] (integers: cached entries kept per batch entry), `new`
    [batch, heads, seq, size] and optionally `past` [batch, heads, past_length, size]. Row `t` of
    batch entry `b` is `past[b, :, t]` for `t < past_lens[b]`, `new[b, :, t - past_lens[b]]` for
    the next `seq` rows and zero after that (rows past `present_length` are dropped).
    """

    name = "concat_past_present"
    present_length: int = 0

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 2, 3)
        lens, new = inputs[0], inputs[1]
        if lens.ndim() != 1 or lens.type() not in ("int32_type", "int64_type"):
            raise ShapeError(f"{self.name}: past_lens must be a 1-D int32/int64 tensor")
        if new.ndim() != 4 or new.lens()[0] != lens.lens()[0]:
            raise ShapeError(
                f"{self.name}: new must be [batch, heads, seq, size] with batch "
                f"{lens.lens()[0]}, got {new.lens()}"
            )
        if len(inputs) == 3:
            past = inputs[2]
            pl, nl = past.lens(), new.lens()
            if past.ndim() != 4 or pl[:2] != nl[:2] or pl[3] != nl[3] or past.type() != new.type():
                raise ShapeError(
                    f"{self.name}: past {past.type()} {pl} does not match new {new.type()} {nl}"
                )
        if self.present_length <= 0:
            raise ShapeError(f"{self.name}: present_length must be positive")
        b, n, _, h = new.lens()
        return Shape(new.type(), [b, n, self.present_length, h])

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        lens, new = np.asarray(args[0]), args[1]
        past = args[2] if len(args) == 3 else None
        out = np.zeros(output_shape.lens(), dtype=output_shape.dtype())
        total = self.present_length
        seq = new.shape[2]
        for b, kept in enumerate(lens.tolist()):
            kept = max(0, min(int(kept), total))
            if past is not None:
                kept = min(kept, past.shape[2])
                out[b, :, :kept] = past[b, :, :kept]
            end = min(kept + seq, total)
            out[b, :, kept:end] = new[b, :, : end - kept]
        return out


LINEAR_ATTENTION_RULES = ("linear", "gated", "delta", "gated_delta")


@register_op
class LinearAttention(Op):
    """ONNX LinearAttention's recurrence over the sequence, computed in float32.

    Inputs: query [B, T, Hq*dk], key [B, T, Hkv*dk], value [B, T, Hkv*dv], state
    [B, Hkv, dk, dv], then decay [B, T, Hkv or Hkv*dk] for the gated rules and beta
    [B, T, Hkv or 1] for the delta rules. `output` selects the result: `output`
    ([B, T, Hq*dv] in the query's type) or `present_state` (the final state, in the state's).
    """

    name = "linear_attention"
    update_rule: str = "gated_delta"
    q_num_heads: int = 1
    kv_num_heads: int = 1
    scale: float = 0.0
    output: str = "output"

    def gated(self) -> bool:
        return self.update_rule in ("gated", "gated_delta")

    def delta(self) -> bool:
        return self.update_rule in ("delta", "gated_delta")

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        if self.update_rule not in LINEAR_ATTENTION_RULES:
            rules = ", ".join(LINEAR_ATTENTION_RULES)
            raise ShapeError(f"{self.name}: update_rule {self.update_rule!r} is not one of {rules}")
        check_arity(self, inputs, 4 + self.gated() + self.delta())
        q, k, v, state = inputs[:4]
        hq, hkv = self.q_num_heads, self.kv_num_heads
        if hq <= 0 or hkv <= 0 or hq % hkv:
            raise ShapeError(f"{self.name}: {hq} query heads cannot share {hkv} key heads")
        for what, s, heads in (("query", q, hq), ("key", k, hkv), ("value", v, hkv)):
            if s.ndim() != 3 or s.lens()[2] % heads or s.lens()[:2] != q.lens()[:2]:
                raise ShapeError(
                    f"{self.name}: {what} must be [batch, seq, heads * size] like the query, "
                    f"got {s.lens()}"
                )
        b, t, _ = q.lens()
        dk, dv = q.lens()[2] // hq, v.lens()[2] // hkv
        if k.lens()[2] != hkv * dk:
            raise ShapeError(f"{self.name}: key size {k.lens()[2]} != {hkv} x {dk}")
        if state.lens() != [b, hkv, dk, dv]:
            raise ShapeError(f"{self.name}: state must be {[b, hkv, dk, dv]}, got {state.lens()}")
        if self.output == "present_state":
            return Shape(state.type(), state.lens())
        if self.output != "output":
            raise ShapeError(f"{self.name}: output {self.output!r} is not output/present_state")
        return Shape(q.type(), [b, t, hq * dv])

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        q, k, v, state = (np.asarray(a, dtype=np.float32) for a in args[:4])
        rest = [np.asarray(a, dtype=np.float32) for a in args[4:]]
        decay = rest.pop(0) if self.gated() else None
        beta = rest.pop(0) if self.delta() else None
        b, t, _ = q.shape
        hq, hkv = self.q_num_heads, self.kv_num_heads
        dk, dv = q.shape[2] // hq, v.shape[2] // hkv

        def heads(x: np.ndarray, n: int) -> np.ndarray:  # [B, T, n*d] -> [B, n, T, d]
            return x.reshape(b, t, n, -1).transpose(0, 2, 1, 3)

        q4, k4, v4 = heads(q, hq), heads(k, hkv), heads(v, hkv)
        g4 = None if decay is None else heads(decay, hkv)  # [B, Hkv, T, 1 or dk]
        b4 = None if beta is None else heads(beta, beta.shape[2])  # [B, Hkv or 1, T, 1]
        scale = self.scale or 1 / np.sqrt(dk)
        state = state.copy()
        out = np.zeros((b, hq, t, dv), dtype=np.float32)
        for i in range(t):
            k_t, v_t = k4[:, :, i], v4[:, :, i]
            if g4 is not None:
                state = state * np.exp(g4[:, :, i])[..., None]
            if b4 is not None:
                retrieved = np.einsum("bhdm,bhd->bhm", state, k_t)
                v_t = b4[:, :, i] * (v_t - retrieved)
            state = state + k_t[..., :, None] * v_t[..., None, :]
            read = np.repeat(state, hq // hkv, axis=1)
            out[:, :, i] = scale * np.einsum("bhd,bhdm->bhm", q4[:, :, i], read)
        if self.output == "present_state":
            return state.astype(output_shape.dtype())
        return out.transpose(0, 2, 1, 3).reshape(b, t, hq * dv).astype(output_shape.dtype())
