"""Registers our backbones (``backbones.BACKBONES``: ``PyramidCPVT``, ``TwinsSVT``, ``CPVT``, ``PVTv2``)
in mmseg's MODELS (``custom_imports=dict(imports=['cpvt_backbones.adapters.mmseg'])``),
``ValidSizeSegDataPreprocessor`` and ``PredictAlone`` (a segmentor that predicts each image of a padded batch
as alone: ``adapters.alone``)."""
import functools

from mmseg.registry import MODELS

from .alone import refuse_mixed_sizes, register_dense
from .backbones import mark_valid_sizes


@functools.cache
def valid_size_preprocessor() -> type:
    """The class ``ValidSizeSegDataPreprocessor`` builds, made on first use (``backbones.lazy_builder``)."""
    from mmseg.models.data_preprocessor import SegDataPreProcessor
    from mmseg.utils import stack_batch

    class ValidSizeSegDataPreprocessor(SegDataPreProcessor):
        """mmseg's ``SegDataPreProcessor`` (same arguments) that takes a test batch of images of different sizes,
        padding them bottom/right to the largest (rounded up to ``test_cfg``'s ``size_divisor``, or to its
        ``size``; mmseg's own refuses such a batch), with each image's padding recorded for the post-processing
        that crops its logits, and that hands our backbones each image's valid size in the padded batch
        (``backbones.mark_valid_sizes``), so that an image's features do not depend on the images it is batched
        with."""

        marks_valid_sizes = True   # what PredictAloneHook looks for

        def forward(self, data: dict, training: bool = False) -> dict:
            if training:
                out = super().forward(data, training)
                return dict(out, inputs=mark_valid_sizes(out['inputs'], out['data_samples']))
            # The parent's test path (mmseg 1.2) asserts one size before anything else, so its colour conversion
            # and normalisation are repeated here, unchanged, ahead of the padding it would do.
            data = self.cast_data(data)
            inputs, samples = data['inputs'], data.get('data_samples')
            if self.channel_conversion and inputs[0].size(0) == 3:
                inputs = [image[[2, 1, 0], ...] for image in inputs]
            inputs = [image.float() for image in inputs]
            if self._enable_normalize:
                inputs = [(image - self.mean) / self.std for image in inputs]
            test_cfg = self.test_cfg or {}
            size = test_cfg.get('size')
            inputs, padding = stack_batch(inputs, size=size, size_divisor=None if size else
                                          test_cfg.get('size_divisor') or 1, pad_val=self.pad_val,
                                          seg_pad_val=self.seg_pad_val)
            if samples is not None:
                for sample, pad_info in zip(samples, padding, strict=True):
                    sample.set_metainfo({**pad_info})
            inputs = mark_valid_sizes(inputs, samples)
            refuse_mixed_sizes(self, inputs, samples)
            return dict(inputs=inputs, data_samples=samples)

    return ValidSizeSegDataPreprocessor


register_dense(MODELS, 'ValidSizeSegDataPreprocessor', valid_size_preprocessor)

__all__ = ['valid_size_preprocessor']
