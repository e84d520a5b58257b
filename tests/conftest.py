"""Suite-wide settings: one torch thread per test process (pytest-xdist runs a
process per core; extra intra-op threads only fight the other workers), and a
private code-object cache so tests never write into the user's cache: one for
the whole run, shared by the xdist workers (a kernel both workers launch is
built once; the cache's per-key lock makes the second worker wait and load it,
the real code object with its manifest checked). Tests about building itself
take a cache of their own (`private_cache`).

K2BACK_TEST_CACHE_DIR=<dir> keeps that cache across runs (a developer's
reruns load the kernels they did not change; the key holds every input of a
build, so an edit to the code generator misses and rebuilds). CI leaves it
unset: every run builds every kernel it launches."""

import os

import pytest

from k2back.testing import single_thread


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    with single_thread():
        yield


def run_directory(tmp_path_factory):
    """This run's temp directory: under xdist the parent of every worker's own."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(autouse=True, scope="session")
def private_cache_dir(tmp_path_factory):
    old = os.environ.get("K2BACK_CACHE_DIR")
    os.environ["K2BACK_CACHE_DIR"] = (os.environ.get("K2BACK_TEST_CACHE_DIR")
                                      or str(run_directory(tmp_path_factory) / "k2back-cache"))
    yield
    if old is None:
        os.environ.pop("K2BACK_CACHE_DIR", None)
    else:
        os.environ["K2BACK_CACHE_DIR"] = old


def pytest_collection_modifyitems(items):
    """The long tests first: `slow`, then `kernel`, then the units (a stable sort:
    file order within each). Under xdist a long test started last leaves one
    worker idle while it ends; started first, the short ones fill around it
    (with `--dist worksteal`, as `make test` runs, an idle worker takes half of
    the other's queue from its end: the short tests)."""
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None,
                                 item.get_closest_marker("kernel") is None))


# the run's code-object cache, for a subprocess that builds kernels other tests build too
@pytest.fixture
def run_cache():
    return os.environ["K2BACK_CACHE_DIR"]


# a test's own code-object cache and no K2BACK_* build switches (codegen tests)
@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    for knob in ("K2BACK_ALWAYS_COMPILE", "K2BACK_DUMP_DIR", "K2BACK_ASSERT_NO_COMPILE",
                 "K2BACK_LLD"):
        monkeypatch.delenv(knob, raising=False)
    monkeypatch.setenv("K2BACK_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


# --- which instruction forms each test's emulator launches hold (issue 9 §6) -----------
# `pytest -n 4 tests/test_emu_*.py --record-forms=tests/data/form_coverage.json` writes
# {form: [up to 3 tests that launched a kernel holding it]}: the table
# tests/test_emu_inventory.py checks the K2 kernel's forms against. A test that
# launches the K2 kernel or one of its stages (a kernel named k2_*) covers nothing:
# those launches are what the unit tests cover, so the whole test is left out.

K2_KERNEL_PREFIX = "k2_"


def pytest_addoption(parser):
    parser.addoption("--record-forms", default=None,
                     help="write the instruction forms of every emulator launch, per test, here")


_RECORDED: dict = {}
_LAUNCHES_K2: set = set()
_CURRENT = [None]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    _CURRENT[0] = item.nodeid
    try:
        return (yield)
    finally:
        _CURRENT[0] = None


@pytest.fixture(autouse=True, scope="session")
def record_forms(request):
    path = request.config.getoption("--record-forms")
    if not path:
        yield
        return
    import json

    from k2back.emu import inventory, machine

    launch = machine.Machine.launch

    def recording(self, asm, kernel_name, *args, **kwargs):
        if _CURRENT[0] is not None and kernel_name.startswith(K2_KERNEL_PREFIX):
            _LAUNCHES_K2.add(_CURRENT[0])
        elif _CURRENT[0] is not None:
            _RECORDED.setdefault(_CURRENT[0], set()).update(inventory.forms(asm, kernel_name))
        return launch(self, asm, kernel_name, *args, **kwargs)

    machine.Machine.launch = recording
    yield
    machine.Machine.launch = launch
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(f"{path}.raw.{worker}", "w") as f:
        json.dump({test: sorted(forms) for test, forms in _RECORDED.items()
                   if test not in _LAUNCHES_K2}, f)


def pytest_sessionfinish(session):
    path = session.config.getoption("--record-forms")
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    import glob
    import json

    tests_of: dict = {}
    for raw in glob.glob(f"{glob.escape(path)}.raw.*"):
        with open(raw) as f:
            for test, forms in json.load(f).items():
                for form in forms:  # the test function (its parametrizations alike)
                    tests_of.setdefault(form, set()).add(test.split("[")[0])
        os.remove(raw)
    with open(path, "w") as f:
        for i, (form, tests) in enumerate(sorted(tests_of.items())):
            f.write(("{\n" if i == 0 else ",\n") + json.dumps(form) + ": " + json.dumps(sorted(tests)[:3]))
        f.write("\n}\n")
