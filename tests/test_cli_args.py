"""cli_args: the draft-tree flags (llama.cpp's --draft-p-split) -> SpecConfig, bad values as one line."""

from __future__ import annotations

import pytest

from specdec.cli_args import Parser, add_spec_args, spec_from_args
from specdec.errors import UsageError


def spec(*argv: str):
    p = Parser()
    add_spec_args(p)
    return spec_from_args(p.parse_args(list(argv)))


def test_p_split_is_off_unless_given_and_alone_means_llama_cpp_default():
    assert spec().draft_p_split is None
    assert spec("--spec-draft-p-split").draft_p_split == 0.1
    s = spec("--spec-draft-p-split", "0.3", "--spec-draft-branches", "3")
    assert (s.draft_p_split, s.draft_branches) == (0.3, 3)


@pytest.mark.parametrize("argv", [("--spec-draft-p-split", "1.5"), ("--spec-draft-p-split", "0"),
                                  ("--spec-draft-branches", "0")])
def test_bad_tree_settings_are_one_line(argv):
    with pytest.raises(UsageError) as err:
        spec(*argv)
    assert "\n" not in str(err.value) and "spec-draft" in str(err.value)
