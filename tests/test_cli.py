"""The `k2back` command line, run as users run it: in subprocesses, with the
cache in a temp dir."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from k2back.cli import int_list
from k2back.codegen.compiler import IRSource, compile as compile_source
from test_kernargs import MIXED_IR


def k2back(*argv, cache_dir, timeout=600, **env):
    return subprocess.run([sys.executable, "-m", "k2back", *argv], capture_output=True, text=True,
                          timeout=timeout,
                          env={**os.environ, "K2BACK_CACHE_DIR": str(cache_dir), **env})


@pytest.mark.parametrize("text, values", [
    ("5", [5]), ("1-4", [1, 2, 3, 4]), ("1,2,4", [1, 2, 4]), ("1-3,8", [1, 2, 3, 8]),
])
def test_token_lists(text, values):
    assert int_list(text) == values


@pytest.mark.parametrize("text", ["", "a", "3-1", "1-"])
def test_bad_token_lists_are_rejected(text, tmp_path):
    done = k2back("plan", "--arch", "gfx942", "--tp", "4", "--ratio", "2", "--tokens", text,
                  cache_dir=tmp_path)
    assert done.returncode == 2 and "--tokens" in done.stderr


def test_one_configuration_commands_refuse_lists(tmp_path):
    done = k2back("dump", "--arch", "gfx942,gfx950", "--tp", "4", "--ratio", "2", "--tokens", "1",
                  cache_dir=tmp_path)
    assert done.returncode == 2
    assert "--arch" in done.stderr and "one configuration" in done.stderr


def test_cache_ls_size_clear(tmp_path, monkeypatch):
    monkeypatch.setenv("K2BACK_CACHE_DIR", str(tmp_path))
    kernel = compile_source(IRSource(MIXED_IR, "mixed", "gfx942"))
    listed = k2back("cache", "ls", cache_dir=tmp_path)
    assert listed.returncode == 0 and "mixed" in listed.stdout
    assert kernel.key[:16] in listed.stdout
    on_disk = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    size = k2back("cache", "size", cache_dir=tmp_path)
    assert size.stdout.split()[0] == str(on_disk) and on_disk > len(kernel.hsaco)
    cleared = k2back("cache", "clear", cache_dir=tmp_path)
    assert cleared.returncode == 0 and "removed 1 entries" in cleared.stdout
    assert "mixed" not in k2back("cache", "ls", cache_dir=tmp_path).stdout
