"""Config: every field refused by name with what was expected and what was
given, in one place, whichever entry point the value came through."""

from __future__ import annotations

import dataclasses

import pytest

from k2back.api import AttentionBack
from k2back.codegen.plan import plan
from k2back.config import MAX_TOKENS, RATIOS, Config
from k2back.model import TP_DEGREES

GOOD = {"geometry": "tiny", "tp": 4, "tokens": 3, "ratio": 2, "arch": "gfx942"}

REFUSED = [
    ({"geometry": "v5"}, ("geometry: expected one of ['tiny', 'tiny-16', 'v4-pro', "
                          "'v4.1-flash'], got 'v5'")),
    ({"geometry": None}, "geometry: expected a geometry name, got None"),
    ({"tp": 3}, f"tp: expected one of {TP_DEGREES}, got 3"),
    ({"tp": "4"}, f"tp: expected an int of {TP_DEGREES}, got '4'"),
    ({"geometry": "tiny-16", "tp": 8}, "tp: 8 does not divide geometry 'tiny-16''s 2 groups"),
    ({"tokens": 0}, f"tokens: expected an int in 1..{MAX_TOKENS}, got 0"),
    ({"tokens": MAX_TOKENS + 1}, f"tokens: expected an int in 1..{MAX_TOKENS}, got 65"),
    ({"tokens": 2.0}, f"tokens: expected an int in 1..{MAX_TOKENS}, got 2.0"),
    ({"tokens": True}, f"tokens: expected an int in 1..{MAX_TOKENS}, got True"),
    ({"ratio": 3}, f"ratio: expected one of {RATIOS}, got 3"),
    ({"ratio": True}, f"ratio: expected one of {RATIOS}, got True"),
    ({"arch": "gfx90a"}, "arch: expected one of ('gfx942', 'gfx950')"),
    ({"arch": "gfx942:xnack"}, "arch 'gfx942:xnack': expected features among"),
    ({"swa_fp8": "fnuz"}, "swa_fp8: expected one of ('e4m3fn', 'e4m3fnuz', 'auto'), got 'fnuz'"),
    ({"comp_fp8": None}, "comp_fp8: expected one of ('e4m3fn', 'e4m3fnuz', 'auto'), got None"),
]


@pytest.mark.parametrize("change, message", REFUSED, ids=[m.split(":")[0] + str(i)
                                                          for i, (_, m) in enumerate(REFUSED)])
def test_each_field_is_refused_by_name(change, message):
    with pytest.raises(ValueError) as caught:
        Config(**{**GOOD, **change})
    assert str(caught.value).startswith(message)
    with pytest.raises(ValueError) as planned:  # plan() given the fields goes through Config
        plan(**{**GOOD, **change})
    assert str(planned.value) == str(caught.value)


def test_replace_checks_again():
    with pytest.raises(ValueError, match="^tokens: "):
        dataclasses.replace(Config(**GOOD), tokens=MAX_TOKENS + 1)


@pytest.mark.parametrize("arch, formats", [("gfx942", ("e4m3fnuz", "e4m3fn")),
                                           ("gfx950", ("e4m3fn", "e4m3fn")),
                                           ("gfx942:sramecc+:xnack-", ("e4m3fnuz", "e4m3fn"))])
def test_auto_formats_resolve_on_the_processor(arch, formats):
    config = Config(**{**GOOD, "arch": arch})
    assert config.processor == arch.split(":")[0]
    assert config.key_formats() == formats
    resolved = config.resolved()
    assert (resolved.swa_fp8, resolved.comp_fp8) == formats and resolved.arch == arch
    assert resolved.resolved() == resolved


def test_plan_of_a_config_is_the_positional_plan():
    config = Config(**{**GOOD, "swa_fp8": "e4m3fn"})
    assert plan(config) == plan("tiny", 4, 3, 2, "gfx942", "e4m3fn")
    assert plan(Config(**{**GOOD, "arch": "gfx942:sramecc+"})) == plan(Config(**GOOD))


@pytest.mark.parametrize("kw, message", [
    ({"ratio": 3}, f"ratio: expected one of {RATIOS}, got 3"),
    ({"tp": 3}, f"tp: expected one of {TP_DEGREES}, got 3"),
    ({"swa_fp8": "ocp"}, "swa_fp8: expected one of"),
    ({"max_tokens": MAX_TOKENS + 1}, f"max_tokens: expected an int in 1..{MAX_TOKENS}, got 65"),
    ({"arch": "gfx90a"}, "arch: expected one of"),
])
def test_the_layer_refuses_with_the_same_words(kw, message):
    with pytest.raises(ValueError) as caught:
        AttentionBack("tiny", **{"tp": 4, "ratio": 2, "arch": "gfx942", "backend": "emu", **kw})
    assert str(caught.value).startswith(message)


def test_arch_auto_is_checked_on_every_arch():
    """A layer for whichever GPU it meets: its configuration must hold on both."""
    layer = AttentionBack("tiny", tp=4, ratio=2, swa_fp8="e4m3fn")
    assert [layer.key_formats(a) for a in ("gfx942", "gfx950")] == [("e4m3fn", "e4m3fn")] * 2
