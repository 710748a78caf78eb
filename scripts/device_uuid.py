"""On a GPU machine: the UUID drmas names an engine process's GPU by is the one NVML and CUDA know,
and a child shown that UUID alone sees that very GPU as its cuda:0, whatever CUDA_DEVICE_ORDER says
(the trainer's CUDA started first, in its default order). Prints one line per GPU; exit 1 on a
mismatch. Run by scripts/device_check.sh.

    python scripts/device_uuid.py
"""

from __future__ import annotations

import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from drmas.engines.placement import device_env, gpu_uuid  # noqa: E402

CHILD = ("import torch; from drmas.engines.placement import gpu_uuid; "
         "print(torch.cuda.device_count(), gpu_uuid(0))")


def main() -> int:
    os.environ.pop("CUDA_DEVICE_ORDER", None)
    count = torch.cuda.device_count()  # CUDA starts here, in its default order
    nvml = torch.cuda._raw_device_uuid_nvml() or []
    bad = 0
    for index in range(count):
        uuid = gpu_uuid(index)
        env = device_env(torch.device("cuda", index), visible="")
        for order in ("PCI_BUS_ID", "FASTEST_FIRST"):
            root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, cwd=root,
                                   env={**os.environ, **env, "CUDA_DEVICE_ORDER": order})
            seen = child.stdout.split()
            ok = uuid in nvml and env["CUDA_VISIBLE_DEVICES"] == uuid and seen == ["1", uuid]
            bad += not ok
            print(f"cuda:{index} {uuid}: NVML {'knows it' if uuid in nvml else 'does not know it'}; a child "
                  f"with CUDA_DEVICE_ORDER={order} sees {' '.join(seen) or child.stderr.strip()[-200:]}: "
                  f"{'ok' if ok else 'MISMATCH'}")
    return 1 if bad or not count else 0


if __name__ == "__main__":
    sys.exit(main())
