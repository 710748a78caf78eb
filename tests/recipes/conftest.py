"""Recipe runs shared by the tests that read them (a recipe run costs seconds to a minute)."""

import pytest
from recipe_runs import rigged_run


@pytest.fixture(scope="session")
def rigged(tmp_path_factory):
    """``rigged(run)``: the folder and process of that rigged recipe run, run once per session."""
    done = {}

    def get(run: str):
        if run not in done:
            tmp = tmp_path_factory.mktemp(f"rigged-{run}")
            done[run] = (tmp, rigged_run(run, tmp))
        return done[run]

    return get
