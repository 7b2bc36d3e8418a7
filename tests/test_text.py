"""Incremental detokenizing and stop-string matching (``specdec.text``), on the real SmolLM2 tokenizer."""

from __future__ import annotations

import random

import pytest

from specdec.text import OutputText, StopChecker, StopMatcher, TextStream, cut_at_stop, decode, load_tokenizer

TEXTS = ["héllo wörld 你好 🙂🙂 naïve — ok", "Plain words, then code: def f(x):\n    return x  . , n't",
         "a" * 40 + " 🙂" * 5 + " end"]


@pytest.fixture(scope="module")
def tokenizer(default_model_folder):
    return load_tokenizer(default_model_folder)


class CountingTokenizer:
    """The real tokenizer, counting the token ids it is asked to decode."""

    def __init__(self, inner) -> None:
        self.inner, self.decoded = inner, 0

    def decode(self, ids, **kwargs):
        self.decoded += len(ids)
        return self.inner.decode(ids, **kwargs)


@pytest.mark.parametrize("seed", range(5))
def test_output_text_equals_a_whole_decode_at_every_step(tokenizer, seed):
    """Steps of 1-6 tokens (characters split over byte tokens, a special token between): after each,
    the text is the whole decode less a trailing half character."""
    rng = random.Random(seed)
    for text in TEXTS:
        ids = [*tokenizer(text, add_special_tokens=False).input_ids, tokenizer.eos_token_id,
               *tokenizer(" more 🙂", add_special_tokens=False).input_ids]
        out, i, deltas = OutputText(tokenizer), 0, []
        while i < len(ids):
            k = rng.randint(1, 6)
            deltas.append(out.extend(ids[i : i + k]))
            i += k
            assert out.text == decode(tokenizer, ids[:i]).rstrip("\ufffd")
        assert "".join(deltas) == out.text == decode(tokenizer, ids)


def test_output_text_decodes_each_token_a_bounded_number_of_times(tokenizer):
    """2000 tokens one at a time: a few decodes' worth per token, not the whole output each step
    (which was 2000 * 2001 / 2 = 2 million token decodes, three times a step)."""
    ids = tokenizer(" the quick brown fox" * 500, add_special_tokens=False).input_ids[:2000]
    counting = CountingTokenizer(tokenizer)
    out = OutputText(counting)
    for t in ids:
        out.extend([t])
    assert out.text == decode(tokenizer, ids)
    assert counting.decoded < 6 * len(ids)


def test_stop_matcher_finds_a_stop_across_steps_and_holds_its_start():
    m = StopMatcher(("STOP", "xyz"))
    assert m.find("one two ST") is None and m.held("one two ST") == 2  # "ST" may begin "STOP"
    assert m.find("one two STO") is None and m.held("one two STO") == 3
    assert m.find("one two STOP four") == 8  # straddles the boundary of what was searched
    assert m.find("one two STOP four xyz") == 8  # the earliest stays
    fresh = StopMatcher(("STOP",))
    assert fresh.held("nothing here") == 0 and fresh.find("nothing here") is None


@pytest.mark.parametrize("seed", range(3))
def test_incremental_stops_agree_with_a_whole_search(tokenizer, seed):
    """StopChecker and TextStream, pushed step by step, stop and show exactly what searching the
    whole decoded text would."""
    rng = random.Random(seed)
    stops = ("brown f", "🙂 e", "zzz")
    for text in [*TEXTS, "the quick brown fox"]:
        ids = tokenizer(text, add_special_tokens=False).input_ids
        checker, stream, i, shown = StopChecker(tokenizer, stops), TextStream(tokenizer, stops), 0, ""
        while i < len(ids):
            i += rng.randint(1, 4)
            whole, stopped = cut_at_stop(decode(tokenizer, ids[:i]), stops)
            assert checker(ids[:i]) == stopped
            shown += stream.push(ids[:i])
            assert whole.startswith(shown) and not any(s in shown for s in stops)
        shown += stream.flush(ids)
        assert shown == cut_at_stop(decode(tokenizer, ids), stops)[0]
