"""A user's program imports from its own folder, the working directory and the environment, never
from drmas's script folders: Python puts a script's folder first on ``sys.path``, where a recipe
named ``agents.py`` was imported instead of the OpenAI Agents SDK's ``agents`` package."""

import importlib.metadata
import os
import sys
from pathlib import Path

from drmas.checkout import RECIPES, SCRIPT_FOLDERS, without_drmas_folders
from drmas.episode_worker import episode_ref, importing_from, load_episode, program_path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
PROGRAM_FOLDERS = (EXAMPLES, EXAMPLES / "agents", EXAMPLES / "agents" / "frameworks")
"""Folders whose scripts users run, or that are a trained example program's own folder."""


def importable_names(folder: Path) -> set[str]:
    """What ``import NAME`` finds in ``folder``: modules and regular packages (a folder without an
    ``__init__.py`` is a namespace portion, which any module or package elsewhere on the path wins over)."""
    return ({p.stem for p in folder.glob("*.py")}
            | {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()})


def shadowed(folders) -> dict[str, str]:
    taken = {name: f"the distribution(s) {', '.join(dists)}"
             for name, dists in importlib.metadata.packages_distributions().items()}
    taken.update({name: "the standard library" for name in sys.stdlib_module_names})
    return {f"{folder.relative_to(ROOT)}/{name}": taken[name]
            for folder in folders for name in sorted(importable_names(folder)) if name in taken}


def test_no_module_of_a_script_folder_shadows_an_installed_package_or_the_standard_library():
    folders = [Path(f) for f in SCRIPT_FOLDERS] + [p for p in (ROOT / "tests").rglob("*") if p.is_dir()
                                                  and "__pycache__" not in p.parts]
    assert "agents" in importlib.metadata.packages_distributions()  # the guard sees the SDK
    assert shadowed(folders + list(PROGRAM_FOLDERS)) == {}


def test_the_guard_names_a_shadowing_script(tmp_path, monkeypatch):
    # what putting recipes/agents.py or recipes/json.py back would do
    for name in ("agents.py", "json.py", "helper.py"):
        (tmp_path / name).write_text("")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path.parent)
    assert shadowed([tmp_path]) == {f"{tmp_path.name}/agents": "the distribution(s) openai-agents",
                                    f"{tmp_path.name}/json": "the standard library"}


def test_every_recipe_script_is_in_the_guarded_folder():
    assert {str(Path(SCRIPT_FOLDERS[0]) / script) for script in RECIPES.values()} == {
        str(p) for p in (ROOT / "recipes").glob("*.py")}


def test_a_programs_path_is_its_folder_the_working_directory_and_the_environment(tmp_path):
    # as in a trainer started as `python recipes/own_agents.py` under pytest: the recipe's folder
    # first, the test folders, then the environment; none of drmas's folders reach the program
    env = [p for p in sys.path if p and not p.startswith(str(ROOT))]
    trainer = [str(ROOT / "recipes"), str(ROOT / "tests" / "workflows"), str(ROOT / "bench"), *env]
    assert without_drmas_folders(trainer) == env
    team = tmp_path / "team"
    team.mkdir()
    (team / "my_team.py").write_text("def episode(task, client):\n    return 1.0\n")
    ref = episode_ref(f"{team / 'my_team.py'}:episode")
    assert ref == ("file", str(team / "my_team.py"), "episode", str(team))
    path = program_path(ref, str(tmp_path), without_drmas_folders(trainer))
    assert path == [str(team), str(tmp_path), *env]
    # a module named by a string is found through the working directory, as `python -m` finds it
    assert program_path(episode_ref("my_team:episode"), str(team), env) == [str(team), *env]


def test_a_file_program_imports_its_sibling_and_the_sdk_not_a_recipe(tmp_path, monkeypatch):
    # the trainer's own sys.path starts with a folder holding a module named like the SDK's package
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "agents.py").write_text("raise ImportError('a script folder was imported from')\n")
    team = tmp_path / "team"
    team.mkdir()
    (team / "helpers.py").write_text("ANSWER = 5\n")
    (team / "my_team.py").write_text("import agents\nfrom helpers import ANSWER\n\n"
                                     "def episode(task, client):\n"
                                     "    return float(ANSWER == 5 and hasattr(agents, 'Agent'))\n")
    monkeypatch.syspath_prepend(str(recipes))
    monkeypatch.chdir(tmp_path)
    for name in ("agents", "helpers"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    ref = episode_ref("team/my_team.py:episode")
    path = program_path(ref, os.getcwd(), [p for p in sys.path if p != str(recipes)])
    with importing_from(path):
        fn = load_episode(ref)
    assert fn({}, None) == 1.0 and str(recipes) in sys.path  # the trainer's own path is back


def test_a_functions_program_folder_is_where_its_module_was_imported_from(tmp_path, monkeypatch):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "team.py").write_text("def episode(task, client):\n    return 0.0\n")
    (tmp_path / "solo.py").write_text("def episode(task, client):\n    return 0.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from pkg.team import episode as packaged
    from solo import episode as plain

    assert episode_ref(packaged) == ("module", "pkg.team", "episode", str(tmp_path))
    assert episode_ref(plain) == ("module", "solo", "episode", str(tmp_path))
    for name in ("pkg", "pkg.team", "solo"):
        monkeypatch.delitem(sys.modules, name)


