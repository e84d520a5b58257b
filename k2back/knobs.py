"""Every environment switch k2back reads, declared once (cf. Triton's knobs.py).

A switch is read when asked for, never cached, so tests can monkeypatch the
environment. `keyed` marks the switches that change what a build produces: their
values enter the cache key (`cache_key_factors`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import platformdirs


def _flag(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Knob:
    env: str
    parse: Callable[[str], object]
    default: Callable[[], object]
    keyed: bool
    doc: str

    def get(self):
        raw = os.environ.get(self.env)
        return self.default() if raw in (None, "") else self.parse(raw)


KNOBS: dict[str, Knob] = {
    k.env: k
    for k in (
        Knob("K2BACK_CACHE_DIR", Path, lambda: Path(platformdirs.user_cache_dir("k2back")), False,
             "where built code objects are cached (cf. TRITON_CACHE_DIR)"),
        Knob("K2BACK_ALWAYS_COMPILE", _flag, lambda: False, False,
             "ignore cache hits; still write the fresh build to the cache"),
        Knob("K2BACK_DUMP_DIR", Path, lambda: None, False,
             "write IR/asm of every build here; forces a real compile so the dump happens"),
        Knob("K2BACK_LLD", Path, lambda: None, True,
             "the ld.lld to link with (cf. TRITON_HIP_LLD_PATH)"),
        Knob("K2BACK_ASSERT_NO_COMPILE", _flag, lambda: False, False,
             "any compile is an error (set by serving processes after warm-up)"),
        Knob("K2BACK_LOG_LEVEL", str.upper, lambda: "WARNING", False,
             "level of the `k2back` logger"),
        Knob("K2BACK_COMPILE_TIMEOUT", float, lambda: 600.0, False,
             "seconds one LLVM stage may run before its worker is killed (a hung pass "
             "becomes a CompileError, not a hung caller)"),
    )
}


def get(env: str):
    return KNOBS[env].get()


def cache_dir() -> Path:
    return get("K2BACK_CACHE_DIR")


def always_compile() -> bool:
    return get("K2BACK_ALWAYS_COMPILE")


def dump_dir() -> Path | None:
    return get("K2BACK_DUMP_DIR")


def lld_override() -> Path | None:
    return get("K2BACK_LLD")


def assert_no_compile() -> bool:
    return get("K2BACK_ASSERT_NO_COMPILE")


def log_level() -> str:
    return get("K2BACK_LOG_LEVEL")


def compile_timeout() -> float:
    return get("K2BACK_COMPILE_TIMEOUT")


def cache_key_factors() -> dict[str, str]:
    """The keyed switches' values, as they enter the cache key."""
    return {k.env: str(k.get()) for k in KNOBS.values() if k.keyed}
