"""Run model-written Python programs confined: ``run_python`` and ``SandboxPool`` (docs/sandbox.md).

Every program runs in a fresh interpreter, ``python -I -S -B main.py``: isolated mode, no ``site``
(the standard library only; packages installed beside the trainer are not importable and no
``.pth`` file runs), no ``.pyc`` writes, in a fresh working directory (also ``HOME`` and
``TMPDIR``) removed afterwards, with only ``PATH``, ``LANG``, ``HOME`` and ``TMPDIR`` in its
environment. What it can see and use:

* :mod:`.view`: an allowlist of the filesystem (the interpreter, ``/usr``, ``/lib*``, a minimal
  ``/etc`` and ``/dev``, private ``/tmp`` and work dir; no package data, user data or run dir);
* :mod:`.limits`: per-process rlimits and a bound on the whole run (cgroup, or the run's own
  process limit);
* :mod:`.process`: the bootstrap that enters the namespaces (network, IPC; as root an own uid per
  run, without root a user and pid namespace of its own) and kills and reaps everything after;
* :mod:`.features`: what this machine allows, probed once; where programs cannot be confined they
  are refused (:class:`SandboxUnavailable`) unless ``allow_unconfined=True``;
* :mod:`.run` and :mod:`.pool`: one program, and many at a time.

The bootstrap imports this package from its directory with nothing else on ``sys.path``, so every
module here uses the standard library only and imports its siblings relatively.
"""

from .pool import SandboxPool
from .result import OUTPUT_CAP, Result, SandboxError, SandboxUnavailable
from .run import run_python
from .settings import SandboxSettings

__all__ = ["OUTPUT_CAP", "Result", "SandboxError", "SandboxPool", "SandboxSettings", "SandboxUnavailable",
           "run_python"]
