"""`specdec advise`: the cost model and the decision on hand-made numbers, a real run on a tiny model, bad input."""

from __future__ import annotations

import json

import pytest

from specdec.bench import advise
from specdec.bench.workloads import Conversation, Workload
from specdec.cli.main import main
from specdec.pass_cost import PassCost


def costs(table: dict[int, float]) -> PassCost:
    c = PassCost()
    for width, seconds in table.items():
        c.observe(width, seconds)
    return c


def test_expected_speedup_worked_example():
    c = costs({1: 1.0, 4: 1.3})
    assert advise.expected_speedup(c, 1, tau=2.0, drafted=3, draft_seconds=0.0) == pytest.approx(2 / 1.3)
    assert advise.expected_speedup(c, 1, tau=1.0, drafted=0, draft_seconds=0.0) == pytest.approx(1.0)
    # Drafting time counts against the pass: 2 tokens for 1.3 + 0.7 s is no faster than plain.
    assert advise.expected_speedup(c, 1, tau=2.0, drafted=3, draft_seconds=0.7) == pytest.approx(1.0)


def test_best_draft_len_follows_acceptance_and_pass_cost():
    flat = costs({1: 1.0, 9: 1.0})  # a verify pass as cheap as a decode pass: every kept-able token pays
    assert advise.best_draft_len(flat, 1, [0.9, 0.8, 0.1], 0.0, 8) == 3
    steep = costs({1: 1.0, 2: 1.5, 9: 9.0})  # cost grows with every token: only a nearly sure first token pays
    assert advise.best_draft_len(steep, 1, [0.4, 0.4], 0.0, 8) == 0  # 1.4 tokens for a 1.5x pass
    assert advise.best_draft_len(steep, 1, [0.9, 0.9], 0.0, 8) == 1  # 1.9 for 1.5x; 2.8 for 2.6x
    # At batch 4 the same draft pads four rows: 4 x (k + 1) tokens per pass.
    batch = costs({1: 1.0, 4: 1.0, 8: 2.0, 36: 9.0})
    assert advise.best_draft_len(batch, 4, [0.9, 0.9], 0.0, 8) == 0


def test_pass_widths_cover_plain_and_full_drafts_at_the_batch_size():
    assert advise.pass_widths(1, 8) == [1, 2, 4, 8, 9]
    assert advise.pass_widths(4, 8) == [1, 2, 4, 8, 9, 16, 32, 36]


def test_first_requests_spreads_over_conversations():
    convs = tuple(Conversation(str(i), ("a", "b", "c")) for i in range(5))
    w = Workload("w", convs)
    cut = advise.first_requests(w, 3)  # two turns at most each: two conversations hold 4 >= 3
    assert [c.id for c in cut.conversations] == ["0", "2"] and cut.num_requests == 4
    assert advise.first_requests(w, 100).num_requests == 10  # the whole workload, two turns each


def measure(name: str, measured: float, expected: float, tau: float = 2.0) -> advise.MethodMeasure:
    return advise.MethodMeasure(name, acceptance_rate=0.5, tau=tau, drafted_per_pass=3.0, new_tokens=100, seconds=1.0,
                                tokens_per_s=100.0 * measured, measured_speedup=measured,
                                expected_speedup=expected, best_draft_len=3)


@pytest.fixture
def cfg() -> advise.AdviseConfig:
    return advise.AdviseConfig(Workload("code_edit", (Conversation("c", ("x",)),)), temperature=0.0)


def test_decide_wants_both_the_wall_clock_and_the_model(cfg):
    c = costs({1: 1.0, 9: 1.5})
    plain = measure("none", 1.0, 1.0, tau=1.0)
    # A wall clock skewed by other load (3x measured, nothing accepted) does not win ...
    lucky = advise.decide(cfg, c, [plain, measure("ngram", 3.0, 1.0), measure("suffix", 1.6, 1.8)], [])
    assert lucky.recommended == "suffix"
    assert lucky.command == "specdec serve --spec-type suffix"
    # ... and below the bar on either count, plain decoding is advised, saying why with numbers.
    none = advise.decide(cfg, c, [plain, measure("ngram", 1.02, 1.5), measure("suffix", 1.5, 0.9)], [])
    assert none.recommended == "none" and none.command == "specdec serve"
    assert "decision: plain decoding" in none.reasons[-2] and "1.02x" not in none.reasons[-2]
    assert len(none.reasons) >= 6  # hardware, workload, temperature, batch, draft model/head, decision


def test_decide_at_a_batch_sets_the_server_budget(cfg):
    from dataclasses import replace

    at4 = replace(cfg, batch_size=4)
    advice = advise.decide(at4, costs({1: 1.0, 36: 3.0}), [measure("none", 1.0, 1.0, 1.0),
                                                            measure("ngram", 1.3, 1.2)], [])
    assert advice.settings == {"spec_type": "ngram", "spec_batch_draft_tokens": 12}
    assert advice.command.endswith("--spec-batch-draft-tokens 12 --max-batch-size 4")


def test_candidates_are_data():
    cfg = advise.AdviseConfig(Workload("w", ()), 0.0, draft_model="d", spec_model="h")
    names = advise.candidate_names(cfg)
    assert names[: len(advise.CANDIDATES)] == list(advise.CANDIDATES)
    assert names[-2:] == [advise.DRAFT_MODEL_METHOD, advise.HEAD_METHOD]


def test_retrieval_and_the_reduced_draft_are_candidates_and_their_settings_are_served():
    cfg = advise.AdviseConfig(Workload("mt_bench", ()), 0.0, draft_model="d", draft_vocab_size=8192,
                              datastore="own.npz")
    names = advise.candidate_names(cfg)
    assert names[-2:] == [advise.RETRIEVAL_METHOD, advise.DRAFT_MODEL_METHOD]
    c = costs({1: 1.0, 9: 1.5})
    plain = measure("none", 1.0, 1.0, tau=1.0)
    rest = [measure(n, 1.1, 1.1) for n in names if n not in ("retrieval", "draft-model", "adaptive")]
    picks = {"retrieval": "--spec-type retrieval --spec-datastore own.npz",
             "draft-model": "--spec-type draft-model --draft-model d --spec-draft-vocab-size 8192 "
                            "--spec-datastore own.npz",  # the store ranks the cut head's tokens
             "adaptive": "--spec-type adaptive --draft-model d --spec-draft-vocab-size 8192 --spec-datastore own.npz"}
    for name, flags in picks.items():
        advice = advise.decide(cfg, c, [plain, *rest, measure(name, 1.6, 1.5)], [])
        assert advice.recommended == name and advice.command == f"specdec serve {flags}"
    assert "FR-Spec" in advice.reasons[4] and "retrieval measured" in advice.reasons[4]


# -- a real run on a tiny model --------------------------------------------------------------------


@pytest.fixture(scope="module")
def workload_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("advise") / "tiny.jsonl"
    path.write_text('{"prompt": "a b c a b c a b c a b"}\n'
                    '{"turns": ["def f(x): return x + 1. Rename x to y.", "Now add a docstring."]}\n')
    return path


def run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["advise", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_advise_json_on_a_tiny_model(tiny_llama, workload_file, capsys):
    rc, out, err = run(capsys, "--model", str(tiny_llama), "--workload", str(workload_file), "--prompts", "3",
                       "--max-new-tokens", "8", "--max-model-len", "256", "--json")
    assert rc == 0, err
    advice = json.loads(out)
    assert [m["name"] for m in advice["methods"]] == ["none", *advise.CANDIDATES]
    assert advice["recommended"] in ["none", *advise.CANDIDATES]
    assert advice["requests"] == 3 and advice["temperature"] == 0 and advice["workload"] == "tiny"
    assert sorted(int(w) for w in advice["pass_ms"]) == [1, 2, 4, 8, 9]
    assert all(ms > 0 for ms in advice["pass_ms"].values())
    for m in advice["methods"]:
        assert 0 <= m["acceptance_rate"] <= 1 and m["tau"] >= 1 and m["new_tokens"] > 0
        assert m["measured_speedup"] > 0 and m["expected_speedup"] > 0
    assert advice["methods"][0]["measured_speedup"] == 1.0
    assert any(m["drafted_per_pass"] > 0 for m in advice["methods"][1:])  # the prompts repeat: drafters drafted
    assert advice["command"].startswith("specdec serve --model ")
    assert advice["reasons"][-1].startswith(("decision:", "note:"))


def test_advise_measures_retrieval_from_a_datastore(tiny_llama, workload_file, capsys, tmp_path):
    """With --spec-datastore, retrieval is a candidate (greedy outputs checked against plain decoding) and
    adaptive is measured with it as a member."""
    from specdec.datastore import Datastore, tokenizer_identity
    from specdec.text import load_tokenizer

    tokenizer = load_tokenizer(tiny_llama)
    docs = [tokenizer("a b c a b c a b c a b c a b c", add_special_tokens=False)["input_ids"]]
    Datastore.build(docs, tokenizer_identity(tokenizer)).save(tmp_path / "s.npz")
    rc, out, err = run(capsys, "--model", str(tiny_llama), "--workload", str(workload_file), "--prompts", "1",
                       "--max-new-tokens", "8", "--max-model-len", "256", "--spec-datastore", str(tmp_path / "s.npz"),
                       "--json")
    assert rc == 0, err
    advice = json.loads(out)
    assert [m["name"] for m in advice["methods"]] == ["none", *advise.CANDIDATES, advise.RETRIEVAL_METHOD]
    assert "retrieval measured" in advice["reasons"][4]


def test_advise_text_sampled_at_a_batch(tiny_llama, workload_file, capsys):
    rc, out, err = run(capsys, "--model", str(tiny_llama), "--workload", str(workload_file), "--prompts", "2",
                       "--max-new-tokens", "6", "--max-model-len", "256", "--batch-size", "2",
                       "--temperature", "0.8")
    assert rc == 0, err
    assert "temperature 0.8, batch size 2" in out
    assert "| method | acceptance rate | tau |" in out and "| ngram |" in out
    assert "\nrecommended: " in out and "specdec serve" in out and "--max-batch-size 2" in out
    assert "pass cost by width" in out and "18: " in out  # 2 sequences x (8 drafted + 1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workload", "no_such_workload"], "unknown workload 'no_such_workload'; choose from: mt_bench"),
        (["--workload", "/nonexistent/w.jsonl"], "cannot read /nonexistent/w.jsonl"),
        (["--temperature", "-0.1"], "--temperature must be in [0, 2], got -0.1"),
        (["--temperature", "3"], "--temperature must be in [0, 2], got 3"),
        (["--batch-size", "0"], "--batch-size must be in [1, 64], got 0"),
        (["--batch-size", "1000"], "--batch-size must be in [1, 64], got 1000"),
        (["--prompts", "0"], "must be >= 1"),
        (["--spec-draft-vocab-size", "64"], "--spec-draft-vocab-size cuts the draft model's LM head: it needs "
                                            "--draft-model"),
    ],
)
def test_bad_input_is_one_line(capsys, args, message):
    rc, out, err = run(capsys, *args)
    assert rc == 2 and not out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specdec: error: ") and message in lines[0], err


def test_malformed_workload_file_is_one_line(capsys, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n[1, 2]\n')
    rc, _, err = run(capsys, "--workload", str(bad))
    assert rc == 2 and err.strip() == 'specdec: error: bad.jsonl:2: expected an object with "turns" or "prompt"'


def test_a_draft_model_that_does_not_fit_is_one_line(tiny_llama, workload_file, capsys, tmp_path):
    from tests.conftest import build_tiny_model

    folder = build_tiny_model(tmp_path / "m", "qwen2", tiny_llama)
    tok = (folder / "tokenizer.json").read_text().replace('"<|im_end|>"', '"<|im_stop|>"')
    (folder / "tokenizer.json").write_text(tok)
    capsys.readouterr()  # the model writer's progress bar
    rc, out, err = run(capsys, "--model", str(tiny_llama), "--workload", str(workload_file),
                       "--max-model-len", "256", "--draft-model", str(folder))
    assert rc == 2 and not out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specdec: error: ") and "vocabulary" in lines[0], err
