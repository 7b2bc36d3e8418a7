"""specdec bench: workloads, oracle math, an end-to-end quick run on a tiny model, and the greedy check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdec.bench import harness, metrics, oracle
from specdec.bench.config import parse_methods
from specdec.bench.oracle import StepLog, accepted_length, analyse, pass_cost, replay, walk
from specdec.bench.workloads import (
    MT_BENCH_CATEGORIES,
    WORKLOAD_NAMES,
    Conversation,
    load_workload,
    load_workload_file,
)
from specdec.cli.main import main
from specdec.config import SpecConfig
from specdec.drafters.base import DraftProposal
from specdec.drafters.ngram import NgramDrafter

ROOT = Path(__file__).resolve().parents[1]


# -- workloads ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_workloads_load_and_are_reproducible(name):
    first, second = load_workload(name), load_workload(name)
    assert first == second  # frozen dataclasses: equal field by field, prompts included
    assert first.conversations and all(c.turns and all(t.strip() for t in c.turns) for c in first.conversations)
    assert first.limited(3) == second.limited(3)
    assert len(first.limited(3).conversations) == min(3, len(first.conversations))
    assert all(len(c.turns) <= 1 for c in first.limited(None, max_turns=1).conversations)


def test_spec_bench_groups():
    mt = load_workload("mt_bench")
    assert {c.category for c in mt.conversations} == set(MT_BENCH_CATEGORIES)
    assert all(len(c.turns) == 2 for c in mt.conversations)
    for group in ("translation", "summarization", "qa", "math_reasoning", "rag"):
        w = load_workload(group)
        assert len(w.conversations) == 40 and {c.category for c in w.conversations} == {group}
    # limited() spreads over the list: the MT-bench pick covers several categories
    assert len({c.category for c in mt.limited(4).conversations}) == 4


def test_code_edit_prompts_hold_stdlib_source():
    import inspect
    import textwrap as tw

    w = load_workload("code_edit")
    indent = next(c for c in w.conversations if c.id.startswith("textwrap.indent"))
    prompt = indent.turns[0]
    assert "renaming the parameter `text` to `text_value`" in prompt
    assert "Output the full function." in prompt
    assert tw.dedent(inspect.getsource(tw.indent)).rstrip() in prompt


def test_special_workloads():
    agentic = load_workload("agentic")
    assert all(len(c.turns) >= 3 for c in agentic.conversations) and agentic.temperature is None
    assert load_workload("creative").temperature == 1.0
    with pytest.raises(ValueError, match="unknown workload"):
        load_workload("nope")


def test_conversation_messages_feed_back_answers():
    conv = Conversation("c", ("first?", "second?"), system="be brief")
    assert conv.messages(1, ["answer one"]) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first?"},
        {"role": "assistant", "content": "answer one"},
        {"role": "user", "content": "second?"},
    ]
    with pytest.raises(ValueError):
        conv.messages(1, [])


def test_workload_file(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"prompt": "hi", "temperature": 0.5}\n\n{"turns": ["a", "b"], "system": "s"}\n')
    w = load_workload_file(path)
    assert w.name == "mine" and w.temperature == 0.5 and w.num_requests == 3
    path.write_text('{"nothing": 1}\n')
    with pytest.raises(ValueError, match="turns"):
        load_workload_file(path)


def test_workload_data_ships_with_the_package():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"specdec.bench" = ["workloads/*.jsonl", "workloads/*.md"]' in pyproject
    folder = ROOT / "src/specdec/bench/workloads"
    shipped = {"spec_bench_dev.jsonl", "agentic.jsonl", "creative.jsonl", "NOTICE.md"}
    assert shipped <= {f.name for f in folder.iterdir()}
    assert "Apache" in (folder / "NOTICE.md").read_text()


def test_parse_methods():
    methods = parse_methods("ngram,suffix+draft-self", SpecConfig(draft_n_max=5))
    assert [m.name for m in methods] == ["none", "ngram", "suffix+draft-self"]  # plain always first
    assert methods[0].is_plain and methods[2].spec.draft_n_max == 5
    assert [t.value for t in methods[2].spec.types] == ["suffix", "draft-self"]
    with pytest.raises(ValueError, match="draft-model"):
        parse_methods("draft-model", SpecConfig())


# -- oracle math --------------------------------------------------------------------------------


def _logs(rows):
    return [StepLog(d, a) for d, a in rows]


def test_oracle_worked_example():
    """The module docstring's example, pass by pass."""
    a = _logs([(2, 2), (0, 0), (0, 0), (2, 0), (2, 1), (0, 0)])
    b = _logs([(1, 1), (4, 3), (0, 0), (4, 2), (0, 0), (0, 0)])
    costs = [1.0, 1.1, 1.2, 1.35, 1.5]  # T = 1..5 tokens
    assert walk({"A": a}, 6, costs).passes == 3
    assert walk({"B": b}, 6, costs).passes == 3
    best = walk({"A": a, "B": b}, 6, costs)
    assert best.passes == 2 and best.tau == 3.0 and best.picks == {"A": 1, "B": 1}
    assert best.seconds == pytest.approx(1.2 + 1.5)

    result = analyse({"A": [a], "B": [b]}, [6], costs)
    assert result.plain.passes == 6 and result.plain.seconds == pytest.approx(6.0)
    assert result.pass_speedup(result.oracle) == pytest.approx(3.0)
    assert result.time_speedup(result.oracle) == pytest.approx(6.0 / 2.7)
    # A alone: (2,2) at 0 costs T=3; at 3 its (2,0) draft is skipped (no draft is cheaper); (2,1) at 4 costs T=3
    assert result.drafters["A"].seconds == pytest.approx(1.2 + 1.0 + 1.2)
    assert result.drafters["A"].picks == {"A": 2, "(none)": 1}


def test_oracle_counts_drafting_time_and_caps_at_the_end():
    # the last step may accept more than remains: the walk stops at the output's end
    logs = _logs([(4, 4), (0, 0), (0, 0)])
    logs = [StepLog(4, 4, seconds=0.5), *logs[1:]]
    w = walk({"x": logs}, 3, [1.0, 2.0])
    assert w.passes == 1 and w.tokens == 3
    assert w.seconds == pytest.approx(pass_cost([1.0, 2.0], 5) + 0.5)
    with pytest.raises(ValueError, match="steps logged"):
        analyse({"x": [logs]}, [4], [1.0])


def test_pass_cost_extrapolates_linearly():
    assert pass_cost([1.0, 1.5], 2) == 1.5
    assert pass_cost([1.0, 1.5], 4) == pytest.approx(2.5)
    assert pass_cost([2.0], 3) == pytest.approx(6.0)


def test_accepted_length_chain_and_tree():
    assert accepted_length(DraftProposal([5, 6, 9]), [5, 6, 7]) == 2
    assert accepted_length(DraftProposal([5, 6]), [5]) == 1  # truth ends first
    assert accepted_length(DraftProposal([]), [1, 2]) == 0
    tree = DraftProposal([5, 8, 6], parents=[0, 0, 1])  # 5 and 8 under the root, 6 under 5
    assert accepted_length(tree, [5, 6, 7]) == 2
    assert accepted_length(tree, [8, 6]) == 1
    assert accepted_length(tree, [9]) == 0


def test_replay_logs_what_ngram_would_accept():
    prompt = [1, 2, 3, 4, 9]
    output = [1, 2, 3, 4, 7]
    logs = replay(NgramDrafter(max_n=3, min_n=1), prompt, output, max_new_tokens=5, draft_n_max=4)
    assert len(logs) == len(output)
    # position 0: context ends "... 4 9"; last 1-gram [9] has no earlier match -> nothing
    assert logs[0] == StepLog(0, 0, logs[0].seconds)
    # position 1: context ends "9 1"; [1] matched at 0 -> proposes [2, 3, 4, 9], truth [2, 3, 4, 7] -> 3
    assert (logs[1].drafted, logs[1].accepted) == (3, 3)  # room = min(4, 5 - 1 - 1) = 3
    # the last position has no room before max_new_tokens: not asked
    assert logs[4] == oracle.SKIP


def test_overall_sums_before_dividing():
    def rec(method, workload, tokens, seconds):
        return {"kind": "specdec", "method": method, "workload": workload, "batch_size": 1, "temperature": 0.0,
                "new_tokens": tokens, "seconds": seconds, "decode_passes": tokens, "draft_seconds": 0.0,
                "target_seconds": seconds}

    records = [rec("none", "a", 10, 1.0), rec("none", "b", 10, 4.0), rec("x", "a", 10, 0.5), rec("x", "b", 10, 4.0)]
    tot = metrics.overall(records)
    assert tot[("none", 1, 0.0)]["tokens_per_s"] == pytest.approx(4.0)
    assert tot[("x", 1, 0.0)]["speedup"] == pytest.approx((20 / 4.5) / 4.0)
    assert metrics.acceptance_by_pos([3], [4, 2]) == [0.75, 0.0]


def test_decode_speedup_table_divides_by_plain_decodings_rate_in_the_same_workload():
    from specdec.bench.report import decode_table

    def rec(method, workload, decode_tps, kind="specdec"):
        return {"kind": kind, "method": method, "workload": workload, "batch_size": 1, "temperature": 0.0,
                "decode_tokens_per_s": decode_tps}

    records = [rec("none", "qa", 20.0), rec("none", "rag", 10.0), rec("suffix", "qa", 25.0),
               rec("suffix", "rag", 13.0), rec("llama-server", "qa", 22.0, kind="peer")]
    table = decode_table(records, 0.0, 1)
    assert table[2:] == ["| `none` | 1.00× | 1.00× |", "| `suffix` | 1.25× | 1.30× |", "| `llama-server` | 1.10× | — |"]


def test_detail_table_puts_each_methods_step_beside_its_pass():
    from specdec.bench.report import detail_table

    def rec(method, workload, seconds, prefill, target, passes):
        return {"kind": "specdec", "method": method, "workload": workload, "batch_size": 1, "temperature": 0.0,
                "seconds": seconds, "prefill_seconds": prefill, "target_seconds": target, "decode_passes": passes,
                "new_tokens": passes, "drafted": 0, "accepted": 0, "accepted_per_pos": [], "drafted_per_pos": [],
                "draft_seconds": 0.0, "kv_bytes": None, "drafter_bytes": None, "peak_rss_bytes": 0}

    # none: (1.0 - 0.2 + 2.5 - 0.5) s over 40 + 60 passes = 28 ms a step, (0.98 - 0.2 + 2.44 - 0.5) / 100 = 27.2 a pass
    records = [rec("none", "qa", 1.0, 0.2, 0.98, 40), rec("none", "rag", 2.5, 0.5, 2.44, 60),
               rec("suffix", "qa", 1.0, 0.2, 0.7, 20), rec("suffix", "rag", 1.0, 1.0, 1.0, 0)]
    table = detail_table(records, 0.0, 1, usd_per_hour=1.0)
    column = table[0].strip("|").split("|").index(" step / pass ms ")
    cells = {row.split("|")[1].strip(): row.strip("|").split("|")[column].strip() for row in table[2:]}
    assert cells == {"`none`": "28.0 / 27.2", "`suffix`": "40.0 / 25.0"}


# -- end to end ---------------------------------------------------------------------------------


def test_quick_run_on_tiny_model(tiny_llama, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["bench", "--quick", "--model", str(tiny_llama), "--limit", "1", "--max-new-tokens", "6",
               "--workloads", "qa,code_edit,agentic,creative", "--batch-sizes", "1,2", "--peers",
               "transformers,llama-cpp", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    report = (out / "report.md").read_text()
    assert "| `transformers` |" in report and "| `transformers+prompt-lookup` |" in report
    assert "specdec bench" in report and "## Oracle analysis" in report
    assert "rerun with `--ignore-eos`" in report  # creative is sampled: its lengths may differ by method
    # tiny_llama is a safetensors folder: the llama.cpp peers cannot load it, and the report says so
    assert "llama-cpp peer (llama.cpp llama-server) skipped: it needs a GGUF model" in report
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    runs = [r for r in records if r["kind"] in ("specdec", "peer")]
    methods = {r["method"] for r in runs}
    assert {"none", "ngram", "suffix", "draft-self", "transformers"} <= methods
    assert not any("llama" in m for m in methods), methods  # skipped, not run
    assert {r["batch_size"] for r in runs if r["kind"] == "specdec"} == {1, 2}
    assert {r["temperature"] for r in runs if r["workload"] == "creative"} == {1.0}
    greedy = [r for r in runs if r["kind"] == "specdec" and r["temperature"] == 0.0]
    assert greedy and all(r["greedy_mismatches"] == 0 for r in greedy)
    none_qa = next(r for r in runs if r["method"] == "none" and r["workload"] == "qa" and r["batch_size"] == 1)
    assert none_qa["speedup"] == 1.0 and none_qa["new_tokens"] > 0
    assert any(r["kind"] == "oracle" and r["workload"] == "overall" for r in records)
    assert len(list(out.glob("*.png"))) >= 1


def test_ignore_eos_runs_every_answer_to_the_limit(tiny_llama, tmp_path, monkeypatch, capsys):
    """Sampled answers differ in length between methods; --ignore-eos makes cells compare equal lengths.
    (The engine's own ignore_eos is tested with the lossless tests; here: the bench asks for it everywhere.)"""
    asked = []
    params = harness.MethodRunner.params

    def spy(self, request, temperature):
        asked.append(params(self, request, temperature))
        return asked[-1]

    monkeypatch.setattr(harness.MethodRunner, "params", spy)
    out = tmp_path / "out"
    rc = main(["bench", "--quick", "--model", str(tiny_llama), "--limit", "1", "--max-turns", "1",
               "--max-new-tokens", "7", "--workloads", "qa,creative", "--methods", "none,ngram",
               "--temperatures", "0,1", "--peers", "none", "--no-oracle", "--ignore-eos", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    assert asked and all(p.ignore_eos and p.max_new_tokens == 7 for p in asked)
    assert {p.temperature for p in asked} == {0.0, 1.0}
    runs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert all(r["new_tokens"] == 7 * r["requests"] for r in runs if r["kind"] == "specdec")
    assert "max new tokens 7 (EOS ignored)" in (out / "report.md").read_text()
    assert "rerun with `--ignore-eos`" not in (out / "report.md").read_text()  # equal lengths: no caveat


def test_methods_run_in_lockstep_in_a_rotating_order(tiny_llama, tmp_path, monkeypatch, capsys):
    """Machine drift must meet every method alike: each batch of a cell's requests runs under every
    method at once (plain decoding among them), a step of each in turn, the first method rotating by batch."""
    calls = []
    timed = harness.MethodTurn.timed

    def spy(self, work):
        calls.append((self.name, work.__name__))
        return timed(self, work)

    monkeypatch.setattr(harness.MethodTurn, "timed", spy)
    out = tmp_path / "out"
    rc = main(["bench", "--quick", "--model", str(tiny_llama), "--limit", "3", "--max-turns", "1",
               "--max-new-tokens", "6", "--workloads", "qa", "--methods", "none,ngram,suffix", "--peers", "none",
               "--no-oracle", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    starts = [i for i, (_, what) in enumerate(calls) if what == "start"]
    assert [calls[i][0] for i in starts] == ["none", "ngram", "suffix", "ngram", "suffix", "none",
                                             "suffix", "none", "ngram"]
    for r in range(3):  # a round: its three prefills, then one step of each running method in turn
        order = [calls[i][0] for i in starts[3 * r:3 * r + 3]]
        end = starts[3 * r + 3] if r < 2 else len(calls)
        steps = [name for name, what in calls[starts[3 * r + 2] + 1:end]]
        left = {m: steps.count(m) for m in order}
        assert left["none"] == 6  # plain decoding: a step a token
        expected = []
        while any(left.values()):
            for m in order:
                if left[m]:
                    expected.append(m)
                    left[m] -= 1
        assert steps == expected
    runs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(r["requests"] for r in runs if r["kind"] == "specdec") == [3, 3, 3]
    assert all(r["new_tokens"] > 0 and r["seconds"] > 0 for r in runs if r["kind"] == "specdec")


def test_greedy_mismatch_fails_loudly(tiny_llama, tmp_path, monkeypatch, capsys):
    def corrupt(method, workload, outputs):
        if method != "ngram":
            return outputs
        return [[*o[:-1], o[-1] + 1] for o in outputs]  # change each output's last token

    monkeypatch.setattr(harness, "greedy_check_input", corrupt)
    out = tmp_path / "out"
    rc = main(["bench", "--quick", "--model", str(tiny_llama), "--limit", "1", "--max-new-tokens", "4",
               "--workloads", "qa", "--methods", "none,ngram", "--peers", "none", "--no-oracle",
               "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 1
    assert "LOSSLESSNESS BROKEN" in err and "'ngram'" in err
    assert "LOSSLESSNESS BROKEN" in (out / "mismatch.txt").read_text()
    assert not (out / "report.md").exists()


def test_greedy_check_compares_whole_lists():
    cell = harness.Cell("m", "specdec", "w", 1, 0.0, [[1, 2, 3]], metrics_stats())
    with pytest.raises(harness.GreedyMismatchError, match="lengths 3 vs 4"):
        harness.check_greedy(cell, [[1, 2, 3, 4]])  # a prefix is not a match
    harness.check_greedy(cell, [[1, 2, 3]])
    assert cell.mismatches == 0


def metrics_stats():
    from specdec.stats import SpecStats

    return SpecStats()


def test_bench_passes_on_tiny_model(tiny_llama, capsys):
    """`specdec bench passes --json`: every width timed, the floor measured, ratios consistent."""
    assert main(["bench", "passes", "--model", str(tiny_llama), "--context", "40", "--widths", "1,4,9",
                 "--rounds", "3", "--prefill", "64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prefill"]["tokens"] == 64 and out["prefill"]["ms"] > 0
    assert out["prefill"]["tokens_per_s"] == pytest.approx(64 / (out["prefill"]["ms"] / 1e3))
    assert set(out["pass_ms"]) == {"1", "4", "9"} and all(v > 0 for v in out["pass_ms"].values())
    assert out["backend"] == "cpu-kernels" and out["read_floor_ms"] > 0 and out["weight_bytes"] > 0
    assert out["vs_one_token"]["1"] == 1.0
    assert out["one_token_vs_floor"] == out["vs_floor"]["1"] > 0
    assert out["machine"]["cores"] >= 1 and out["peak_rss_bytes"] > 0


def test_bench_passes_prints_its_tables(tiny_llama, capsys):
    """Without --json: the CPU, the read floor, a row per width, the prefill and the parts, as docs/performance.md
    quotes them."""
    assert main(["bench", "passes", "--model", str(tiny_llama), "--context", "40", "--widths", "1,2",
                 "--rounds", "2", "--prefill", "16", "--parts"]) == 0
    out = capsys.readouterr().out
    assert "CPU " in out and "read floor" in out and "| tokens in the pass | ms per pass |" in out
    assert "\n| 1 | " in out and "\n| 2 | " in out and "prefill of 16 tokens into an empty cache" in out
    assert "1-token pass by part" in out and "| rest |" in out


def test_a_run_whose_memory_changed_speed_gets_a_table_for_each_speed():
    """Rounds split where the read floor jumps (not where it wanders), each side's ratios taken round by round."""
    from specdec.bench.passes import memory_phases, pass_table

    floor = [0.0175, 0.0295, 0.0180, 0.0300, 0.0176, 0.0290, 0.0178]
    one = [f * 1.2 for f in floor]  # each 1-token pass 1.2x the floor read beside it
    eight = [f * 2.0 if f < 0.02 else f * 1.5 for f in floor]
    phases = memory_phases(floor)
    assert phases == [[0, 2, 4, 6], [1, 3, 5]]
    fast, slow = (pass_table({1: one, 8: eight}, floor, rounds) for rounds in phases)
    assert fast["rounds"] == 4 and fast["read_floor_ms"] == pytest.approx(17.7)
    assert fast["vs_floor"][1] == pytest.approx(1.2) and slow["vs_floor"][1] == pytest.approx(1.2)
    assert fast["vs_one_token"][8] == pytest.approx(2.0 / 1.2) and slow["vs_one_token"][8] == pytest.approx(1.25)
    # the ratio of the whole run's medians would mix the speeds; round by round it stays within them
    whole = pass_table({1: one, 8: eight}, floor, list(range(len(floor))))
    assert 1.25 <= whole["vs_one_token"][8] <= 2.0 / 1.2
    assert memory_phases([0.018, 0.019, 0.020, 0.021, 0.022, 0.023]) == [[0, 1, 2, 3, 4, 5]]  # drift: no jump
    assert memory_phases([0.0175, 0.0295, 0.0296, 0.0297]) == [[0, 1, 2, 3]]  # one fast round is not a phase


def test_alternated_calls_meet_every_predecessor():
    """An A/B in one process times its calls in an order rotated every round, so no call always follows the same one
    (whatever a call leaves behind meets every other alike); the first round is untimed."""
    from specdec.bench.passes import alternated

    order: list[str] = []
    seconds = alternated({name: (lambda name=name: order.append(name)) for name in "abc"}, rounds=3)
    assert order == list("abc" "bca" "cab" "abc")
    assert set(seconds) == set("abc")


def test_bench_passes_rejects_bad_widths(tiny_llama, capsys):
    assert main(["bench", "passes", "--model", str(tiny_llama), "--widths", "0,2"]) == 2
    assert "--widths" in capsys.readouterr().err


def test_warm_up_runs_every_method_and_faults_in_every_cache_slot(tiny_llama, monkeypatch):
    """In lockstep each method of a round holds its own cache slot: a slot's first pass (its pages faulted
    in) and a method's first calls must not land in a timed cell."""
    from specdec.bench.config import BenchConfig, parse_methods
    from specdec.config import SpecConfig

    cfg = BenchConfig(methods=parse_methods("none,ngram,suffix", SpecConfig()), workloads=[], model=str(tiny_llama))
    runner = harness.MethodRunner(cfg)
    slots, drafters = set(), []
    allocate, set_spec = runner.llm.runner.allocate, runner.llm.set_spec

    def spy_allocate(*args):
        slots.add(slot := allocate(*args))
        return slot

    def spy_set_spec(spec, res=None):
        drafters.append(tuple(t.value for t in spec.types))
        return set_spec(spec, res)

    monkeypatch.setattr(runner.llm.runner, "allocate", spy_allocate)
    monkeypatch.setattr(runner.llm, "set_spec", spy_set_spec)
    runner.warm_up()
    assert runner.llm.runner.num_slots == 3 and slots == {0, 1, 2}
    assert drafters == [("none",), ("ngram",), ("suffix",)]
    assert runner.llm.runner.pass_cost.estimate(1) is None  # the warm-up's timings forgotten
