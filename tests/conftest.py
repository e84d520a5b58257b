"""Suite-wide settings: one torch thread per test process (pytest-xdist runs a
process per core; extra intra-op threads only fight the other workers), and a
private code-object cache so tests never write into the user's cache."""

import os

import pytest

from k2back.testing import single_thread


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    with single_thread():
        yield


@pytest.fixture(autouse=True, scope="session")
def private_cache_dir(tmp_path_factory):
    old = os.environ.get("K2BACK_CACHE_DIR")
    os.environ["K2BACK_CACHE_DIR"] = str(tmp_path_factory.mktemp("k2back-cache"))
    yield
    if old is None:
        os.environ.pop("K2BACK_CACHE_DIR", None)
    else:
        os.environ["K2BACK_CACHE_DIR"] = old
