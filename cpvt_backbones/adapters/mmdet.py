"""Registers our backbones (``backbones.BACKBONES``: ``PyramidCPVT``, ``TwinsSVT``, ``CPVT``, ``PVTv2``)
in mmdet's MODELS (``custom_imports=dict(imports=['cpvt_backbones.adapters.mmdet'])``),
``ValidSizeDetDataPreprocessor`` and ``PredictAlone`` (a detector that predicts each image of a padded batch
as alone: ``adapters.alone``)."""
import functools

from mmdet.registry import MODELS

from .alone import refuse_mixed_sizes, register_dense
from .backbones import mark_valid_sizes


@functools.cache
def valid_size_preprocessor() -> type:
    """The class ``ValidSizeDetDataPreprocessor`` builds, made on first use (``backbones.lazy_builder``)."""
    from mmdet.models.data_preprocessors import DetDataPreprocessor

    class ValidSizeDetDataPreprocessor(DetDataPreprocessor):
        """mmdet's ``DetDataPreprocessor`` (same arguments) that also hands our backbones each image's valid size
        in the padded batch (``backbones.mark_valid_sizes``), so that an image's features do not depend on the
        images it is batched with. A test batch of mixed sizes is refused unless the model predicts each image
        alone (``alone.refuse_mixed_sizes``)."""

        marks_valid_sizes = True   # what PredictAloneHook looks for

        def forward(self, data: dict, training: bool = False) -> dict:
            out = super().forward(data, training)
            mark_valid_sizes(out['inputs'], out['data_samples'])
            if not training:
                refuse_mixed_sizes(self, out['inputs'], out['data_samples'])
            return out

    return ValidSizeDetDataPreprocessor


register_dense(MODELS, 'ValidSizeDetDataPreprocessor', valid_size_preprocessor)

__all__ = ['valid_size_preprocessor']
