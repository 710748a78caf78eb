"""See what the agents did: one self-contained HTML page of a run's episodes (``episodes/`` of its
log dir, :mod:`drmas.data.episodes`), to open from the file in any browser, no server, no network.

    python -m drmas.view runs/search/version_0              # writes runs/search/version_0/episodes.html
    python -m drmas.view runs/search/version_0 --out a.html --iterations 1 5

Per iteration (and validation), each task's episodes: every trajectory's turns in order, each
turn's agents; under tree sampling each node's candidates with their rewards and advantages, the
executed one marked; an agents-workflow episode's calls with the program's messages and tool
calls; a trained sample's tokens shaded by the trainer-vs-engine log-prob gap. The estimator's
groups whose advantages are all zero (they teach nothing) are flagged, and counted per agent and
turn at the top of each iteration. Filters by agent, turn, source, reward and task (one task
followed across iterations) run in the page and follow its address.

The page is HTML's own ``<details>`` (collapsible without script) and a few lines of inline
script for the filters: no front-end library, so nothing to fetch or build, and a crashed run's
folder opens as a finished one's does.
"""

from __future__ import annotations

import argparse
import glob
import html
import json
import os
import re
from collections import Counter, defaultdict
from typing import Any, Sequence

from drmas.records import EPISODES_DIR

__all__ = ["load_run", "main", "render", "silent_groups"]

_FILE = re.compile(r"^(?:(?P<split>[a-z]+)_)?iter_(?P<iteration>\d+)\.jsonl\.gz$")


def load_run(run_dir: str, iterations: Sequence[int] | None = None) -> list[tuple[str, int, list[dict]]]:
    """``(split, iteration, records)`` of every episodes file of the run, in order (validation after
    the training iteration it followed; ``iterations``: only those)."""
    from drmas.data.episodes import read_records

    folder = os.path.join(run_dir, EPISODES_DIR) if os.path.basename(run_dir) != EPISODES_DIR else run_dir
    files = []
    for path in glob.glob(os.path.join(folder, "*.jsonl.gz")):
        m = _FILE.match(os.path.basename(path))
        if m and (iterations is None or int(m["iteration"]) in iterations):
            files.append((int(m["iteration"]), m["split"] or "train", path))
    if not files:
        raise FileNotFoundError(f"no episodes under {folder} (a run writes them after each iteration; "
                                "--data.episodes.per_iteration 0 turns them off)")
    files.sort(key=lambda f: (f[0], f[1] != "train"))
    return [(split, k, read_records(path)) for k, split, path in files]


def _node(r: dict) -> tuple:
    return (r["task"], r["trajectory"], r["agent"], r["turn"])


def silent_groups(records: Sequence[dict]) -> Counter:
    """Silent groups per ``(agent, turn)``: groups of the run's estimator (a record's ``group``)
    whose advantages are all zero, so they teach nothing; a group spanning several agents or turns
    counts once at each. Where the estimator named no group: a tree node's candidates (or, with one
    candidate per step, one agent's samples of one task at one turn) whose rewards are all equal."""
    nodes = Counter(_node(r) for r in records)
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        if r.get("group") is not None:
            groups[("group", r["group"])].append(r)
        else:
            groups[_node(r) if nodes[_node(r)] > 1 else (r["task"], r["agent"], r["turn"])].append(r)
    silent: Counter = Counter()
    for key, rs in groups.items():
        flat = (all(r["advantage"] == 0 for r in rs) if key[0] == "group"
                else len({r["reward"] for r in rs}) == 1)
        if len(rs) > 1 and flat:
            silent.update({(r["agent"], r["turn"]) for r in rs})
    return silent


def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _tokens(r: dict) -> str:
    """The response's tokens, each shaded by ``trainer - engine`` log-prob (red: the trainer finds
    it less likely than the engine did, blue: more; full colour at 0.5 nats or more)."""
    spans = []
    for piece, d in zip(r["tokens"], r["token_logprob_diff"]):
        colour = "220,40,40" if d < 0 else "40,90,220"
        spans.append(f'<span style="background:rgba({colour},{min(abs(d) / 0.5, 1):.2f})" '
                     f'title="{d:+.4f}">{_esc(piece)}</span>')
    return f"<pre class=tokens>{''.join(spans)}</pre>"


def _messages(r: dict) -> str:
    """An agents-workflow call as the program made it: its messages, then the tool calls answered."""
    rows = []
    for m in r["info"]["messages"]:
        extra = {k: v for k, v in m.items() if k not in ("role", "content")}
        more = f"<div class=meta>{_esc(json.dumps(extra))}</div>" if extra else ""
        rows.append(f"<div class=message><b>{_esc(m['role'])}</b><pre>{_esc(m['content'])}</pre>{more}</div>")
    return f"<div class=prompt>{''.join(rows)}</div>"


def _sample(r: dict, silent: bool) -> str:
    marks = []
    if not r["chosen"]:
        marks.append("not executed")
    elif r["candidate"] or r.get("_k", 1) > 1:
        marks.append("executed")
    if not r["valid"]:
        marks.append("invalid")
    if r.get("cut"):
        marks.append("cut at its token limit")
    if silent:
        marks.append("silent group")
    info = r.get("info") or {}
    call = f"call {info['call']}: " if "call" in info else ""
    head = (f"{call}<b>{_esc(r['agent'])}</b> turn {r['turn']}"
            + (f" candidate {r['candidate']}" if r.get("_k", 1) > 1 else "")
            + f" · reward {r['reward']:+.3f} (team {r['team_reward']:+.3f}, local {r['local_reward']:+.3f})"
            + f" · advantage {r['advantage']:+.3f}" + "".join(f" · <i>{m}</i>" for m in marks))
    attrs = (f'class="sample{" chosen" if r["chosen"] else ""}" data-agent="{_esc(r["agent"])}" '
             f'data-turn="{r["turn"]}" data-reward="{r["reward"]}"')
    failure = f", failure: {_esc(r['failure'])}" if r.get("failure") else ""
    if r.get("logprob_gap") is not None:  # engine against trainer, before the update
        failure = f", log-prob gap {r['logprob_gap']:.4f} nats per token{failure}"
    group = f", group {_esc(r['group'])}" if r.get("group") else ""
    prompt = (_messages(r) if info.get("messages")
              else f"<div class=prompt><pre>{_esc(r['prompt'])}</pre></div>")
    calls = "".join(f"<div class=tool-call>tool call <pre>{_esc(json.dumps(c, indent=1))}</pre></div>"
                    for c in info.get("tool_calls") or ())
    tokens = _tokens(r) if r.get("tokens") else ""
    return (f"<details {attrs}><summary>{head}</summary>{prompt}"
            f"<pre class=response>{_esc(r['response'])}</pre>{calls}{tokens}"
            f"<div class=meta>{r['prompt_tokens']} prompt tokens, {r['response_tokens']} response tokens, "
            f"weights v{r['version']}{group}{failure}</div></details>")


def _iteration(split: str, k: int, records: list[dict]) -> str:
    silent = silent_groups(records) if split == "train" else Counter()  # validation trains nothing
    ks = Counter(_node(r) for r in records)
    for r in records:
        r["_k"] = ks[_node(r)]
    tasks: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        tasks[r["task"]].append(r)
    counts = ", ".join(f"{a} turn {t}: {n}" for (a, t), n in sorted(silent.items())) or "none"
    title = (f"iteration {k}" if split == "train" else "validation before training" if k == 0
             else f"validation after iteration {k}")
    flagged = (f"; silent groups (all rewards equal, so no advantage): <span class=silent-count>"
               f"{_esc(counts)}</span>" if split == "train" else "")
    parts = [f'<section class=iteration data-split="{_esc(split)}" data-iteration="{k}">'
             f"<h2>{_esc(title)}</h2><p>{len(records)} samples, {len(tasks)} tasks{flagged}</p>"]
    for task, recs in tasks.items():
        source = recs[0].get("source")
        trajs: dict[str, list[dict]] = defaultdict(list)
        for r in recs:
            trajs[r["trajectory"]].append(r)
        parts.append(f'<details class=task data-task="{_esc(task)}" data-source="{_esc(source)}" open>'
                     f"<summary>task {_esc(task)} · {_esc(source)} · {len(trajs)} trajectories</summary>")
        for traj, rs in trajs.items():
            outcome = rs[0].get("episode_success")
            verdict = "" if outcome is None else " · success" if outcome else " · failure"
            parts.append(f"<details class=trajectory open><summary>trajectory {_esc(traj)}{verdict}"
                         "</summary>")
            groups: dict[tuple, list[dict]] = defaultdict(list)
            for r in rs:
                groups[(r["turn"], r["agent"])].append(r)
            for (turn, agent), cands in groups.items():
                flat = split == "train" and len(cands) > 1 and len({c["reward"] for c in cands}) == 1
                if len(cands) > 1:
                    parts.append(f'<div class=node data-agent="{_esc(agent)}" data-turn="{turn}">'
                                 f"<div class=node-head>{_esc(agent)} at turn {turn}: {len(cands)} candidates"
                                 f"{' · <i>silent</i>' if flat else ''}</div>")
                parts += [_sample(c, flat) for c in cands]
                if len(cands) > 1:
                    parts.append("</div>")
            parts.append("</details>")
        parts.append("</details>")
    parts.append("</section>")
    return "\n".join(parts)


_STYLE = """body{font:14px system-ui,sans-serif;margin:1.5em;max-width:70em}h2{border-bottom:1px solid #ccc}
details{margin:.2em 0 .2em 1em}summary{cursor:pointer}.sample{border-left:3px solid #bbb;padding-left:.5em}
.sample.chosen{border-left-color:#2a7}.node{border:1px dashed #aaa;padding:.3em;margin:.3em 0 .3em 1em}
pre{white-space:pre-wrap;background:#f6f6f6;padding:.4em;margin:.2em 0}.prompt pre{color:#555;max-height:12em;
overflow:auto}.meta{color:#777;font-size:12px}.tokens{background:#fff;border:1px solid #eee}
.message pre{margin-left:1em}.tool-call pre{background:#eef6ee}
#filters{position:sticky;top:0;background:#fff;padding:.5em 0;border-bottom:1px solid #ddd}
#filters input,#filters select{margin-right:1em}"""

_SCRIPT = """
function apply() {
  const f = id => document.getElementById(id).value.trim();
  const agent = f('agent'), turn = f('turn'), source = f('source'), task = f('task');
  const lo = parseFloat(f('rmin')), hi = parseFloat(f('rmax'));
  let shown = 0;
  document.querySelectorAll('.task').forEach(t => {
    let mine = 0;
    t.querySelectorAll('.sample').forEach(s => {
      const r = parseFloat(s.dataset.reward);
      const ok = (!agent || s.dataset.agent === agent) && (!turn || s.dataset.turn === turn)
        && (isNaN(lo) || r >= lo) && (isNaN(hi) || r <= hi);
      s.style.display = ok ? '' : 'none';
      if (ok) mine++;
    });
    const keep = mine > 0 && (!source || t.dataset.source === source) && (!task || t.dataset.task === task);
    t.style.display = keep ? '' : 'none';
    if (keep) shown += mine;
  });
  document.getElementById('shown').textContent = shown;
  const asked = ['agent', 'turn', 'source', 'task', 'rmin', 'rmax'].filter(id => f(id))
    .map(id => id + '=' + encodeURIComponent(f(id)));
  history.replaceState(null, '', asked.length ? '#' + asked.join('&') : location.pathname);
}
// a filter in the address (episodes.html#agent=searcher&turn=1) is applied as the page opens, and
// when the address changes
function fromAddress() {
  const asked = new URLSearchParams(location.hash.slice(1));
  document.querySelectorAll('#filters input, #filters select')
    .forEach(e => { e.value = asked.get(e.id) || ''; });
  apply();
}
window.addEventListener('hashchange', fromAddress);
document.querySelectorAll('#filters input, #filters select').forEach(e => {
  e.addEventListener('input', apply); e.addEventListener('change', apply);
});
fromAddress();
"""


def render(runs: list[tuple[str, int, list[dict]]], title: str) -> str:
    """The page of ``runs`` (:func:`load_run`)."""
    records = [r for _, _, rs in runs for r in rs]
    options = lambda key: "".join(f"<option>{_esc(v)}</option>"  # noqa: E731
                                  for v in sorted({str(r[key]) for r in records if r.get(key) is not None}))
    choose = lambda key: f"{key} <select id={key}><option value=''>all</option>{options(key)}</select> "  # noqa: E731
    filters = (f"<div id=filters>{choose('agent')}{choose('turn')}{choose('source')}"
               "reward from <input id=rmin size=5> to <input id=rmax size=5> "
               "task <input id=task size=16 placeholder='uid: one task across iterations'> "
               "<span id=shown></span> samples shown</div>")
    body = "\n".join(_iteration(split, k, rs) for split, k, rs in runs)
    return (f"<!doctype html><html><head><meta charset=utf-8><title>{_esc(title)}</title>"
            f"<style>{_STYLE}</style></head><body><h1>{_esc(title)}</h1>{filters}{body}"
            f"<script>{_SCRIPT}</script></body></html>")


def main(argv: Sequence[str] | None = None) -> str:
    p = argparse.ArgumentParser(prog="python -m drmas.view", description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a run's log dir (runs/<recipe>/version_N) or its episodes/ folder")
    p.add_argument("--out", help="the HTML file (default: episodes.html in the run's log dir)")
    p.add_argument("--iterations", type=int, nargs="*", help="only these iterations")
    args = p.parse_args(argv)
    runs = load_run(args.run, args.iterations)
    out = args.out or os.path.join(args.run, "episodes.html")
    with open(out, "w") as f:
        f.write(render(runs, f"episodes of {os.path.abspath(args.run)}"))
    samples = sum(len(rs) for _, _, rs in runs)
    print(f"{out}: {samples} samples of {len(runs)} iteration(s) and validation(s); open it in a browser")
    return out


if __name__ == "__main__":
    main()
