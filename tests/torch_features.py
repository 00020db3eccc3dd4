"""Skipping a test that needs a newer torch than this one, with the reason (cpvt_backbones.compat.FEATURES)."""
import pytest
import torch

from cpvt_backbones.compat import FEATURES, supports


def reason(feature: str) -> str:
    release, what = FEATURES[feature][:2]
    return f'needs torch >= {release} ({what}); this is torch {torch.__version__}'


def needs_torch(feature: str):
    """A mark that skips the test where this torch lacks ``feature``."""
    return pytest.mark.skipif(not supports(feature), reason=reason(feature))


def skip_module_without(feature: str) -> None:
    """Skip the calling test module where this torch lacks ``feature``."""
    if not supports(feature):
        pytest.skip(reason(feature), allow_module_level=True)
