"""Pallas and chunked-XLA kernels (imported as ``jaxdm.kernels``).

``topk_reverse_kl`` / ``fused_linear_topk_reverse_kl``: the LVOPD top-k reverse-KL loss
(SPEC section 6) with reference, chunked-XLA and Pallas implementations. The streaming
statistics they share (log-sum-exp and top-k per row, differentiable) are in
``jaxdm.kernels.lse_topk_xla`` and ``jaxdm.kernels.lse_topk_pallas``.
"""
from jaxdm.kernels._streaming import LseTopK
from jaxdm.kernels.lse_topk_pallas import BlockSizes
from jaxdm.kernels.topk_reverse_kl import (
    AUTO_IMPL,
    DEFAULT_FLOOR_MIN,
    IMPLS,
    fused_linear_topk_reverse_kl,
    gate_capacity,
    kl_from_stats,
    plain_topk_reverse_kl,
    reference_topk_reverse_kl,
    resolve_impl,
    tail_bucket_kl,
    teacher_floor_logprob,
    teacher_logprobs_at,
    topk_reverse_kl,
    weighted_kl_loss,
)

__all__ = [
    "AUTO_IMPL",
    "BlockSizes",
    "LseTopK",
    "DEFAULT_FLOOR_MIN",
    "IMPLS",
    "fused_linear_topk_reverse_kl",
    "gate_capacity",
    "kl_from_stats",
    "plain_topk_reverse_kl",
    "reference_topk_reverse_kl",
    "resolve_impl",
    "tail_bucket_kl",
    "teacher_floor_logprob",
    "teacher_logprobs_at",
    "topk_reverse_kl",
    "weighted_kl_loss",
]
