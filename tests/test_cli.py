"""The `k2back` command line, run as users run it: in subprocesses, with the
cache in a temp dir (the run's shared one where a command only uses what it
builds: verify, dump); the commands that build the K2 kernel use the tiny geometry."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import llvmlite.binding as llvm
import pytest

from k2back.cli import int_list, main
from k2back.codegen.compiler import IRSource
from k2back.codegen.compiler import compile as compile_source
from k2back.codegen.testing import MIXED_IR


def k2back(*argv, cache_dir, timeout=600, **env):
    return subprocess.run([sys.executable, "-m", "k2back", *argv], check=False, capture_output=True, text=True,
                          timeout=timeout,
                          env={**os.environ, "K2BACK_CACHE_DIR": str(cache_dir), **env})


@pytest.mark.parametrize("text, values", [
    ("5", [5]), ("1-4", [1, 2, 3, 4]), ("1,2,4", [1, 2, 4]), ("1-3,8", [1, 2, 3, 8]),
])
def test_token_lists(text, values):
    assert int_list(text) == values


# argument errors: main() in this process (run_cli); the subprocess tests below run
# the same main() as `python -m k2back`

@pytest.mark.parametrize("text", ["", "a", "3-1", "1-"])
def test_bad_token_lists_are_rejected(text, capsys):
    status, err = run_cli(capsys, "plan", "--arch", "gfx942", "--tp", "4", "--ratio", "2",
                          "--tokens", text)
    assert status == 2 and "--tokens" in err


def test_one_configuration_commands_refuse_lists(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("K2BACK_CACHE_DIR", str(tmp_path))
    status, err = run_cli(capsys, "dump", "--arch", "gfx942,gfx950", "--tp", "4", "--ratio", "2",
                          "--tokens", "1")
    assert status == 2
    assert "--arch" in err and "one configuration" in err
    assert not any(tmp_path.iterdir())  # nothing built


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


NO_TORCH = """
import sys
import k2back.codegen.plan, k2back.config
from k2back.cli import main
for argv in {argvs!r}:
    assert main(argv) == 0
assert "torch" not in sys.modules, "torch was imported"
"""


def without_torch(cache_dir, *argvs: list[str]) -> None:
    """The planner, the configuration and `k2back <argv>` for each argv, in a fresh
    interpreter, leave torch (~2 s to import) out of sys.modules."""
    done = subprocess.run([sys.executable, "-c", NO_TORCH.format(argvs=list(argvs))],
                          check=False, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "K2BACK_CACHE_DIR": str(cache_dir)})
    assert done.returncode == 0, done.stderr


def test_cache_and_plan_commands_start_without_torch(tmp_path):
    without_torch(tmp_path, ["cache", "ls"], ["cache", "size"],
                  ["plan", *TINY, "--arch", "gfx942", "--tokens", "16"])


def test_a_commands_help_lists_its_configuration_flags(capsys):
    with pytest.raises(SystemExit) as done:
        main(["warmup", "--help"])
    shown = capsys.readouterr().out
    assert done.value.code == 0
    assert "comma lists and ranges allowed" in shown
    for flag in ("--geometry", "--ratio", "--swa-fp8", "--comp-fp8", "--jobs"):
        assert flag in shown
    assert "of (0, 1, 2)" in shown  # config.RATIOS


# ---- commands that build the K2 kernel ---------------------------------------------------

TINY = ("--geometry", "tiny", "--tp", "4", "--ratio", "2")


def warmup(cache_dir, *config, jobs=1, **env):
    return k2back("warmup", "--jobs", str(jobs), "--quiet", *config, cache_dir=cache_dir, **env)


def summary(stdout: str) -> dict[str, int]:
    """The closing line `N built, N cached, N failed of N`."""
    return {word: int(n) for n, word in re.findall(r"(\d+) (built|cached|failed)", stdout)}


@pytest.mark.kernel
def test_warmup_twice_second_all_hits(tmp_path):
    config = (*TINY, "--arch", "gfx942,gfx950", "--tokens", "1,3")
    first = warmup(tmp_path, *config, jobs=2)  # worker processes, then this process
    assert first.returncode == 0, first.stdout + first.stderr
    assert summary(first.stdout) == {"built": 4, "cached": 0, "failed": 0}
    second = warmup(tmp_path, *config)
    assert second.returncode == 0
    assert summary(second.stdout) == {"built": 0, "cached": 4, "failed": 0}
    assert "k2_back_tiny_tp4_s3_r2_gfx950_swaocp_compocp" in second.stdout


@pytest.mark.kernel
def test_warmup_key_format_lists(tmp_path):
    """--swa-fp8 / --comp-fp8 take comma lists: a kernel a format pair ("auto"
    on gfx942 is e4m3fnuz for the window: that pair's kernel, named so)."""
    config = (*TINY, "--arch", "gfx942", "--tokens", "1", "--swa-fp8", "auto,e4m3fn",
              "--comp-fp8", "e4m3fn,e4m3fnuz")
    done = warmup(tmp_path, *config)
    assert done.returncode == 0, done.stdout + done.stderr
    assert summary(done.stdout) == {"built": 4, "cached": 0, "failed": 0}
    for pair in ("swafnuz_compocp", "swafnuz_compfnuz", "swaocp_compocp", "swaocp_compfnuz"):
        assert f"k2_back_tiny_tp4_s1_r2_gfx942_{pair}" in done.stdout
    assert "swa_fp8=auto comp_fp8=e4m3fnuz" in done.stdout


def test_bad_key_format_is_rejected(capsys):
    status, err = run_cli(capsys, "plan", *TINY, "--arch", "gfx942", "--tokens", "1",
                          "--swa-fp8", "fnuz")
    assert status == 2 and "--swa-fp8" in err and "e4m3fnuz" in err


@pytest.mark.kernel
def test_warmup_reports_failures_and_exits_nonzero(tmp_path):
    # a linker that is not there: every build fails, each one a row of the report
    done = warmup(tmp_path, *TINY, "--arch", "gfx942", "--tokens", "1,2",
                  K2BACK_LLD=str(tmp_path / "no-such-ld.lld"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert summary(done.stdout) == {"built": 0, "cached": 0, "failed": 2}
    assert re.search(r"tokens=2 .*failed .*K2BACK_LLD", done.stdout)


# ---- bad values: usage, one error line, exit 2, no traceback (-v shows it) --------------

ONE = {"--geometry": "tiny", "--arch": "gfx942", "--tp": "4", "--ratio": "2", "--tokens": "3"}
BAD = [
    # (flag, value, the error after "k2back <command>: error: ")
    ("--tokens", "65", "tokens: expected an int in 1..64, got 65"),
    ("--tp", "3", "tp: expected one of (1, 2, 4, 8), got 3"),
    ("--ratio", "3", "ratio: expected one of (0, 1, 2), got 3"),
    ("--geometry", "v5", ("geometry: expected one of ['tiny', 'tiny-16', 'v4-pro', "
                          "'v4.1-flash'], got 'v5'")),
    ("--arch", "gfx90a", ("arch: expected one of ('gfx942', 'gfx950') with optional target-ID "
                          "features, got 'gfx90a'")),
    ("--arch", "gfx942:sramecc", ("arch 'gfx942:sramecc': expected features among ['sramecc+', "
                                  "'sramecc-', 'xnack+', 'xnack-'], each at most once, "
                                  "got 'sramecc'")),
    ("--tokens", "0", "tokens: expected an int in 1..64, got 0"),
]


def run_cli(capsys, *argv) -> tuple[int, str]:
    """`k2back argv` in this process: (exit status, stderr)."""
    from k2back.cli import main

    try:
        status = main(list(argv))
    except SystemExit as e:
        status = e.code
    return status, capsys.readouterr().err


@pytest.mark.parametrize("command", ["plan", "dump", "verify", "warmup", "profile"])
@pytest.mark.parametrize("flag, value, error", BAD, ids=[f"{f}={v}" for f, v, _ in BAD])
def test_bad_values_are_refused_as_argparse_does(command, flag, value, error, capsys, tmp_path,
                                                 monkeypatch):
    monkeypatch.setenv("K2BACK_CACHE_DIR", str(tmp_path))
    argv = [a for f, v in {**ONE, flag: value}.items() for a in (f, v)]
    status, err = run_cli(capsys, command, *argv)
    assert status == 2
    assert err.startswith(f"usage: k2back {command} ")
    assert err.splitlines()[-1] == f"k2back {command}: error: {error}"
    assert "Traceback" not in err
    assert not any(tmp_path.iterdir())  # nothing built


def test_warmup_refuses_a_bad_grid_before_building(capsys, tmp_path, monkeypatch):
    """One bad combination in a grid (TP 8 does not divide tiny-16's 2
    groups): the whole grid is refused, nothing built."""
    monkeypatch.setenv("K2BACK_CACHE_DIR", str(tmp_path))
    status, err = run_cli(capsys, "warmup", "--jobs", "1", "--quiet", "--geometry", "tiny-16",
                          "--tp", "1,8", "--ratio", "0", "--arch", "gfx942", "--tokens", "1")
    assert status == 2
    assert err.splitlines()[-1] == ("k2back warmup: error: tp: 8 does not divide geometry "
                                    "'tiny-16''s 2 groups (16 heads)")
    assert not any(tmp_path.iterdir())


def test_verbose_shows_the_traceback(capsys):
    status, err = run_cli(capsys, "-v", "plan", *[a for kv in ONE.items() for a in kv][:-1], "65")
    assert status == 2
    assert "Traceback" in err and "k2back/config.py" in err
    assert err.splitlines()[-1] == "k2back plan: error: tokens: expected an int in 1..64, got 65"


def test_an_invalid_selftest_arch_is_refused(capsys):
    status, err = run_cli(capsys, "selftest", "--emulator-only", "--arch", "gfx942,gfx90a")
    assert status == 2 and "Traceback" not in err
    assert err.splitlines()[-1] == ("k2back selftest: error: argument --arch: expected gfx942, "
                                    "gfx950 or a comma list, got 'gfx942,gfx90a'")


@pytest.mark.kernel
def test_concurrent_warmups_and_a_truncated_entry(tmp_path):
    config = (*TINY, "--arch", "gfx942", "--tokens", "2")
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda _: warmup(tmp_path, *config), range(2)))
    assert all(r.returncode == 0 for r in runs), [r.stdout + r.stderr for r in runs]
    counts = [summary(r.stdout) for r in runs]
    # one of them built the entry under the key's lock, the other then loaded it
    assert sorted(c["built"] for c in counts) == [0, 1]
    entries = [p for p in tmp_path.iterdir() if (p / "manifest.json").is_file()]
    assert len(entries) == 1
    hsaco = next(entries[0].glob("*.hsaco"))
    hsaco.write_bytes(hsaco.read_bytes()[:100])  # truncated on disk
    again = warmup(tmp_path, *config)
    assert summary(again.stdout)["built"] == 1, again.stdout
    assert "corrupt" in again.stderr
    assert summary(warmup(tmp_path, *config).stdout)["cached"] == 1


@pytest.mark.kernel
def test_dump_to_stdout_and_to_files(tmp_path, run_cache):
    config = (*TINY, "--arch", "gfx950", "--tokens", "3")
    shown = k2back("dump", *config, cache_dir=run_cache)
    assert shown.returncode == 0, shown.stderr
    assert "v_mfma" in shown.stdout and ".amdhsa_kernel" in shown.stdout
    out = tmp_path / "dump"
    written = k2back("dump", *config, "--out", str(out), cache_dir=run_cache)
    assert written.returncode == 0, written.stderr
    name = "k2_back_tiny_tp4_s3_r2_gfx950_swaocp_compocp"
    for suffix in (".ll", ".opt.ll"):
        ir = (out / f"{name}{suffix}").read_text()
        module = llvm.parse_assembly(ir)  # llvmlite parses what we dumped
        module.verify()
        assert module.get_function(name) is not None
    asm = (out / f"{name}.s").read_text()
    assert f".amdhsa_kernel {name}" in asm
    assert "VGPR" in (out / f"{name}.resources.txt").read_text()
    spec = (out / f"{name}.spec.json").read_text()
    assert '"tokens": 3' in spec and '"swa_fp8": "e4m3fn"' in spec


@pytest.mark.kernel
def test_dump_timeline_writes_the_stamped_build(tmp_path, run_cache):
    config = (*TINY, "--arch", "gfx950", "--tokens", "3")
    out = tmp_path / "dump"
    written = k2back("dump", *config, "--timeline", "--out", str(out), cache_dir=run_cache)
    assert written.returncode == 0, written.stderr
    name = "k2_back_tiny_tp4_s3_r2_gfx950_swaocp_compocp_timeline"
    assert "s_memrealtime" in (out / f"{name}.s").read_text()
    assert "timeline" in (out / f"{name}.plan.txt").read_text()


@pytest.mark.kernel
def test_dump_and_warmup_build_without_torch(tmp_path, run_cache):
    config = [*TINY, "--arch", "gfx950", "--tokens", "3"]
    without_torch(run_cache, ["dump", *config, "--out", str(tmp_path)],
                  ["warmup", "--quiet", *config])


def test_plan_table(tmp_path):
    done = k2back("plan", *TINY, "--arch", "gfx942", "--tokens", "16", cache_dir=tmp_path)
    assert done.returncode == 0, done.stderr
    for word in ("split", "combine", "wo_a", "wo_b", "LDS", "scratch"):
        assert word in done.stdout
    assert "key bytes: swa_cache e4m3fnuz, comp_cache e4m3fn" in done.stdout  # auto on gfx942
    chosen = k2back("plan", *TINY, "--arch", "gfx942", "--tokens", "16", "--swa-fp8", "e4m3fn",
                    cache_dir=tmp_path)
    assert "key bytes: swa_cache e4m3fn, comp_cache e4m3fn" in chosen.stdout

@pytest.mark.kernel
@pytest.mark.parametrize("perturb, code", [((), 0), (("--perturb",), 1)])
def test_verify(run_cache, perturb, code):
    done = k2back("verify", *TINY, "--arch", "gfx942", "--tokens", "3", "--seed", "5", *perturb,
                  cache_dir=run_cache)
    assert done.returncode == code, done.stdout + done.stderr
    for name in ("out", "xo", "x8b"):
        assert f"  {name}: " in done.stdout
    assert ("MISMATCH" in done.stdout) == bool(perturb)
    assert "emulator" in done.stdout and "VGPR" in done.stdout
