import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope='session', autouse=True)
def _pure_lookups_computed_once():
    """mmengine's metafile parsing and config formatting computed once per process (``pure_lookups``)."""
    import pure_lookups
    undo = pure_lookups.install()
    yield
    undo()


@pytest.fixture(scope='module')
def fake_fmnist(tmp_path_factory):
    """A Fashion-MNIST-shaped directory (``fake_fmnist.make_fake_fmnist``)."""
    from fake_fmnist import make_fake_fmnist
    return make_fake_fmnist(tmp_path_factory.mktemp('fmnist'))
