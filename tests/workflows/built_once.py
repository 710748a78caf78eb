"""A program that builds its clients once per process, when its module is imported, as many do:
a LangChain model at module level (it reads OPENAI_API_BASE / OPENAI_API_KEY then) and a DSPy LM
configured once (LiteLLM reads the same). Each episode's calls must land in that episode."""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402

WRITER = ChatOpenAI(model="writer", max_retries=0)
dspy.configure(lm=dspy.LM("openai/critic", cache=False, num_retries=0))
CRITIC = dspy.Predict("text -> verdict")


def episode(task, client):
    text = WRITER.invoke(task["q"]).content
    verdict = CRITIC(text=text).verdict
    return {"team": float(task["q"] in text and verdict == "good")}
