"""The sandbox's allowlist view, on both paths (as root, and as an unprivileged user created for
the test): a hostile program looks for the code judge's answer key, the repository, a run
directory, the trainer's working directory, the homes, ``/run``, ``/var``, ``/sys`` and the rest,
installed packages and a Unix socket, and tries to write to what it sees; and a cheating coder that
searches the filesystem for its problem's golden outputs scores 0."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from test_sandbox import REPO, _unprivileged_python, user_dirs  # noqa: F401 (a fixture)

from drmas.workflows.code.judge import Judge, pass_rate
from drmas.workflows.code.loaders import EMBEDDED, embedded_problems, load_code_file
from drmas.workflows.sandbox import SandboxSettings
from drmas.workflows.sandbox import features, process, run_python
from drmas.workflows.sandbox.view import view_spec

# what the hostile program tries; {cfg}: a JSON object of paths
_LOOK = """
import json, os, socket
cfg = json.loads({cfg!r})
def attempt(fn):
    try:
        return fn()
    except OSError as e:
        return e.errno
def read(path):
    with open(path, "rb") as f:
        return "read %d bytes" % len(f.read())
def write(path):
    with open(path, "a") as f:
        f.write("pwned")
    return "wrote"
def connect(path):
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
    return "connected"
print(json.dumps({{
    "top": {{d: attempt(lambda: sorted(os.listdir(d))) for d in ("/", "/etc", "/dev")}},
    "read": {{p: attempt(lambda: read(p)) for p in cfg["read"]}},
    "list": {{p: attempt(lambda: sorted(os.listdir(p))) for p in cfg["list"]}},
    "socket": attempt(lambda: connect(cfg["socket"])),
    "write": {{p: attempt(lambda: write(p)) for p in ("/x", "/etc/passwd", "/usr/x", cfg["read"][0])}},
}}))
"""

_DEBIAN_PACKAGES = ["/usr/lib/python3/dist-packages"]  # where the system Python's packages live
_HIDDEN = ["/home", "/root", "/run", "/var", "/sys", "/srv", "/opt", "/mnt", "/media", "/boot", "/work"]
_ENOENT, _EACCES, _EROFS = 2, 13, 30


def _look(secrets: list[str], dirs: list[str], sock: str) -> str:
    return _LOOK.format(cfg=json.dumps({"read": secrets, "list": dirs + _HIDDEN, "socket": sock}))


def _listen(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    os.chmod(path, 0o777)
    server.listen()
    return server


def _check(report: dict[str, Any], spec: dict[str, Any], secrets: list[str]) -> None:
    """Only the view is there: nothing of the trainer's is read, listed, connected to or written."""
    shown = spec["binds"] + [link for link, _ in spec["links"]]
    assert set(report["top"]["/"]) == {"dev", "etc", "proc", "tmp"} | {p.split("/")[1] for p in shown}
    etc = {"group", "hosts", "nsswitch.conf", "passwd"} | {os.path.basename(p) for p, _ in spec["etc"]}
    assert set(report["top"]["/etc"]) == etc
    assert set(report["top"]["/dev"]) == {"fd", "null", "shm", "stderr", "stdin", "stdout", "urandom", "zero"}
    assert report["read"] == {p: _ENOENT for p in secrets}
    for path, got in report["list"].items():
        below = sorted({b[len(path):].split("/")[1] for b in spec["binds"] if b.startswith(path + "/")})
        # a masked package directory is empty; a directory above the interpreter (pyenv's under
        # /root) shows the way to it and nothing else; the rest is not there
        assert got == ([] if path in spec["masked"] else below or _ENOENT), (path, got)
    assert report["socket"] == _ENOENT
    # the root is a read-only tmpfs; what is in it is read-only too, or not the program's
    writes = report["write"]
    assert writes.pop("/x") == _EROFS and writes.pop(secrets[0]) == _ENOENT
    assert set(writes.values()) <= {_EACCES, _EROFS}, writes


def test_as_root_the_program_sees_only_the_view(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = REPO / f".sandbox-run-{uuid.uuid4().hex}"
    run_dir.mkdir()
    sock = Path("/run") / f"drmas-test-{uuid.uuid4().hex}.sock"
    try:
        (run_dir / "last.ckpt").write_text("weights")
        server = _listen(sock)
        monkeypatch.chdir(tmp_path)
        (tmp_path / "notes.txt").write_text("trainer's")
        secrets = [str(EMBEDDED), str(run_dir / "last.ckpt"), str(tmp_path / "notes.txt")]
        spec = view_spec(features.python())
        dirs = [str(REPO), str(run_dir), str(tmp_path), *spec["masked"], *_venv_site_packages()]
        r = run_python(_look(secrets, dirs, str(sock)), timeout_s=20)
        server.close()
    finally:
        sock.unlink(missing_ok=True)
        for f in run_dir.iterdir():
            f.unlink()
        run_dir.rmdir()
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert spec["masked"] and all(report["list"][m] == [] for m in spec["masked"])
    _check(report, spec, secrets)
    assert open(EMBEDDED).readline().startswith('{"id"')  # the answer key is still there for the judge


def _venv_site_packages() -> list[str]:
    import sysconfig

    return sorted({sysconfig.get_paths()["purelib"]} - {os.path.realpath(sys.base_prefix)})


_AS_USER = """
import json, sys
sys.path.append(sys.argv[1])
import sandbox as sb
r = sb.run_python(sys.argv[2], stdin=sys.argv[3], timeout_s=20)
print(json.dumps({"stdout": r.stdout, "stderr": r.stderr, "rc": r.returncode,
                  "spec": sb.view.view_spec(sb.features.python())}))
"""


def _as_user(uid: int, home: Path, code: str, stdin: str = "") -> dict[str, Any]:
    python = _unprivileged_python()
    proc = subprocess.run(
        [python, "-I", "-c", _AS_USER, process.PACKAGE_PARENT, code, stdin],
        capture_output=True, text=True, timeout=120, user=uid, group=uid, extra_groups=[], check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(home)}, cwd=str(home),
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_without_root_the_program_sees_only_the_view(user_dirs) -> None:  # noqa: F811
    uid, own, home = user_dirs
    (own / "last.ckpt").write_text("weights")
    os.chown(own / "last.ckpt", uid, uid)
    sock = own / "bus"
    server = _listen(sock)
    secrets = [str(EMBEDDED), str(own / "last.ckpt"), str(home / "key")]
    try:
        absent = [str(REPO), str(own), str(home), *_DEBIAN_PACKAGES]
        out = _as_user(uid, home, _look(secrets, absent, str(sock)))
    finally:
        server.close()
    assert out["rc"] == 0, out["stderr"]
    report = json.loads(out["stdout"])
    _check(report, out["spec"], secrets)
    assert all(report["list"][m] == [] for m in _DEBIAN_PACKAGES if m in out["spec"]["masked"])
    assert (own / "last.ckpt").read_text() == "weights"


# --- the judge ------------------------------------------------------------------------------

# A coder that cheats: it reads its test's input, looks for the answer key where drmas keeps it,
# then anywhere on the filesystem, and prints the golden output it finds.
_CHEAT = """
import json, os, sys
given = sys.stdin.read()
def scan(path):
    try:
        with open(path, errors="ignore") as f:
            lines = f.read(20_000_000).splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        for test in row.get("tests", []) if isinstance(row, dict) else []:
            if isinstance(test, dict) and test.get("input") == given:
                return test.get("output")
found = scan({answers!r})
for top, dirs, files in os.walk("/"):
    if found is not None:
        break
    dirs[:] = [d for d in dirs if os.path.join(top, d) not in ("/proc", "/sys", "/dev")]
    for name in files:
        if name.endswith(".jsonl") and found is None:
            found = scan(os.path.join(top, name))
print(found or "", end="")
"""


def _cheat() -> str:
    return _CHEAT.format(answers=str(EMBEDDED))


@pytest.mark.integration  # sandboxed processes in and out of the view (4 s)
def test_a_program_that_finds_the_answer_key_outside_scores_one_and_zero_in_the_sandbox() -> None:
    task = embedded_problems("test")[0]
    tests = task.tests[:2]
    plain = subprocess.run([sys.executable, "-I", "-S", "-c", _cheat()], input=tests[0].input,
                           capture_output=True, text=True, timeout=60, check=True)
    assert plain.stdout == tests[0].output  # the cheat works wherever the key is readable
    # the cheat walks the whole view (a few seconds alone; more beside the other worker and with
    # a browser's files under /usr): a limit it never meets, so "ok" is what the view decides
    judge = Judge(SandboxSettings(time_limit_s=40.0, workers=1))
    try:
        [verdicts] = judge.run([(_cheat(), tests)])
        [reference] = judge.run([(task.solution, tests)])
    finally:
        judge.close()
    assert [v.status for v in verdicts] == ["ok", "ok"] and [v.output for v in verdicts] == ["", ""]
    assert pass_rate(verdicts) == 0.0 and pass_rate(reference) == 1.0


def test_without_root_the_cheat_finds_nothing(user_dirs) -> None:  # noqa: F811
    uid, _, home = user_dirs
    test = embedded_problems("test")[0].tests[0]
    python = _unprivileged_python()
    plain = subprocess.run([python, "-I", "-S", "-c", _cheat()], input=test.input, capture_output=True,
                           text=True, timeout=60, user=uid, group=uid, extra_groups=[], check=True,
                           env={"PATH": "/usr/bin:/bin"}, cwd=str(home))
    assert plain.stdout == test.output  # this user can read the key outside the sandbox
    out = _as_user(uid, home, _cheat(), test.input)
    assert out["rc"] == 0 and out["stdout"] == "", out


def test_a_file_with_answers_that_programs_could_read_is_refused(tmp_path: Path) -> None:
    """Data files with answers never lie in the view: one below the interpreter's prefix (what the
    program sees) is refused by the code and math loaders; the embedded problems, the venv's and
    the interpreter's site-packages and the test's own directory are out of sight."""
    from drmas.workflows.math.loaders import load_math_file
    from drmas.workflows.sandbox.view import exposed

    prefix = os.path.realpath(sys.base_prefix)
    site = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    assert [exposed(p) for p in (str(EMBEDDED), str(tmp_path), site, __file__)] == [None] * 4
    assert exposed(os.__file__) == prefix  # the standard library
    share = Path(prefix, "share")
    share.mkdir(exist_ok=True)
    if not os.access(share, os.W_OK):
        pytest.skip(f"cannot write below the interpreter's prefix {prefix}")
    keys = share / f"drmas-test-{uuid.uuid4().hex}.jsonl"
    keys.write_text(json.dumps({"question": "q", "tests": [{"input": "", "output": "1"}],
                                "problem": "1+0?", "answer": "1"}) + "\n")
    try:
        for load in (load_code_file, load_math_file):
            with pytest.raises(ValueError, match="which sandboxed programs can read"):
                load(keys)
        copy = tmp_path / "keys.jsonl"
        copy.write_text(keys.read_text())
        assert load_code_file(copy)[0].tests[0].output == "1" and load_math_file(copy)[0].answer == "1"
    finally:
        keys.unlink()
