"""cli/args.py: the draft-tree flags (llama.cpp's --draft-p-split) -> SpecConfig, bad values as one line."""

from __future__ import annotations

import pytest

from specdec.cli.args import Parser, add_spec_args, spec_from_args
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


def test_kv_cache_dtype_reaches_every_command_and_a_bad_one_is_one_line():
    from specdec.cli.args import add_model_args, model_options
    from specdec.runners.load import KV_CACHE_DTYPES

    p = Parser()
    add_model_args(p)
    assert model_options(p.parse_args([]))["kv_cache_dtype"] == "auto"
    for kv in KV_CACHE_DTYPES:
        assert model_options(p.parse_args(["--kv-cache-dtype", kv]))["kv_cache_dtype"] == kv
    assert bench_config("--kv-cache-dtype", "float16").kv_cache_dtype == "float16"
    with pytest.raises(UsageError) as err:
        p.parse_args(["--kv-cache-dtype", "fp8"])
    assert "\n" not in str(err.value) and "kv-cache-dtype" in str(err.value)


def bench_config(*argv: str):
    from specdec.bench.cli import add_bench_args, config_from_args

    p = Parser()
    add_bench_args(p)
    return config_from_args(p.parse_args(["--quick", "--peers", "none", *argv]))


def test_bench_takes_every_drafter_setting_from_add_spec_args():
    """`specdec bench` reuses generate's flags: a setting bench never re-declared reaches every method."""
    cfg = bench_config("--methods", "ngram,suffix", "--spec-ngram-size-n", "3", "--spec-draft-n-max", "5")
    assert [m.name for m in cfg.methods] == ["none", "ngram", "suffix"]
    assert all(m.spec.ngram_size_n == 3 and m.spec.draft_n_max == 5 for m in cfg.methods)
    assert cfg.draft_n_max == 5


def test_parallel_drafting_is_checked_once_for_cli_bench_and_server():
    """The one check lives in SpecConfig: generate, bench and vLLM's --speculative-config all refuse it
    without a head-drafting method, and bench keeps it only for its eagle3 methods."""
    from specdec.config import SpecConfig, SpecType
    from specdec.server.cli import spec_from_vllm_config

    with pytest.raises(UsageError, match="parallel-drafting.*eagle3"):
        bench_config("--methods", "ngram", "--spec-parallel-drafting")
    p = Parser()
    add_spec_args(p)
    with pytest.raises(UsageError, match="parallel-drafting.*eagle3"):
        spec_from_args(p.parse_args(["--spec-type", "suffix", "--spec-parallel-drafting"]))
    with pytest.raises(ValueError, match="eagle3"):
        spec_from_vllm_config('{"method": "ngram", "parallel_drafting": true}')
    base = SpecConfig(types=(SpecType.EAGLE3,), spec_model="h", parallel_drafting=True)
    assert not base.with_types((SpecType.NGRAM,)).parallel_drafting
    assert base.with_types((SpecType.SUFFIX, SpecType.EAGLE3)).parallel_drafting
