"""The Swin Transformer family: :mod:`jaxbsd.models.swin.modeling` (config and modules)."""

from jaxbsd.models.swin.modeling import (
    PatchMerging,
    Swin,
    SwinConfig,
    WindowAttention,
    relative_position_index,
    shift_mask,
    window_partition,
    window_reverse,
)

__all__ = ["SwinConfig", "Swin", "WindowAttention", "PatchMerging", "shift_mask", "relative_position_index",
           "window_partition", "window_reverse"]

# Checkpoints record a model by ``module.qualname``: the family's public path, as before the split.
Swin.__module__ = __name__
