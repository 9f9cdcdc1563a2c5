"""A stack of same-shape pre-norm residual MLP blocks (``x + MLP(LayerNorm(x))``), the model of
the memory and one-block tests: ``ResidualStack(blocks, width, hidden, rngs)``, MLPs found by
discovery at ``blocks.{i}.mlp``."""

from flax import nnx

from jaxbsd.models.layers import MLP


class Block(nnx.Module):
    def __init__(self, width: int, hidden: int, rngs: nnx.Rngs):
        self.norm = nnx.LayerNorm(width, rngs=rngs)
        self.mlp = MLP(width, hidden, rngs=rngs)

    def __call__(self, x):
        return x + self.mlp(self.norm(x))


class ResidualStack(nnx.Module):
    def __init__(self, blocks: int, width: int, hidden: int, rngs: nnx.Rngs):
        self.blocks = nnx.List([Block(width, hidden, rngs) for _ in range(blocks)])

    def __call__(self, x):
        for block in self.blocks:
            x = block(x)
        return x
