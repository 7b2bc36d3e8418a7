"""Token provenance: origins per committed token, text pieces per token, in the library and the CLI.

The server's side is in test_server.py (test_provenance_*), the live series in test_live.py.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys

import pytest

from specdec.config import SamplingParams
from specdec.engine import StepResult, _rejected
from specdec.llm import LLM
from specdec.provenance import TARGET, PieceStream, step_origins
from specdec.text import TextStream, load_tokenizer
from specdec.tree import DraftTree

# The bigram tiny model loops on this prompt, so the n-gram drafter's drafts get accepted.
LOOPING_PROMPT = "héllo wörld 你好 🙂 x"


def step(token_ids, drafted=0, accepted=0, drafter=None) -> StepResult:
    return StepResult(token_ids=token_ids, num_drafted=drafted, num_accepted=accepted, drafter=drafter,
                      draft_seconds=0.0, pass_seconds=0.0, pass_rows=1, finish_reason=None)


def test_step_origins_mark_the_accepted_prefix():
    assert step_origins(step([7, 8, 9], 4, 2, "ngram")) == ["ngram", "ngram", TARGET]
    assert step_origins(step([7], 3, 0, "suffix")) == [TARGET]  # all rejected: the recovered token only
    assert step_origins(step([5])) == [TARGET]  # no draft
    assert step_origins(step([7, 2], 4, 3, "ngram")) == ["ngram", "ngram"]  # EOS cut the step after 2 tokens


def test_rejected_branch_of_chain_and_tree():
    chain = DraftTree.chain(1, [10, 11, 12])
    assert _rejected(chain, 1) == [11, 12]  # 10 kept, then the target disagreed
    assert _rejected(chain, 3) == []  # everything kept
    tree = DraftTree([1, 10, 11, 20], [-1, 0, 1, 0])  # root -> 10 -> 11, root -> 20
    assert _rejected(tree, 0) == [10, 11]  # the first branch below the root


@pytest.fixture(scope="module")
def tokenizer(default_model_folder):
    return load_tokenizer(default_model_folder)


@pytest.mark.parametrize("text, stops", [
    ("Plain words, then code: def f(x):\n    return x", ()),
    ("héllo wörld 你好 🙂🙂 naïve — ok", ()),  # characters split over byte tokens
    ("one two three STOP four five", ("STOP",)),  # a stop string: nothing after it
    ("alpha beta gamma", ("gam", "zzz")),
])
def test_pieces_concatenate_to_the_text(tokenizer, text, stops):
    ids = tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]  # a special token too
    want = TextStream(tokenizer, stops).final(ids)
    rng = random.Random(0)
    for _ in range(5):
        stream, pieces, i = PieceStream(tokenizer, stops), [], 0
        while i < len(ids):
            n = rng.randint(1, 4)
            new = ids[i : i + n]
            i += n
            pieces.append(stream.push(new, [TARGET] * len(new), final=i >= len(ids)))
        flat = [p for chunk in pieces for p in chunk]
        assert [p.token_id for p in flat] == ids  # every token once, in order
        assert "".join(p.text for p in flat) == want
        # Streamed deltas never show a stop string, nor half a character.
        shown = ""
        for chunk in pieces[:-1]:
            shown += "".join(p.text for p in chunk)
            assert "\ufffd" not in shown and not any(s in shown for s in stops)


def test_pieces_follow_token_boundaries(tokenizer):
    ids = tokenizer(" Hello world again", add_special_tokens=False).input_ids
    stream = PieceStream(tokenizer)
    pieces = stream.push(ids, ["ngram"] * (len(ids) - 1) + [TARGET], final=True)
    assert [p.text for p in pieces] == [tokenizer.decode([t]) for t in ids]
    assert [p.origin for p in pieces] == ["ngram"] * (len(ids) - 1) + [TARGET]
    with pytest.raises(ValueError, match="origins"):
        PieceStream(tokenizer).push([1, 2], [TARGET])


@pytest.fixture(scope="module")
def looping_llm(tiny_model_factory):
    return LLM(str(tiny_model_factory("llama", bigram=True)), spec="ngram", max_model_len=256, plan_drafts=False)


def test_library_origins_match_accepted_counts(looping_llm):
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    out = looping_llm.generate(LOOPING_PROMPT, params)[0]
    origins = out.choices[0].origins
    assert len(origins) == len(out.token_ids)
    assert out.stats.accepted > 0
    assert sum(o != TARGET for o in origins) == out.stats.accepted
    assert set(origins) <= {"ngram", TARGET}

    # Streaming: (drafting adapts to measured pass costs, so which tokens were drafted may differ
    # from the run above; the text may not.)
    events = list(looping_llm.stream(LOOPING_PROMPT, params))
    streamed = [o for e in events for o in e.origins]
    assert all(len(e.origins) == len(e.token_ids) for e in events)
    assert sum(o != TARGET for o in streamed) == events[-1].stats.accepted
    pieces = [p for e in events for p in e.pieces]
    assert [p.token_id for p in pieces] == out.token_ids
    assert [p.origin for p in pieces] == streamed
    assert "".join(e.text for e in events) == "".join(p.text for p in pieces) == out.text
    assert all(e.text == "".join(p.text for p in e.pieces) for e in events)
    # Per step: the accepted prefix is the drafter's, and rejected drafted tokens are reported.
    for e in events:
        s = e.step
        assert e.origins == step_origins(s)
        assert len(s.rejected_ids) <= s.num_drafted - s.num_accepted


def test_library_plain_decoding_is_all_target(tiny_llama):
    llm = LLM(str(tiny_llama), max_model_len=128, spec="none")
    out = llm.generate("one two", SamplingParams(max_new_tokens=6, ignore_eos=True))[0]
    assert out.choices[0].origins == [TARGET] * 6


# -- the CLI ----------------------------------------------------------------------------------------
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def specdec(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specdec.cli", *args], capture_output=True, text=True, timeout=300)


def test_cli_json_origins_and_show_drafts(tiny_model_factory):
    model = str(tiny_model_factory("llama", bigram=True))
    base = ["generate", LOOPING_PROMPT, "--model", model, "--max-new-tokens", "30", "--spec-type", "ngram"]
    out = specdec(*base, "--json")
    assert out.returncode == 0, out.stderr
    record = json.loads(out.stdout)
    assert len(record["origins"]) == len(record["token_ids"])
    assert record["stats"]["accepted"] > 0
    assert sum(o != TARGET for o in record["origins"]) == record["stats"]["accepted"]

    shown = specdec(*base, "--show-drafts")
    assert shown.returncode == 0, shown.stderr
    assert "\x1b[1;32m" in shown.stdout  # ngram's colour (green), written even into a pipe
    assert ANSI.sub("", shown.stdout).rstrip("\n") == record["text"]
    legend = ANSI.sub("", shown.stderr)
    # this run's own counts (two CLI runs may draft differently: the cost planner times the passes)
    by_origin = re.search(r"tokens by origin: ngram (\d+) \(", legend)
    accepted = re.search(r"ngram: drafted \d+, accepted (\d+)", legend)
    assert by_origin and accepted and by_origin[1] == accepted[1] and int(by_origin[1]) > 0, legend
    assert "target" in legend and "tok/s" in legend

    both = specdec(*base, "--json", "--show-drafts")
    assert both.returncode == 2 and both.stderr.count("\n") == 1 and "--show-drafts" in both.stderr
