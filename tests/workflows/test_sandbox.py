"""drmas.workflows.sandbox: hostile programs are contained, alone and all at once, and nothing is left
behind."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator

import pytest

from drmas.workflows import sandbox
from drmas.workflows.sandbox import limits, linux, process
from drmas.workflows.sandbox import run as sandbox_run
from drmas.workflows.programs import run_failure
from drmas.workflows.sandbox import Result, SandboxPool, run_python

TIMEOUT = 2.5
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def feats() -> sandbox.features.Features:
    return sandbox_run.features()


def _procs() -> list[tuple[int, int, str]]:
    """(pid, real uid, cmdline) of every process on the host."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        ids = process.proc_ids(int(name))
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if ids is not None:
            out.append((int(name), ids[1], cmdline))
    return out


class Watch:
    """Samples /proc while programs run: peak process count per sandbox uid; records the uids used."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.uids: set[int] = set()
        self.peak: collections.Counter[int] = collections.Counter()
        self._stop = threading.Event()
        acquire = sandbox_run._acquire_uid

        @contextlib.contextmanager
        def spy() -> Iterator[int]:
            with acquire() as uid:
                self.uids.add(uid)
                yield uid

        monkeypatch.setattr(sandbox_run, "_acquire_uid", spy)
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            counts = collections.Counter(uid for _, uid, _ in _procs() if uid in self.uids)
            for uid, n in counts.items():
                self.peak[uid] = max(self.peak[uid], n)
            time.sleep(0.01)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def leftovers(self) -> list[tuple[int, int, str]]:
        return [p for p in _procs() if p[1] in self.uids]


def _marker_procs(marker: str) -> list[tuple[int, int, str]]:
    return [p for p in _procs() if marker in p[2]]


# --- the hostile programs and what must hold for each ---------------------------------------

_MARKER = f"drmas-sandbox-test-{uuid.uuid4().hex}"
# created by the fixture below: owned by root, mode 0755 (when the tests run as root)
_ROOT_OWNED = os.path.join(tempfile.gettempdir(), f"drmas-sandbox-test-target-{uuid.uuid4().hex}")
_TARGETS = [os.path.join(_ROOT_OWNED, "pwned.txt"), str(REPO / f"pwned-{uuid.uuid4().hex}.txt")]

NORMAL = "print(sum(range(10)))"
HOSTILE = {
    "infinite_loop": "while True: pass",
    "fork_bomb": "import os\nwhile True: os.fork()",
    "memory_hog": "x = bytearray(4 * 2**30)",
    "output_flood": "import sys\nsys.stdout.write('x' * 100_000_000)",
    "write_outside": "\n".join([
        f"for path in {_TARGETS!r}:",
        "    try:",
        "        open(path, 'w').write('pwned')",
        "        print('wrote', path)",
        "    except OSError as e:",
        "        print('denied', type(e).__name__)",
    ]),
    "outliving_child": (
        "import subprocess,sys; "
        f"subprocess.Popen([sys.executable,'-c','import time; time.sleep(60)  # {_MARKER}']); "
        "print('parent done')"
    ),
}


def _check(name: str, r: Result) -> None:
    if name == "infinite_loop":
        assert r.timed_out and r.returncode is None
    elif name == "fork_bomb":
        # Either the program itself failed to fork (and died) or it ran into the timeout;
        # some fork must have hit RLIMIT_NPROC.
        assert r.timed_out or r.returncode != 0
        assert "BlockingIOError" in r.stderr or "Resource temporarily unavailable" in r.stderr
    elif name == "memory_hog":
        assert not r.timed_out and r.returncode == 1
        assert "MemoryError" in r.stderr
    elif name == "output_flood":
        assert r.truncated and not r.timed_out
        assert r.stdout == "x" * sandbox.OUTPUT_CAP
        assert r.returncode == -9  # killed when the cap was exceeded
    elif name == "write_outside":
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines()[0].startswith("denied") and r.stdout.splitlines()[1].startswith("denied")
        assert not any(os.path.exists(p) for p in _TARGETS)
    elif name == "outliving_child":
        assert r.stdout == "parent done\n" and r.returncode == 0 and not r.timed_out
    else:
        raise AssertionError(name)


@pytest.fixture(autouse=True, scope="module")
def _target_dir() -> Iterator[None]:
    os.mkdir(_ROOT_OWNED)
    os.chmod(_ROOT_OWNED, 0o755)
    yield
    shutil.rmtree(_ROOT_OWNED, ignore_errors=True)
    for path in _TARGETS:  # only exists if the sandbox failed (and then a test failed)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _timed(fn: Callable[[], Result]) -> tuple[Result, float]:
    start = time.monotonic()
    r = fn()
    return r, time.monotonic() - start


# --- plain behaviour ------------------------------------------------------------------------


def test_a_normal_program_runs() -> None:
    r = run_python(NORMAL, timeout_s=TIMEOUT)
    assert r == Result(stdout="45\n", stderr="", returncode=0, timed_out=False, truncated=False)


def test_stdin_is_passed_through() -> None:
    r = run_python("import sys\ndata = sys.stdin.read()\nprint(data.upper(), end='')", stdin="abc\ndef\n")
    assert r.stdout == "ABC\nDEF\n" and r.returncode == 0


def test_a_syntax_error_fails_with_the_traceback() -> None:
    r = run_python("def f(:\n    pass\n", timeout_s=TIMEOUT)
    assert r.returncode not in (0, None) and not r.timed_out
    assert "SyntaxError" in r.stderr and "main.py" in r.stderr and r.stdout == ""


def test_the_workdir_is_writable_private_and_removed() -> None:
    code = "import os\nopen('note.txt', 'w').write('hi')\nprint(os.getcwd())\nprint(open('note.txt').read())"
    r = run_python(code, timeout_s=TIMEOUT)
    assert r.returncode == 0, r.stderr
    workdir, content = r.stdout.split()
    assert content == "hi" and os.path.basename(workdir).startswith("drmas-sandbox-")
    assert not os.path.exists(workdir)


def test_a_run_that_cannot_be_set_up_fails_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A setup failure (injected here) is that program's failed result, logged; the batch goes on."""
    real = sandbox_run._run

    def flaky(code: str, *args: object) -> Result:
        if code == "print('unlucky')":
            raise sandbox.SandboxError("sandbox setup: [Errno 28] No space left on device")
        return real(code, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(sandbox_run, "_run", flaky)
    with SandboxPool(2) as pool:
        good, bad = pool.run([NORMAL, "print('unlucky')"], timeout_s=TIMEOUT)
    assert good.ok and good.stdout == "45\n"
    assert not bad.ok and bad.returncode is None and "No space left" in bad.error
    assert run_failure(bad) == "nothing: it could not be started"
    with pytest.raises(sandbox.SandboxError):
        run_python("print('unlucky')")  # called directly, the error is raised


def test_the_stdlib_works_but_not_site_packages() -> None:
    code = "import fractions, math\nprint(fractions.Fraction(1, 3) + 1, math.comb(5, 2))\nimport numpy"
    r = run_python(code, timeout_s=TIMEOUT)
    assert r.stdout == "4/3 10\n"
    assert "ModuleNotFoundError" in r.stderr and r.returncode == 1


def test_no_secret_of_the_parent_is_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRMAS_TEST_SECRET", "hunter2")
    code = (
        "import json, os\n"
        "try:\n"
        f"    leaked = open('/proc/{os.getpid()}/environ', 'rb').read()\n"
        "except OSError as e:\n"
        "    leaked = type(e).__name__\n"
        "print(json.dumps([sorted(os.environ), 'hunter2' in str(leaked)]))"
    )
    r = run_python(code, timeout_s=TIMEOUT)
    names, leaked = json.loads(r.stdout)
    assert names == ["HOME", "LANG", "PATH", "TMPDIR"] and leaked is False


def test_the_network_is_unreachable(feats: sandbox.features.Features) -> None:
    if not feats.unshare & linux.CLONE_NEWNET:
        pytest.skip(f"no network namespace on this machine ({feats.describe()})")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.2)
        port = server.getsockname()[1]
        code = (
            "import socket\ntry:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n    print('connected')\n"
            "except OSError as e:\n    print('blocked', e.errno)"
        )
        r = run_python(code, timeout_s=TIMEOUT)
        assert r.stdout.startswith("blocked"), r.stdout + r.stderr
        with pytest.raises(socket.timeout):
            server.accept()


def test_a_daemonized_grandchild_is_killed_too() -> None:
    marker = f"{_MARKER}-daemon"
    code = (
        "import os, subprocess, sys\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)  # {marker}'])\n"
        "    os._exit(0)\n"
        "os.wait()\nprint('detached')"
    )
    r, wall = _timed(lambda: run_python(code, timeout_s=TIMEOUT))
    assert r.stdout == "detached\n" and r.returncode == 0 and wall < TIMEOUT
    assert _marker_procs(marker) == []


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError):
        run_python("pass", timeout_s=0)
    with pytest.raises(ValueError):
        run_python("pass", memory_mb=1)
    with SandboxPool(2) as pool, pytest.raises(ValueError):
        pool.run(["pass", "pass"], stdin=["a"])


# --- hostile programs, alone and together ---------------------------------------------------


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_each_hostile_program_is_contained(
    name: str, feats: sandbox.features.Features, monkeypatch: pytest.MonkeyPatch
) -> None:
    if name == "write_outside" and not feats.drop_uid:
        pytest.skip("not root: the program keeps our uid, so writes are not confined (documented)")
    with Watch(monkeypatch) as watch:
        r, wall = _timed(lambda: run_python(HOSTILE[name], timeout_s=TIMEOUT))
    _check(name, r)
    assert wall < TIMEOUT + 1, wall
    assert watch.leftovers() == [] and _marker_procs(_MARKER) == []
    assert all(n <= limits.NPROC for n in watch.peak.values()), watch.peak


def test_all_hostile_programs_at_once_with_a_normal_one(
    feats: sandbox.features.Features, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = ["normal", *sorted(HOSTILE)]
    codes = [NORMAL, *(HOSTILE[n] for n in sorted(HOSTILE))]
    if not feats.drop_uid:
        names.remove("write_outside")
        codes.remove(HOSTILE["write_outside"])
    walls: dict[str, float] = {}
    inner = sandbox_run.run_python

    def timed_run(code: str, *args: object) -> Result:
        r, wall = _timed(lambda: inner(code, *args))  # type: ignore[arg-type]
        walls[names[codes.index(code)]] = wall
        return r

    monkeypatch.setattr(sandbox_run, "run_python", timed_run)
    with Watch(monkeypatch) as watch, SandboxPool(max_workers=len(codes)) as pool:
        results = pool.run(codes, timeout_s=TIMEOUT)
    print("per-program wall seconds:", {n: round(w, 2) for n, w in walls.items()})
    assert len(results) == len(codes)
    by_name = dict(zip(names, results, strict=True))
    assert by_name.pop("normal") == Result("45\n", "", 0, False, False)
    for name, r in by_name.items():
        _check(name, r)
    assert all(w < TIMEOUT + 1 for w in walls.values()), walls
    assert len(walls) == len(codes)
    if feats.drop_uid:
        assert len(watch.uids) == len(codes)  # one uid per concurrent run
    assert all(n <= limits.NPROC for n in watch.peak.values()), watch.peak
    assert watch.leftovers() == [] and _marker_procs(_MARKER) == []


# --- without root ---------------------------------------------------------------------------

_UNPRIVILEGED_SCRIPT = """
import json, sys
sys.path.append(sys.argv[1])  # the package alone, with this interpreter's standard library
import sandbox as sb
feats = sb.run.features()
normal = sb.run_python("import os, resource as r; print(os.getuid(), r.getrlimit(r.RLIMIT_NPROC)[0])")
loop = sb.run_python("while True: pass", timeout_s=1.5)
orphan = sb.run_python(sys.argv[2])
writes = sb.run_python(sys.argv[3])
print(json.dumps({"drop": feats.drop_uid, "confined": feats.confined, "normal": normal.stdout,
                  "loop": [loop.timed_out, loop.returncode], "orphan": orphan.stdout,
                  "writes": writes.stdout}))
"""

_TRY_WRITES = """
import os, sys
for path in sys.argv[1:] or {paths!r}:
    try:
        open(path, "w").write("pwned")
        print("wrote", os.path.basename(path))
    except OSError as e:
        print("denied", os.path.basename(path), e.errno)
try:
    print("read", open({secret!r}).read())
except OSError as e:
    print("hidden", e.errno)
print("pid", os.getpid(), "signal trainer", end=" ")
try:
    os.kill({trainer}, 0)
    print("possible")
except OSError as e:
    print("impossible", e.errno)
"""


def _unprivileged_python() -> str:
    if os.geteuid() != 0:
        pytest.skip("needs root to start the unprivileged helper")
    python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    if python is None or not os.access(python, os.X_OK) or Path(python).resolve().is_relative_to("/root"):
        pytest.skip("no interpreter an unprivileged user can run")
    return python


@pytest.fixture
def user_dirs() -> Iterator[tuple[int, Path, Path]]:
    """A uid outside the sandbox range, a directory it owns (outside every tmp dir) and its home.
    Each pytest worker has a uid of its own: the tests count the uid's processes."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:])
    uid = sandbox_run._UID_BASE + sandbox_run._UID_SLOTS + worker
    base = Path(tempfile.mkdtemp(prefix=".unprivileged-", dir=REPO))
    own, home = base / "own", base / "home"
    own.mkdir()
    home.mkdir()
    (home / "key").write_text("secret")
    for p in (base, own, home, home / "key"):
        os.chown(p, uid, uid)
    yield uid, own, home
    shutil.rmtree(base)


def test_without_root_the_program_is_confined_with_limits(user_dirs: tuple[int, Path, Path]) -> None:
    """As an unprivileged user the program keeps that uid, with the limits and the cleanup, inside
    a user namespace: the allowlist view (the user's own directories and home absent), private tmp
    dirs, its own pid space and its own process limit."""
    python = _unprivileged_python()
    uid, own, home = user_dirs
    marker = f"{_MARKER}-fallback"
    orphan = (
        "import subprocess,sys; "
        f"subprocess.Popen([sys.executable,'-c','import time; time.sleep(60)  # {marker}']); "
        "print('parent done')"
    )
    paths = [str(own / "x"), "mine.txt", "/tmp/t", "/dev/shm/s"]
    writes = _TRY_WRITES.format(paths=paths, secret=str(home / "key"), trainer=os.getpid())
    proc = subprocess.run(
        [python, "-I", "-c", _UNPRIVILEGED_SCRIPT, process.PACKAGE_PARENT, orphan, writes],
        capture_output=True, text=True, timeout=60, user=uid, group=uid, extra_groups=[], check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(home)}, cwd="/",
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    got_uid, nproc = map(int, out["normal"].split())
    assert out["drop"] is False and got_uid == uid and nproc == limits.NPROC
    assert out["loop"] == [True, None]
    assert out["orphan"] == "parent done\n" and _marker_procs(marker) == []
    assert [p for p in _procs() if p[1] == uid] == []
    assert out["confined"] is True, proc.stderr
    # a directory the user owns is not in the view (ENOENT); the work dir and the private tmp dirs
    # are writable
    lines = out["writes"].splitlines()
    assert lines == [
        "denied x 2", "wrote mine.txt", "wrote t", "wrote s", "hidden 2", "pid 1 signal trainer impossible 3"]
    assert list(own.iterdir()) == [] and not Path("/dev/shm/s").exists()


_NO_USERNS = """
import ctypes, os, sys
uid, python, *argv = int(sys.argv[1]), sys.argv[2], *sys.argv[3:]
go_r, go_w = os.pipe()
ready_r, ready_w = os.pipe()
pid = os.fork()
if pid == 0:  # a user namespace (all ids mapped) whose limit forbids nested ones, then drop to uid
    if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0:
        os._exit(90)
    os.write(ready_w, b"x")
    os.read(go_r, 1)
    with open("/proc/sys/user/max_user_namespaces", "w") as f:
        f.write("0")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    os.execv(python, [python, "-I", *argv])
if not os.read(ready_r, 1):
    sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
for name in ("uid_map", "gid_map"):
    with open(f"/proc/{pid}/{name}", "w") as f:
        f.write("0 0 4000000000")
os.write(go_w, b"x")
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""

_REFUSED_SCRIPT = """
import json, sys
sys.path.append(sys.argv[1])  # the package alone, with this interpreter's standard library
import sandbox as sb
try:
    sb.run_python("print(1)")
    refused = ""
except sb.SandboxUnavailable as e:
    refused = str(e)
with sb.SandboxPool(1, allow_unconfined=True) as pool:
    allowed = pool.run(["print(6 * 7)"])[0]
print(json.dumps({"refused": refused, "allowed": allowed.stdout, "confined": sb.run.features().confined}))
"""


def test_without_user_namespaces_programs_are_refused_unless_allowed(
    user_dirs: tuple[int, Path, Path]
) -> None:
    python = _unprivileged_python()
    uid, _, home = user_dirs
    proc = subprocess.run(
        [python, "-I", "-c", _NO_USERNS, str(uid), python, "-c", _REFUSED_SCRIPT, process.PACKAGE_PARENT],
        capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(home)}, cwd="/",
    )
    if proc.returncode == 90:
        pytest.skip("user namespaces are not available to root here")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["confined"] is False and out["allowed"] == "42\n"
    assert "cannot be confined" in out["refused"] and "allow_unconfined" in out["refused"]
    assert "user namespaces" in out["refused"] and "every file" in out["refused"]
