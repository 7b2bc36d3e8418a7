"""Draft trees: the layout, and the helpers the verifier, DraftProposal and the oracle share."""

from __future__ import annotations

import pytest

from specdec.tree import DraftTree, is_chain

R, A, B, C = 10, 11, 12, 13


def docstring_tree() -> DraftTree:
    return DraftTree([R, A, B, C], [-1, 0, 1, 0])  # root r with continuations "a b" and "c"


def test_docstring_example():
    tree = docstring_tree()
    assert tree.depths == [0, 1, 2, 1]
    assert tree.children == [[1, 3], [2], [], []]
    assert [tree.path_to(n) for n in (2, 3)] == [[0, 1, 2], [0, 3]]


def test_is_chain():
    assert is_chain([-1]) and is_chain([-1, 0, 1])
    assert not is_chain([-1, 0, 0])
    assert DraftTree.chain(R, [A, B]).is_chain
    assert not docstring_tree().is_chain


def test_walk_by_a_choice_function():
    tree = docstring_tree()
    truth = {0: [A, B, 99], 1: [C, 99]}

    def follow(t: list[int]):
        return lambda node: tree.child_with(node, t[tree.depths[node]])

    assert tree.walk(follow(truth[0])) == [0, 1, 2]
    assert tree.walk(follow(truth[1])) == [0, 3]
    assert tree.walk(lambda node: None) == [0]
    assert tree.child_with(0, B) is None  # b is a grandchild, not a child


def test_invalid_trees_are_refused():
    for tokens, parents in [([], []), ([R, A], [0, 0]), ([R, A, B], [-1, 2, 0]), ([R], [-1, -1])]:
        with pytest.raises(ValueError):
            DraftTree(tokens, parents)
