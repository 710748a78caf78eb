"""RolloutDataModule pieces that need no trainer: the validation task list."""

from dataclasses import dataclass

from drmas.data.datamodule import RolloutDataModule


@dataclass(frozen=True)
class Task:
    uid: str
    source: str | None = None


class Tasks:
    agents = ("a",)

    def __init__(self, val):
        self.val = val

    def tasks(self, split):
        return self.val


def test_val_tasks_are_the_first_of_each_source_in_order():
    val = [Task("x0", "x"), Task("y0", "y"), Task("x1", "x"), Task("x2", "x"), Task("z0", "z"), Task("y1", "y")]
    dm = RolloutDataModule(Tasks(val), val_tasks=2)
    assert [t.uid for t in dm.val_task_list()] == ["x0", "x1", "y0", "y1", "z0"]


def test_tasks_without_a_source_are_one_group():
    dm = RolloutDataModule(Tasks([Task(f"q{i}") for i in range(5)]), val_tasks=3)
    assert [t.uid for t in dm.val_task_list()] == ["q0", "q1", "q2"]
