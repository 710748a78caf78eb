"""The share of samples left alone in their (task, agent, turn, prompt) group: hand-counted on a
two-task team, and 0 where tree sampling's candidates share each step's prompt."""

from types import SimpleNamespace

from drmas.algorithms import singleton_prompts


def sample(task, agent, turn, prompt):
    return SimpleNamespace(task_uid=task, agent=agent, turn=turn, prompt_ids=list(prompt))


def test_hand_counted_shares_by_agent_and_turn():
    samples = [
        # task a, 3 trajectories: the planner's turn 0 prompt is the task's alone (shared by all 3)
        sample("a", "planner", 0, [1]), sample("a", "planner", 0, [1]), sample("a", "planner", 0, [1]),
        # turn 1: the trajectories diverged; two reached the same board, one another
        sample("a", "planner", 1, [1, 5]), sample("a", "planner", 1, [1, 5]),
        sample("a", "planner", 1, [1, 6]),
        # task b: the same prompt as task a's [1, 6] does not count as shared (another task)
        sample("b", "planner", 1, [1, 6]), sample("b", "planner", 1, [1, 7]),
        sample("b", "tool", 0, [9]),
    ]
    shares = singleton_prompts(samples)
    assert shares == {("planner", 0): 0.0, ("planner", 1): 3 / 5, ("tool", 0): 1.0}


def test_tree_candidates_of_one_step_share_its_prompt():
    # K = 3 candidates at each of two turns of one task: every prompt is shared
    samples = [sample("a", "planner", t, [t]) for t in (0, 1) for _ in range(3)]
    assert singleton_prompts(samples) == {("planner", 0): 0.0, ("planner", 1): 0.0}
