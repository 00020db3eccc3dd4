"""OpenMMLab adapters. Import ``cpvt_backbones.adapters.mmdet``/``.mmseg``/``.mmpretrain`` to register."""
