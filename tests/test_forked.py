"""The forked runner of the recipe tests ends a script exactly as ``subprocess.run`` does."""

import textwrap

import pytest
from forked import run_script

pytestmark = pytest.mark.integration  # starts the recipe tests' zygote (the heavy imports) and subprocesses

SCRIPT = textwrap.dedent("""
    import atexit, os, signal, sys, tempfile
    atexit.register(lambda: print("atexit ran"))
    print(os.getcwd(), os.environ["PROBE"], tempfile.gettempdir(), *sys.argv[1:])
    print("to stderr", file=sys.stderr)
    mode = sys.argv[1]
    if mode == "exit":
        sys.exit(3)
    if mode == "raise":
        raise ValueError("bad")
    if mode == "kill":
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.parametrize("mode", ["ok", "exit", "raise", "kill"])
def test_a_forked_run_ends_as_a_subprocess_does(tmp_path, monkeypatch, mode):
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    env = {"PROBE": "p1", "TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    forked = run_script([str(script), mode, "x y"], cwd=tmp_path, env=env)
    monkeypatch.setenv("DRMAS_TEST_FORK", "0")
    plain = run_script([str(script), mode, "x y"], cwd=tmp_path, env=env)
    assert forked.returncode == plain.returncode == {"ok": 0, "exit": 3, "raise": 1, "kill": -9}[mode]
    assert forked.stdout == plain.stdout
    assert forked.stdout.startswith(f"{tmp_path} p1 {tmp_path} {mode} x y\n")
    assert ("atexit ran" in forked.stdout) == (mode != "kill")
    assert forked.stderr.startswith("to stderr\n") and plain.stderr.startswith("to stderr\n")
    if mode == "raise":
        assert (forked.stderr.rstrip().endswith("ValueError: bad")
                and plain.stderr.rstrip().endswith("ValueError: bad"))
