"""drmas follows the CPU it runs on: vLLM's kernels are loaded only by vLLM's own choice (never a
build by name: the AVX-512 BF16 build dies with an illegal instruction on an AVX2 CPU), the
precision and the engine dtype follow the same flags vLLM reads, and every test run names the
CPU kind in its header.

The smaller kinds run here through ``tests/cpu_kind/sitecustomize.py``, which makes a process
(and its children) see a CPU without AVX-512, or without AVX-512 BF16."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import drmas.hardware as hw
from drmas.engines import vllm_available

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("drmas", "recipes", "bench", "scripts", "examples")

# ---- the guard: no kernel build of vLLM is named anywhere ----

_BUILD = re.compile(r"\bvllm\s*\.\s*_C\w*")  # vllm._C, vllm._C_AVX2, vllm._C_AVX512, ...
_LOADERS = {"import_module", "__import__", "load_library", "CDLL", "LoadLibrary", "find_spec"}


def named_builds(source: str, where: str = "<source>") -> list[str]:
    """Every place in Python ``source`` that imports or names one of vLLM's kernel builds."""
    found = []
    for node in ast.walk(ast.parse(source, where)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            found += [f"{where}:{line}: import {a.name}" for a in node.names if _BUILD.search(a.name)]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if _BUILD.search(module) or (module == "vllm" and any(a.name.startswith("_C")
                                                                   for a in node.names)):
                found.append(f"{where}:{line}: from {module} import ...")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in _LOADERS:
                for arg in node.args[:1]:
                    text = arg.value if isinstance(arg, ast.Constant) else None
                    if isinstance(text, str) and re.search(r"(^|[./])_C\w*", text):
                        found.append(f"{where}:{line}: {name}({arg.value!r})")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _BUILD.search(node.value):
            found.append(f"{where}:{line}: the string {node.value!r}")
    return found


def test_the_guard_catches_every_way_of_naming_a_build():
    for bad in ("import vllm._C", "import vllm._C_AVX2 as k", "from vllm import _C_AVX512",
                "from vllm._C import ops", "import importlib; importlib.import_module('vllm._C')",
                "__import__('vllm._C_AVX512')", "torch.ops.load_library('site-packages/vllm/_C.abi3.so')",
                "name = 'vllm._C'"):
        assert named_builds(bad), bad
    for fine in ("from vllm.platforms import current_platform\ncurrent_platform.import_kernels()",
                 "torch.ops._C.init_cpu_memory_env", "import vllm", "x = '_C_AVX2 kernels'"):
        assert not named_builds(fine), fine


def test_no_file_names_a_kernel_build_of_vllm():
    found = []
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            where = str(path.relative_to(ROOT))
            if path.suffix == ".py":
                found += named_builds(path.read_text(), where)
            elif path.suffix in (".sh", ".md", ".yaml", ".toml", ".txt", ""):
                text = path.read_text(errors="replace")
                found += [f"{where}: {m.group(0)}" for m in _BUILD.finditer(text)]
    assert not found, ("vLLM's kernel builds are loaded by vLLM's platform "
                       "(current_platform.import_kernels), never by name: " + "; ".join(found))


# ---- the rule: one set of flags decides the precision, the engine dtype and vLLM's build ----

KINDS = {  # kind: (AVX2, AVX-512, AVX-512 BF16, AMX) -> (vLLM's build, bf16 native)
    "avx2": ((True, False, False, False), ("_C_AVX2", False)),
    "avx512": ((True, True, False, False), ("_C_AVX512", False)),
    "avx512_bf16": ((True, True, True, False), ("_C", True)),
    "amx": ((True, True, True, True), ("_C", True)),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_cpu_kind_gets_vllms_build_and_the_precision_that_fits(kind, monkeypatch):
    (avx2, avx512, bf16, amx), (build, native) = KINDS[kind]
    monkeypatch.setattr(hw.platform, "machine", lambda: "x86_64")
    for name, value in (("_is_avx2_supported", avx2), ("_is_avx512_supported", avx512),
                        ("_is_avx512_bf16_supported", bf16), ("_is_amx_tile_supported", amx)):
        monkeypatch.setattr(torch.cpu, name, lambda value=value: value)
    # oneDNN says yes on any AVX-512 core (it emulates bf16 there); drmas must not follow it
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: avx512)
    assert hw.vllm_cpu_kernels() == build
    assert hw.bf16_is_native("cpu") is native
    assert hw.default_precision("cpu") == ("bf16-mixed" if native else "32-true")
    assert hw.engine_dtype("auto") == ("bfloat16" if native else "float32")
    assert hw.cpu_kind().endswith(f"vllm-cpu kernels {build}")


def test_off_x86_onednn_decides_and_vllm_has_one_build(monkeypatch):
    monkeypatch.setattr(hw.platform, "machine", lambda: "aarch64")
    for answer in (True, False):
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda answer=answer: answer)
        assert hw.bf16_is_native("cpu") is answer
        assert hw.vllm_cpu_kernels() == "_C"
        assert not any(hw.cpu_flags().values())


@pytest.mark.skipif(not (hw.is_x86() and os.path.exists("/proc/cpuinfo")), reason="reads x86 Linux flags")
def test_the_flags_agree_with_the_kernels_own_list():
    with open("/proc/cpuinfo") as f:
        flags = set(next(line for line in f if line.startswith("flags")).split(":")[1].split())
    mine = hw.cpu_flags()
    assert mine["AVX2"] == ("avx2" in flags)
    assert mine["AVX-512"] == ({"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags)
    assert mine["AVX-512 BF16"] == ("avx512_bf16" in flags)
    assert mine["AMX"] == ("amx_tile" in flags)


def test_every_test_run_names_its_cpu_kind():
    spec = importlib.util.spec_from_file_location("tests_conftest", ROOT / "tests" / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    header = conftest.pytest_report_header(None)
    assert any(hw.cpu_kind() in line for line in header), header
    assert any(line.startswith("cpu: ") and f"{os.cpu_count()} cores" in line for line in header), header


# ---- the quiet console with vLLM, on each kind this CPU can stand in for ----

def emulable() -> list[str]:
    """The kinds this CPU runs: its own and every smaller one."""
    if not hw.is_x86():
        return [None]
    flags = hw.cpu_flags()
    own = "avx512_bf16" if flags["AVX-512 BF16"] else "avx512" if flags["AVX-512"] else "avx2"
    smaller = [k for k in ("avx2", "avx512") if flags["AVX-512"] and k != own]
    return [None, *smaller]  # None: the CPU as it is


QUIET = """
import torch
from drmas import console
from drmas.engines.vllm.process import loaded_kernels
from drmas.engines.vllm.runtime import import_vllm
from drmas.hardware import vllm_cpu_kernels
console.quiet()
import_vllm()
console.quiet_numa_binding()
wrapped = getattr(torch.ops._C.init_cpu_memory_env, "drmas_quiet", False)
print("KERNELS", loaded_kernels(), vllm_cpu_kernels(), wrapped)
"""


@pytest.mark.integration  # three vLLM imports: 13 s of the fast tier's 3 minutes
@pytest.mark.skipif(not vllm_available(), reason="vllm (vllm-cpu on CPU) is not installed")
def test_the_quiet_console_loads_the_kernels_vllm_picks():
    """In processes of their own (an illegal instruction fails this test, not pytest), started
    together: about 7 s each on 2 cores."""
    procs = {}
    for kind in emulable():
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests" / "cpu_kind"), str(ROOT)]))
        env.pop("DRMAS_TEST_CPU_KIND", None)
        if kind:
            env["DRMAS_TEST_CPU_KIND"] = kind
        procs[kind or "this CPU"] = subprocess.Popen([sys.executable, "-c", QUIET], env=env, text=True,
                                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for kind, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{kind}: exit {proc.returncode} (-4: SIGILL)\n{err[-2000:]}"
        said = next(line for line in out.splitlines() if line.startswith("KERNELS"))
        loaded, picked, wrapped = said.split()[1:]
        assert loaded == picked and wrapped == "True", (kind, loaded, picked, wrapped)
        if kind != "this CPU":
            assert loaded == KINDS[kind][1][0], (kind, loaded)
