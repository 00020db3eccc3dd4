"""Framework adapters. Import ``cpvt_backbones.adapters.mmdet``/``.mmseg``/``.mmpretrain`` (OpenMMLab registries)
or ``.timm`` (timm's model registry) to register. What the tools, benchmarks and studies use on top of mmengine:
``runner`` (a config and the Runner built from it, launched on CPU or GPU), ``engines`` (precision, calibration
and the inference engine a config's model runs on) and ``evaluation`` (headline metrics, test sizes, the test
loop on a checkpoint)."""
