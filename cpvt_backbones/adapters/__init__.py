"""Framework adapters. Import ``cpvt_backbones.adapters.mmdet``/``.mmseg``/``.mmpretrain`` (OpenMMLab registries)
or ``.timm`` (timm's model registry) to register."""
