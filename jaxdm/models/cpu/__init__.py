"""jaxdm's XLA:CPU kernels, their Python side: C++ (``attention.cc``, ``matmul.cc``, sharing
``kernels.h``) called through XLA's FFI.

- ``build``: compiles the sources into one library under the jaxdm cache, loads it, says which
  kernel is on and why (``python -m jaxdm.models.cpu.build --build``).
- ``attention``: the fused attention kernel's custom calls.
- ``matmul``: the bf16 / fp32 matmul kernel's custom calls.

Nothing is imported here: each module is imported by its own name.
"""
