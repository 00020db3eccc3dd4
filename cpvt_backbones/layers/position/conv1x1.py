"""The paper's control for the PEG's spatial extent: 1 x 1 convolutions in the PEG's place."""
from collections.abc import Sequence

from .base import Geometry
from .peg import PEGEncoding


class Conv1x1Encoding(PEGEncoding):
    """``conv1x1``: a residual depthwise 1 x 1 convolution after each block in ``positions`` (default: every
    block, as the paper's control). It sees no neighbour and no padding, so it can carry no position. Keys as
    the PEG's (``pos_block.{k}.proj.0.*``)."""
    name = 'conv1x1'
    min_kernel = 1

    def __init__(self, geometry: Geometry, positions=None):
        super().__init__(geometry, positions, kernel_size=1)

    @staticmethod
    def default_positions(depth: int) -> Sequence[int]:
        return range(depth)
