"""The disk cache through compile(): hits that never reach LLVM, a key that moves
with every factor, corrupt entries rebuilt with a warning, the K2BACK_* switches,
two processes building one key, and no half entries after a failed build."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path

import pytest

import k2back
from k2back.codegen import compiler, llvm
from k2back.codegen.compiler import CompileError, IRSource, cache_key, compile
from k2back.codegen.testing import AXPY, SCALED_MFMA, fake_lld
from k2back.runtime import cache

pytestmark = pytest.mark.usefixtures("private_cache")
FILES = ["axpy.hsaco", "axpy.json", "axpy.ll", "axpy.opt.ll", "axpy.s"]


@pytest.fixture
def root(request):
    """The private cache dir every test here runs with."""
    return request.getfixturevalue("private_cache")


@pytest.fixture
def builds(monkeypatch):
    """Counts the builds that reach LLVM."""
    calls = []
    real = compiler._run_stages

    def counting(*args):
        calls.append(args[0])
        return real(*args)

    monkeypatch.setattr(compiler, "_run_stages", counting)
    return calls


def source(arch="gfx942"):
    return IRSource(AXPY, "axpy", arch)


def entry_dirs(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.name != ".locks") if root.exists() else []


def test_miss_then_hit_without_llvm(root, builds):
    cold = compile(source())
    warm = compile(source())
    assert len(builds) == 1
    assert (cold.cache_hit, warm.cache_hit) == (False, True)
    for f in ("ir", "opt_ir", "asm", "hsaco", "metadata", "key", "path", "name", "arch"):
        assert getattr(warm, f) == getattr(cold, f), f
    assert entry_dirs(root) == [cold.path]
    assert sorted(p.name for p in cold.path.iterdir()) == sorted([*FILES, cache.MANIFEST])


def test_manifest_lists_factors_and_hashes(root):
    kernel = compile(source())
    manifest = json.loads((kernel.path / cache.MANIFEST).read_text())
    key, factors = cache_key(source())
    assert manifest["key"] == kernel.key == key == kernel.path.name
    assert manifest["factors"] == factors
    assert set(factors) >= {"source", "k2back", "codegen", "llvmlite", "llvm", "linker", "arch",
                            "features", "K2BACK_LLD"}
    for name, listed in manifest["files"].items():
        data = (kernel.path / name).read_bytes()
        assert listed == {"sha256": sha256(data).hexdigest(), "bytes": len(data)}


def test_spec_json_is_stored_and_returned():
    spec = json.dumps({"geometry": "tiny", "tp": 4})
    cold = compile(IRSource(AXPY, "axpy", "gfx950", spec_json=spec))
    warm = compile(IRSource(AXPY, "axpy", "gfx950", spec_json=spec))
    assert warm.cache_hit and warm.spec_json == cold.spec_json == spec
    assert (warm.path / "axpy.spec.json").read_text() == spec


@dataclass(frozen=True)
class TemplatedSource:
    """What KernelSource does: its key covers the spec and every template's bytes."""

    template: bytes
    arch: str = "gfx942"
    name: str = "axpy"

    def key(self) -> str:
        return sha256(self.template).hexdigest()

    def render(self) -> str:
        return self.template.decode()


CHANGES = {
    "template bytes": lambda mp, tmp: TemplatedSource(AXPY.encode() + b"; edited\n"),
    "arch": lambda mp, tmp: TemplatedSource(AXPY.encode(), arch="gfx950"),
    "target features": lambda mp, tmp: TemplatedSource(AXPY.encode(), arch="gfx942:xnack-"),
    "package version": lambda mp, tmp: mp.setattr(k2back, "__version__", "9.9.9"),
    "codegen sources": lambda mp, tmp: mp.setattr(cache, "codegen_hash", lambda: "edited"),
    "llvm version": lambda mp, tmp: mp.setattr(llvm, "versions",
                                          lambda: {"llvmlite": "0.50.0", "llvm": "23.0"}),
    "linker": lambda mp, tmp: mp.setattr(compiler.linker, "linker_version", lambda: "ld.lld | LLD 1"),
    "keyed knob": lambda mp, tmp: mp.setenv("K2BACK_LLD", str(fake_lld(tmp / "ld.lld"))),
}


@pytest.mark.parametrize("change", CHANGES)
def test_key_moves_with_every_factor(change, monkeypatch, tmp_path):
    base = TemplatedSource(AXPY.encode())
    before, _ = cache_key(base)
    changed = CHANGES[change](monkeypatch, tmp_path)
    after, _ = cache_key(changed if isinstance(changed, TemplatedSource) else base)
    assert after != before


def test_unkeyed_knobs_leave_the_key(monkeypatch, tmp_path):
    before, _ = cache_key(source())
    monkeypatch.setenv("K2BACK_LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("K2BACK_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert cache_key(source())[0] == before


CORRUPTIONS = {
    "truncated": lambda p: (p / "axpy.hsaco").write_bytes((p / "axpy.hsaco").read_bytes()[:100]),
    "bit flip": lambda p: (p / "axpy.s").write_bytes(
        (p / "axpy.s").read_bytes().replace(b"s_endpgm", b"s_endpgM")),
    "missing file": lambda p: (p / "axpy.json").unlink(),
    "extra file": lambda p: (p / "stray.o").write_bytes(b"x"),
    "no manifest": lambda p: (p / cache.MANIFEST).unlink(),
    "garbled manifest": lambda p: (p / cache.MANIFEST).write_text("{not json"),
}


@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_corrupt_entry_is_rebuilt_with_a_warning(corruption, builds, caplog):
    good = compile(source())
    CORRUPTIONS[corruption](good.path)
    with caplog.at_level(logging.WARNING, logger="k2back"):
        rebuilt = compile(source())
    assert not rebuilt.cache_hit and len(builds) == 2
    assert any("corrupt" in r.getMessage() and good.key in r.getMessage()
               for r in caplog.records)
    assert rebuilt.hsaco == good.hsaco and rebuilt.asm == good.asm
    assert compile(source()).cache_hit  # repaired
    assert len(builds) == 2


def test_always_compile_skips_hits_but_writes(monkeypatch, builds):
    first = compile(source())
    created = json.loads((first.path / cache.MANIFEST).read_text())["created"]
    monkeypatch.setenv("K2BACK_ALWAYS_COMPILE", "1")
    again = compile(source())
    assert not again.cache_hit and len(builds) == 2
    assert json.loads((again.path / cache.MANIFEST).read_text())["created"] > created
    monkeypatch.delenv("K2BACK_ALWAYS_COMPILE")
    assert compile(source()).cache_hit and len(builds) == 2


def test_dump_dir_forces_a_build_and_writes_the_ir(monkeypatch, tmp_path, builds):
    compile(source())
    monkeypatch.setenv("K2BACK_DUMP_DIR", str(tmp_path / "dump"))
    kernel = compile(source("gfx942"))
    assert not kernel.cache_hit and len(builds) == 2
    (dumped,) = (tmp_path / "dump").iterdir()
    assert (dumped / "axpy.ll").read_text() == kernel.ir
    assert (dumped / "axpy.opt.ll").read_text() == kernel.opt_ir
    assert (dumped / "axpy.s").read_text() == kernel.asm


def test_assert_no_compile_raises_on_a_miss_only(monkeypatch, root, builds):
    monkeypatch.setenv("K2BACK_ASSERT_NO_COMPILE", "1")
    key, _ = cache_key(source())
    with pytest.raises(CompileError, match=f"K2BACK_ASSERT_NO_COMPILE.*'axpy'.*{key}"):
        compile(source())
    assert builds == [] and entry_dirs(root) == []
    monkeypatch.delenv("K2BACK_ASSERT_NO_COMPILE")
    compile(source())
    monkeypatch.setenv("K2BACK_ASSERT_NO_COMPILE", "1")
    assert compile(source()).cache_hit and len(builds) == 1


def test_failed_builds_leave_nothing_behind(root):
    with pytest.raises(CompileError):
        compile(IRSource(SCALED_MFMA, "crash", "gfx942"))
    assert entry_dirs(root) == []


def test_failed_store_leaves_no_temp_dir(root):
    store = cache.Cache()
    with pytest.raises(TypeError):
        store.store("k" * 64, "axpy", {"a.s": b"asm", "b.hsaco": None}, {})
    assert entry_dirs(root) == []


BUILD_ONE = textwrap.dedent("""
    import json, sys
    from k2back.codegen.compiler import IRSource, compile
    from k2back.codegen.testing import AXPY
    kernel = compile(IRSource(AXPY, "axpy", "gfx950"))
    print(json.dumps({"hit": kernel.cache_hit, "key": kernel.key}))
""")


def test_two_processes_build_one_key_once(root):
    key, _ = cache_key(IRSource(AXPY, "axpy", "gfx950"))
    # Hold the key's lock until both racers are surely waiting on it, so they contend.
    with cache.Cache().lock(key):
        racers = [subprocess.Popen([sys.executable, "-c", BUILD_ONE],
                                   stdout=subprocess.PIPE, text=True) for _ in range(2)]
        time.sleep(3)
        assert all(r.poll() is None for r in racers)
    results = [json.loads(r.communicate(timeout=300)[0]) for r in racers]
    assert all(r.returncode == 0 for r in racers)
    assert sorted(r["hit"] for r in results) == [False, True]
    assert results[0]["key"] == results[1]["key"]
    (entry,) = entry_dirs(root)
    assert entry.name == results[0]["key"]
    assert cache.Cache().load(entry.name) is not None  # complete and intact


def test_listing_size_and_clear(root):
    a, b = compile(source("gfx942")), compile(source("gfx950"))
    store = cache.Cache()
    listed = store.entries()
    assert [e.key for e in listed] == [a.key, b.key]
    assert all(e.name == "axpy" for e in listed)
    on_disk = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    assert cache.size_bytes() == on_disk >= sum(e.size_bytes for e in listed) > len(a.hsaco)
    assert cache.entries() == listed
    assert cache.clear() == 2
    assert cache.entries() == [] and cache.size_bytes() == 0
    assert not compile(source("gfx942")).cache_hit


def test_cache_dir_knob(root):
    assert cache.Cache().root == root
    assert compile(source()).path.parent == root
