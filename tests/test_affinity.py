"""Conversation affinity keys and the replica table (pure: no Ray needed)."""

from __future__ import annotations

import random

from specdec.server.ray.affinity import AffinityKey, AffinityTable, affinity_key, render_messages, render_prompt

SYSTEM = {"role": "system", "content": "You are a coding agent."}


def turn(*pairs: tuple[str, str]) -> list[dict]:
    return [SYSTEM, *({"role": r, "content": c} for r, c in pairs)]


def test_key_sources_and_precedence():
    body = {"messages": turn(("user", "hi")), "user": "alice", "prompt_cache_key": "conv-7"}
    assert affinity_key({"x-session-id": "s1"}, body).session == "s1"
    assert affinity_key({}, body).session == "prompt_cache_key:conv-7"
    assert affinity_key({}, {**body, "prompt_cache_key": None}).session == "user:alice"
    key = affinity_key({}, {"messages": turn(("user", "hi"))})
    assert key.session is None and key.prompt == render_messages(turn(("user", "hi")))
    assert affinity_key({}, {"prompt": "Once upon"}).prompt == "Once upon"
    # Bad bodies give no key (the replica refuses them), never an exception.
    for body in (None, [], "text", 3, {"prompt": 12.5}, {"messages": "hi"}, {"messages": [1, None]}, {}):
        key = affinity_key({}, body)
        assert key is None or (key.session is None and isinstance(key.prompt, str))


def test_rendering_keeps_turns_prefixes_and_separates_messages():
    one = render_messages(turn(("user", "Fix the bug")))
    two = render_messages(turn(("user", "Fix the bug"), ("assistant", "Done."), ("user", "Test it")))
    assert two.startswith(one)
    # A message that only starts like the earlier one is not the same turn.
    assert not render_messages(turn(("user", "Fix the bug now"))).startswith(one)
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert render_messages(parts) == render_messages([{"role": "user", "content": "ab"}])
    assert not render_prompt([1, 23]).startswith(render_prompt([1, 2]))
    assert render_prompt([1, 2, 3]).startswith(render_prompt([1, 2]))
    assert render_prompt(["first", "second"]) == "first" and render_prompt([]) == ""


def test_multi_turn_conversation_stays_and_strangers_do_not_follow():
    table = AffinityTable()
    a1 = AffinityKey(prompt=render_messages(turn(("user", "Fix bug 1"))))
    b1 = AffinityKey(prompt=render_messages(turn(("user", "Fix bug 2"))))
    table.record(a1, "A")
    table.record(b1, "B")
    a2 = AffinityKey(prompt=render_messages(turn(("user", "Fix bug 1"), ("assistant", "ok"), ("user", "go on"))))
    assert table.lookup(a2) == "A"
    assert table.lookup(AffinityKey(prompt=render_messages(turn(("user", "Fix bug 3"))))) is None  # same system only
    table.record(a2, "B")  # the conversation moved (A was full): its latest turn is on B now
    assert table.lookup(a2) == "B" and len(table._prompts) == 2  # a2 replaced a1
    assert table.lookup(AffinityKey(prompt=a2.prompt + "\x1euser\x1emore\x1d")) == "B"


def test_sessions_win_and_forget_dead_replicas():
    table = AffinityTable()
    table.record(AffinityKey("user:alice", "p"), "A")
    assert table.lookup(AffinityKey("user:alice", "something else")) == "A"
    assert table.lookup(AffinityKey("user:bob", "p")) is None  # a session key never falls back to prompts
    table.record(AffinityKey(prompt="abc"), "B")
    table.forget_replicas(["A", "B"])
    assert table.lookup(AffinityKey("user:alice")) is None and table.lookup(AffinityKey(prompt="abcd")) is None
    assert table._prompt_chars == 0


def test_bounds_forget_oldest():
    table = AffinityTable(max_sessions=2, max_prompt_chars=10)
    for i, replica in enumerate("ABC"):
        table.record(AffinityKey(f"s{i}"), replica)
    assert table.lookup(AffinityKey("s0")) is None and table.lookup(AffinityKey("s2")) == "C"
    table.record(AffinityKey(prompt="aaaa"), "A")
    table.record(AffinityKey(prompt="bbbb"), "B")
    table.record(AffinityKey(prompt="cccc"), "C")  # 12 chars > 10: "aaaa" goes
    assert table.lookup(AffinityKey(prompt="aaaa!")) is None and table.lookup(AffinityKey(prompt="cccc!")) == "C"
    table.record(AffinityKey(prompt="x" * 11), "A")  # longer than the whole store: not kept
    assert table._prompt_chars <= 10


def test_rank_prefers_remembered_replica_then_everyone_else():
    table, rng = AffinityTable(), random.Random(0)
    key = AffinityKey("user:alice")
    assert sorted(table.rank(key, ["A", "B", "C"], rng)[0]) == ["A", "B", "C"]  # new: one rank, least-loaded wins
    table.record(key, "B")
    ranks = table.rank(key, ["A", "B", "C"], rng)
    assert ranks[0] == ["B"] and sorted(ranks[1]) == ["A", "C"]
    assert table.rank(key, ["B"], rng) == [["B"]]
    assert sorted(table.rank(key, ["A", "C"], rng)[0]) == ["A", "C"]  # B is gone: fall back
    assert table.rank(None, [], rng) == []
    # The shuffle spreads new conversations over idle replicas.
    firsts = {table.rank(None, ["A", "B"], rng)[0][0] for _ in range(20)}
    assert firsts == {"A", "B"}
