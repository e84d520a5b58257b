"""The disk cache of built kernels (cf. Triton's runtime/cache.py).

An entry is a directory `<cache dir>/<key>/` holding the code object, its asm,
the IR before and after optimization, the metadata and the spec as JSON, and a
manifest with the sha256 of every file and the factors the key was made of.

- The key is the sha256 of named factors (`key_factors`): everything that can
  change the bytes of a build, so a stale entry can never be hit.
- Writes are atomic: files go to a temp dir inside the cache dir, the manifest
  last, then the dir is renamed into place. A crash leaves a `.tmp.*` dir that
  no lookup ever reads (and `clear()` removes).
- A lock per key: concurrent builders of one key build it once; the second
  waits, then loads.
- Loads verify the manifest: a missing, extra, truncated or altered file is
  logged as a warning on the `k2back` logger and the entry is rebuilt, never used.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

import k2back
from k2back import knobs

logger = logging.getLogger("k2back")

MANIFEST = "manifest.json"
_TEMP, _TRASH, _LOCKS = ".tmp.", ".trash.", ".locks"

# Our own modules whose text decides what a build produces: everything the
# renderer and the compiler import, transitively (planner, model geometry,
# formats, arch table, stage table, linker, metadata), and this module (the
# entry format). Templates are hashed by the source (its key()).
_PACKAGE = Path(k2back.__file__).parent
BUILD_ROOTS = ("k2back.codegen.render", "k2back.codegen.compiler", "k2back.runtime.cache")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _module_path(package: Path, name: str) -> Path | None:
    """The file of k2back module `name` under `package` (a copy of k2back/), or None."""
    parts = name.split(".")[1:]
    modules = [package.joinpath(*parts).with_suffix(".py")] if parts else []
    return next((p for p in (*modules, package.joinpath(*parts, "__init__.py")) if p.is_file()), None)


def _module_level(nodes):
    """The statements run at import: the module body, into if/try/with blocks."""
    for node in nodes:
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield from _module_level(n for n in ast.iter_child_nodes(node) if isinstance(n, ast.stmt))


def _imports(path: Path) -> set[str]:
    """The k2back modules `path` imports when it is imported (not a function's
    lazy imports: `k2back.__getattr__`'s api)."""
    names = set()
    for node in _module_level(ast.parse(path.read_bytes(), str(path)).body):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return {n for n in names if n == "k2back" or n.startswith("k2back.")}


def build_modules(package: Path = _PACKAGE) -> dict[str, Path]:
    """Module -> file of BUILD_ROOTS' import closure within k2back (`package`:
    the k2back directory to read)."""
    found, todo = {}, list(BUILD_ROOTS)
    while todo:
        name = todo.pop()
        path = _module_path(package, name)
        if name in found or path is None:
            continue
        found[name] = path
        todo += sorted(_imports(path))
    return dict(sorted(found.items()))


def sources_hash(package: Path = _PACKAGE) -> str:
    digest = hashlib.sha256()
    for name, path in build_modules(package).items():
        digest.update(name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


@functools.cache
def codegen_hash() -> str:
    """sha256 of the build modules' text (once a process: sources do not change under it)."""
    return sources_hash()


def key_factors(source_key: str, arch: str, features: str, toolchain: dict[str, str]) -> dict:
    """Every named input of a build's bytes; `toolchain` = llvmlite/LLVM/linker versions."""
    return {
        "source": source_key,
        "k2back": k2back.__version__,
        "codegen": codegen_hash(),
        **toolchain,
        "arch": arch,
        "features": features,
        **knobs.cache_key_factors(),
    }


def digest(factors: dict) -> str:
    return sha256(json.dumps(factors, sort_keys=True).encode())


@dataclass(frozen=True)
class Entry:
    key: str
    path: Path
    manifest: dict

    @property
    def name(self) -> str:
        return self.manifest["name"]

    @property
    def size_bytes(self) -> int:
        return sum(f["bytes"] for f in self.manifest["files"].values())


class CorruptEntry(Exception):
    pass


class Cache:
    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root is not None else knobs.cache_dir()

    def path(self, key: str) -> Path:
        return self.root / key

    def lock(self, key: str) -> FileLock:
        locks = self.root / _LOCKS
        locks.mkdir(parents=True, exist_ok=True)
        return FileLock(locks / f"{key}.lock")

    def load(self, key: str) -> dict[str, bytes] | None:
        """The entry's files by name, verified; None on a miss or a corrupt entry."""
        path = self.path(key)
        if not path.exists():
            return None
        try:
            return _verified(path)
        except CorruptEntry as e:
            logger.warning("k2back cache: entry %s is corrupt (%s); rebuilding it", path, e)
            return None

    def store(self, key: str, name: str, files: dict[str, bytes], factors: dict) -> Path:
        """Write an entry atomically (replacing any old one); call under `lock(key)`."""
        self.root.mkdir(parents=True, exist_ok=True)
        temp = self.root / f"{_TEMP}{key}.{uuid.uuid4().hex}"
        try:
            temp.mkdir()
            for file_name, data in files.items():
                (temp / file_name).write_bytes(data)
            manifest = {
                "key": key,
                "name": name,
                "created": time.time(),
                "factors": factors,
                "files": {n: {"sha256": sha256(d), "bytes": len(d)} for n, d in files.items()},
            }
            # written last: a manifest means every file before it is complete
            (temp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
            self._discard(key)
            os.rename(temp, self.path(key))
        finally:
            shutil.rmtree(temp, ignore_errors=True)
        return self.path(key)

    def _discard(self, key: str) -> None:
        """Move an old entry aside first: a dir cannot be renamed onto a non-empty one."""
        if self.path(key).exists():
            trash = self.root / f"{_TRASH}{key}.{uuid.uuid4().hex}"
            os.rename(self.path(key), trash)
            shutil.rmtree(trash, ignore_errors=True)

    def entries(self) -> list[Entry]:
        """Complete entries (manifest readable), oldest first."""
        found = []
        for path in self.root.iterdir() if self.root.is_dir() else ():
            if path.name.startswith(".") or not (path / MANIFEST).is_file():
                continue
            try:
                found.append(Entry(path.name, path, json.loads((path / MANIFEST).read_text())))
            except (OSError, ValueError):
                continue
        return sorted(found, key=lambda e: e.manifest.get("created", 0))

    def size_bytes(self) -> int:
        """Bytes on disk under the cache dir, including temp and lock files."""
        return sum(p.stat().st_size for p in self.root.rglob("*") if p.is_file()) \
            if self.root.is_dir() else 0

    def clear(self) -> int:
        """Remove every entry and leftover; returns how many entries were removed."""
        removed = len(self.entries())
        if self.root.is_dir():
            for path in self.root.iterdir():
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        return removed


def _verified(path: Path) -> dict[str, bytes]:
    try:
        listed = json.loads((path / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError) as e:
        raise CorruptEntry(f"unreadable manifest: {e}") from None
    present = {p.name for p in path.iterdir()} - {MANIFEST}
    if present != set(listed):
        raise CorruptEntry(f"files missing {sorted(set(listed) - present)}, "
                           f"unexpected {sorted(present - set(listed))}")
    files = {name: (path / name).read_bytes() for name in listed}
    for name, data in files.items():
        if len(data) != listed[name]["bytes"] or sha256(data) != listed[name]["sha256"]:
            raise CorruptEntry(f"{name}: {len(data)} bytes, expected {listed[name]['bytes']} "
                               f"with sha256 {listed[name]['sha256'][:16]}…")
    return files


def entries() -> list[Entry]:
    return Cache().entries()


def size_bytes() -> int:
    return Cache().size_bytes()


def clear() -> int:
    return Cache().clear()
