"""`k2back profile` (k2back.profile): stages found in the asm, the modeled launch
against its bounds, and the files --out writes."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from k2back import cli, ops
from k2back.codegen.plan import plan
from k2back.config import Config
from k2back.emu import asm as asm_text
from k2back.emu.timing_parts import part
from k2back.profile import STAGES, critical_path, merged, stage_regions, stamp_clock
from k2back.runtime import hip

CONFIG = ["--geometry", "tiny", "--tp", "4", "--ratio", "2", "--tokens", "3"]


@pytest.mark.kernel
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_every_stage_is_found_in_the_asm_in_order(arch):
    _, kernel = ops.kernel_for(Config("tiny", 4, 3, 2, arch))
    regions = stage_regions(kernel.asm)(asm_text.parse_kernel(kernel.asm, kernel.name))
    named = [r for r in regions if r in STAGES]  # not None (inlined blocks), "between", "epoch"
    # LLVM may lay a stage's short blocks (its task-slot choice) among the next
    # stage's: an instruction's stage comes from its own block, so only the
    # order in which the stages first appear is the template's.
    assert list(dict.fromkeys(named)) == list(STAGES)
    for stage in STAGES:  # each stage's code holds its flag poll or its MFMAs
        assert regions.count(stage) > 20, stage


def test_merged_unions_overlapping_intervals():
    assert merged([(5, 7), (0, 2), (1, 3), (7, 8)]) == [(0, 3), (5, 8)]


def test_critical_path_walks_back_through_the_producers():
    ctas = {0: {"run": [("split", 0, 10)], "wait": []},
            1: {"run": [("split", 0, 4)], "wait": []},
            2: {"run": [("combine", 0, 30)], "wait": [("combine", 1, 12)]},
            3: {"run": [("wo_a", 0, 40)], "wait": [("wo_a", 1, 32)]},
            4: {"run": [("wo_b", 0, 50)], "wait": [("wo_b", 2, 42)]}}
    assert [(g, s) for g, s, _, _ in critical_path(ctas)] == [(0, "split"), (2, "combine"),
                                                             (3, "wo_a"), (4, "wo_b")]


@pytest.mark.kernel
def test_profile_command_prints_and_writes_the_model(tmp_path, capsys):
    assert cli.main(["profile", *CONFIG, "--arch", "gfx950", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    result = json.loads((tmp_path / "profile.json").read_text())
    assert {"modeled_us", "roofline_us", "floor_us", "stages"} <= result.keys()
    assert f"{result['modeled_us']:8.2f} us" in printed
    # the chain of three hand-offs is in the model: it cannot beat the latency floor
    assert result["modeled_us"] >= result["floor_us"] > 0 < result["roofline_us"]
    assert [s["name"] for s in result["stages"]] == list(STAGES)
    assert [p["stage"] for p in result["critical_path"]] == list(STAGES)
    ends = [p["end_us"] for p in result["critical_path"]]
    assert ends == sorted(ends) and ends[-1] == pytest.approx(result["modeled_us"])
    trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    spans = [e for e in trace if e["ph"] == "X"]
    assert {e["name"] for e in spans} >= set(STAGES) | {"wait wo_b"}
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.kernel
def test_profile_from_stamps_writes_the_same_files(tmp_path, capsys):
    # the picture drawn from the timeline build's stamps (the reader a GPU profile uses)
    assert cli.main(["profile", *CONFIG, "--arch", "gfx942", "--stamps", "--out", str(tmp_path)]) == 0
    assert "timeline stamps" in capsys.readouterr().out
    result = json.loads((tmp_path / "profile.json").read_text())
    assert result["config"]["kernel"].endswith("_timeline") and "timeline stamps" in result["source"]
    assert [s["name"] for s in result["stages"]] == list(STAGES)
    assert all(0 < s["start_us"] < s["end_us"] <= result["modeled_us"] for s in result["stages"])
    assert [p["stage"] for p in result["critical_path"]] == list(STAGES)
    spans = [e for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"] if e["ph"] == "X"]
    assert {e["name"] for e in spans} >= set(STAGES) | {"wait combine", "wait wo_a", "wait wo_b"}
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_profile_on_hip_says_what_is_missing(capsys):
    args = ["profile", *CONFIG, "--arch", "gfx942", "--backend", "hip"]
    if hip.runtime_status() is None:  # a ROCm machine: the GPU's profile comes out
        assert cli.main(args) == 0 and "GPU, timeline stamps" in capsys.readouterr().out
        return
    with pytest.raises(SystemExit) as exit_:
        cli.main(args)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--backend hip" in err and "ROCm" in err


def test_gpu_stamps_tick_at_the_device_wall_clock_rate(monkeypatch):
    asked = []

    class Hip:  # hip-python's two names the clock lookup uses
        hipDeviceAttribute_t = SimpleNamespace(hipDeviceAttributeWallClockRate=10017)
        hipError_t = SimpleNamespace(hipSuccess=0)

        def hipDeviceGetAttribute(self, attr, device):
            asked.append((attr, device))
            return (0, 100_000)  # kHz: MI300X's s_memrealtime runs at 100 MHz

    monkeypatch.setattr(hip, "bindings", lambda: Hip())
    spec = plan("tiny", 4, 3, 2, "gfx942", timeline=True)
    gpu = SimpleNamespace(name="hip")
    assert stamp_clock(gpu, spec, torch.device("cpu", 3)) == (100e6, None)  # origin: the first CTA
    assert asked == [(10017, 3)]
    assert stamp_clock(SimpleNamespace(name="emu"), spec, None) == (part("gfx942").memrealtime_hz, 0)
