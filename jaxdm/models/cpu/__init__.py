"""jaxdm's XLA:CPU kernels, their Python side: C++ (``attention.cc``, ``matmul.cc``, sharing
``kernels.h``) called through XLA's FFI, and what the decoder needs to use them.

- ``build``: compiles the sources into one library under the jaxdm cache, loads it, says which
  kernel is on and why (``python -m jaxdm.models.cpu.build --build``).
- ``attention``: the fused attention kernel's custom calls.
- ``matmul``: the bf16 / fp32 matmul kernel's custom calls.
- ``scan``: the decoder's layer loop on XLA:CPU (bf16 weight stacks as their bits, whole
  stacks the matmul kernel reads in place).
- ``dispatch``: the seam ``jaxdm.models.decoder`` calls: the kernel or the decoder's XLA path,
  per projection and attention, chosen when tracing.

Nothing is imported here: each module is imported by its own name.
"""
