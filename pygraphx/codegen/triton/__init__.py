"""Triton code generation: the `tl.` ops handler (`emitter.py`), kernel templates
(`kernels.py`) and `build_kernel` (`build.py`: disk cache, autotune). `emitter` and `kernels`
only write text; `build` needs torch and triton."""
