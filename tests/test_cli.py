"""Per-recipe config sections: one file, merged differently by each recipe."""

import pytest

from drmas.cli import merge_recipe_section

CONFIG = {
    "model": {"policies": {"shared": {"model": "m", "lr": 1e-6, "train_sampling": {"temperature": 1.0}}}},
    "data": {"group_size": 4, "workflow": {"class_path": "A", "init_args": {"x": 1, "y": 2}}},
    "recipes": {
        "one": {"model": {"policies": {"shared": {"train_sampling": {"max_new_tokens": 9}}}},
                "data": {"workflow": {"init_args": {"y": 3}}}},
        "two": {"data": {"group_size": 8, "workflow": {"class_path": "B", "init_args": {"z": 0}}}},
    },
}


def test_sections_merge_key_by_key_over_the_common_part():
    one = merge_recipe_section(CONFIG, "one")
    assert one["model"]["policies"]["shared"] == {"model": "m", "lr": 1e-6,
                                                  "train_sampling": {"temperature": 1.0, "max_new_tokens": 9}}
    assert one["data"] == {"group_size": 4, "workflow": {"class_path": "A", "init_args": {"x": 1, "y": 3}}}
    assert "recipes" not in one


def test_another_class_replaces_the_common_init_args():
    assert merge_recipe_section(CONFIG, "two")["data"] == {"group_size": 8, "workflow": {"class_path": "B", "init_args": {"z": 0}}}


def test_a_recipe_without_a_section_gets_the_common_part():
    assert merge_recipe_section(CONFIG, "three") == {k: v for k, v in CONFIG.items() if k != "recipes"}
    assert merge_recipe_section(CONFIG, None)["data"]["group_size"] == 4


def test_malformed_sections_are_named():
    with pytest.raises(ValueError, match="'recipes' must map recipe names"):
        merge_recipe_section({"recipes": ["one"]}, "one")
    with pytest.raises(ValueError, match=r"'recipes.one' has unknown keys \['dataa'\]"):
        merge_recipe_section({"recipes": {"one": {"dataa": {}}}}, "one")
