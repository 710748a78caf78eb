"""Makes an interpreter, and every child it starts, see a smaller CPU than this one, so that the
code paths of AVX2-only and AVX-512-without-BF16 machines run here (tests/test_cpu_kinds.py).

Put this folder on ``PYTHONPATH`` and set ``DRMAS_TEST_CPU_KIND`` to ``avx2`` or ``avx512``. Python
imports ``sitecustomize`` at start-up; torch is not imported here (an episode worker starts
without it): when torch imports ``torch.cpu``, the flags above the named kind answer False. Both
vLLM and drmas read the CPU through those flags, so vLLM loads the kernel build of that kind.
Only the kernels the flags choose change; torch's own (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA)
are limited by the environment of the test.
"""

import importlib.abc
import importlib.machinery
import os
import sys

_ABOVE = {"avx2": ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_avx512_vnni_supported",
                   "_is_vnni_supported", "_is_amx_tile_supported", "_is_amx_fp16_supported"),
          "avx512": ("_is_avx512_bf16_supported", "_is_amx_tile_supported", "_is_amx_fp16_supported")}


def _no() -> bool:
    return False


class _Limit(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names):
        self.names, self.spec = names, None

    def find_spec(self, fullname, path, target=None):
        if fullname != "torch.cpu":
            return None
        sys.meta_path.remove(self)  # one module, once
        self.spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        self.real, self.spec.loader = self.spec.loader, self
        return self.spec

    def create_module(self, spec):
        return self.real.create_module(spec)

    def exec_module(self, module):
        self.real.exec_module(module)
        import torch

        for name in self.names:  # vLLM reads some flags through torch._C._cpu directly
            for owner in (module, torch._C._cpu):
                if hasattr(owner, name):
                    setattr(owner, name, _no)


_kind = os.environ.get("DRMAS_TEST_CPU_KIND")
if _kind:
    sys.meta_path.insert(0, _Limit(_ABOVE[_kind]))
