"""Compatibility module: the paper's block-by-block run now lives in :mod:`jaxbsd.compression.blockwise`.

``from jaxbsd.compress import CompressionConfig, compress`` keeps working; new code imports from
:mod:`jaxbsd.compression` (or uses ``jb.compress``).
"""

from jaxbsd.compression.blockwise import (  # noqa: F401
    CAPTURES,
    METHODS,
    ORDERS,
    CompressionConfig,
    block_order,
    capture_indices,
    check_state,
    compress,
    compress_block,
    judge_indices,
    mlp_params,
    sample_tokens,
    validation_split,
)

__all__ = ["CAPTURES", "METHODS", "ORDERS", "CompressionConfig", "block_order", "capture_indices", "check_state",
           "compress", "compress_block", "judge_indices", "mlp_params", "sample_tokens", "validation_split"]
