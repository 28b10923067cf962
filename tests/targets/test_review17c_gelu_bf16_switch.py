"""Review17c: `PGX_CPU_GELU_ERF_MIDDLE=0` reaches the opt-in bf16 pass.

Until gelufix17 `gelu_erf_f32_bf16` (gelu.c) called `vm_gelu_erf3_ps` unconditionally while
`native_gelu.GeluErf` honoured the switch; so with the switch off the bf16 pass was no longer
"the float32 pass's value rounded once" (gelu16's contract, `test_bf16_pass_rounds_once`, which
failed when the suite ran with PGX_CPU_GELU_ERF_MIDDLE=0). Now `GeluErfToBf16` picks
`gelu_erf_two_f32_bf16` where the switch is off: its value is the two-form float32 pass's
rounded once, and (on the same values) differs from the three-form bf16 pass's."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pygraphx.targets.torch_lowering import native_gelu  # noqa: E402
from tests.targets.test_gelu16_native_gelu_erf import have_bf16_pass  # noqa: E402


@pytest.mark.skipif(not have_bf16_pass(), reason="needs AVX512_BF16 (the bf16 pass)")
def test_switch_off_bf16_pass_is_the_two_form_value_rounded_once(monkeypatch) -> None:
    monkeypatch.setenv(native_gelu.MIDDLE_ENV, "0")
    torch.manual_seed(17)
    x = torch.randn(128 * 3072) * 1.2 - 0.7  # MiniLM-like: most vectors in the middle form
    got = native_gelu.GeluErfToBf16()(x.clone())
    wide = native_gelu.GeluErf()(x.clone())  # the two-form float32 pass (switch off)
    want = torch.where(wide.abs() < torch.finfo(torch.float32).tiny, wide * 0, wide).bfloat16()
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    monkeypatch.setenv(native_gelu.MIDDLE_ENV, "1")
    three = native_gelu.GeluErfToBf16()(x.clone())
    assert not torch.equal(got.view(torch.int16), three.view(torch.int16))  # the switch acts


@pytest.mark.skipif(not have_bf16_pass(), reason="needs AVX512_BF16 (the bf16 pass)")
def test_switch_picks_the_bf16_entry_point(monkeypatch) -> None:
    lib = native_gelu._BOUND.get()
    monkeypatch.delenv(native_gelu.MIDDLE_ENV, raising=False)
    assert native_gelu.GeluErfToBf16().fn is lib.gelu_erf_f32_bf16  # the default: three forms
    monkeypatch.setenv(native_gelu.MIDDLE_ENV, "0")
    assert native_gelu.GeluErfToBf16().fn is lib.gelu_erf_two_f32_bf16
