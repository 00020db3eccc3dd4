import sys
from pathlib import Path

import pytest
import torch

# The studies and the speed benchmark are scripts whose modules import each other as top-level names (a script's
# own folder is on its path when it runs); the tests import them the same way.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'benchmarks'))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
