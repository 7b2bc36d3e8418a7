"""own_answers.py and `specdec datastore answers`: the project's prompt set (never an evaluation set), the
target's greedy answers written and resumed, and a store built from them drafting for that model losslessly."""

from __future__ import annotations

import json

from specdec.cli.main import main
from specdec.config import SamplingParams, SpecConfig, SpecType
from specdec.llm import LLM
from specdec.own_answers import FAMILIES, own_prompts


def test_prompts_take_each_family_in_turn_and_are_fixed():
    prompts = own_prompts(12)
    assert prompts == own_prompts(12) and len(set(prompts)) == 12
    assert prompts[0].startswith("What is Python's `abc` module for?")
    assert prompts[2].startswith("Summarize the following text") and prompts[3].startswith("A shop has")
    assert [p[:7] for p in prompts[:5]] == [p[:7] for p in prompts[5:10]]  # explain, teach, summarize, math, builtin
    assert len(own_prompts(10_000)) == sum(sum(1 for _ in f()) for f in FAMILIES) < 10_000  # every family runs out


def test_answers_refuse_another_suffix(capsys, tmp_path):
    assert main(["datastore", "answers", "--out", str(tmp_path / "a.txt")]) == 2
    assert "answers are written as .jsonl" in capsys.readouterr().err


def test_own_answers_store_drafts_for_the_model(tmp_path, capsys):
    """The default model answers 3 prompts (24 tokens each; a second run resumes with nothing to do); a store
    built from those answers makes retrieval draft from an answer's first token: greedy output unchanged,
    most of it drafted and accepted."""
    answers, store = tmp_path / "own.jsonl", tmp_path / "own.npz"
    args = ["datastore", "answers", "--out", str(answers), "--prompts", "3", "--max-new-tokens", "24",
            "--max-model-len", "1024"]
    assert main(args) == 0
    assert "3 new answers" in capsys.readouterr().out
    assert main(args) == 0
    assert "0 new answers" in capsys.readouterr().out
    rows = [json.loads(line) for line in answers.read_text().splitlines()]
    assert [r["prompt"] for r in rows] == own_prompts(3)
    assert all(r["answer"] and r["text"].endswith(r["answer"]) for r in rows)
    assert main(["datastore", "build", "--out", str(store), "--source", f"jsonl:{answers}"]) == 0

    llm = LLM(None, spec="none", max_model_len=1024, plan_drafts=False)
    prompt = llm.chat_prompt([{"role": "user", "content": own_prompts(3)[1]}])
    params = SamplingParams(max_new_tokens=24)
    plain = llm.generate([prompt], params)[0]
    llm.set_spec(SpecConfig(types=(SpecType.RETRIEVAL,), datastore=str(store)))
    out = llm.generate([prompt], params)[0]
    assert out.token_ids == plain.token_ids
    assert out.stats.accepted >= len(out.token_ids) // 2, out.stats
