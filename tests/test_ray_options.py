"""The --ray flags and the Ray Serve options built from them (pure: no Ray needed)."""

from __future__ import annotations

import importlib.util

import pytest

from specdec.cli.main import build_parser
from specdec.errors import UsageError
from specdec.server.cli import serve_config
from specdec.server.ray.options import (
    RAY_MISSING,
    Scale,
    check_ray_args,
    deployment_from_args,
    engine_options,
    parse_autoscale,
)


@pytest.fixture(autouse=True)
def ray_installed(monkeypatch):
    """These checks are pure: they pass whether or not Ray is installed here (CI has no Ray)."""
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name.startswith("ray") else
                        real_find_spec(name, *a))


def deployment(*flags: str):
    args = build_parser().parse_args(["serve", *flags])
    check_ray_args(args)
    return deployment_from_args(args, *serve_config(args))


def test_autoscale_parsing():
    assert parse_autoscale("1,4") == Scale(1, 4) and parse_autoscale("2,2") == Scale(2, 2)
    assert parse_autoscale("1,4").autoscale and not Scale(2, 2).autoscale
    for bad in ("4", "1,2,3", "a,b", "0,2", "3,1", ""):
        with pytest.raises(UsageError, match="--autoscale"):
            parse_autoscale(bad)


def test_ray_flags_need_ray_and_each_other(monkeypatch):
    for flags in (["--replicas", "2"], ["--autoscale", "1,2"], ["--ray-address", "auto"]):
        with pytest.raises(UsageError, match="need --ray"):
            deployment(*flags)
    with pytest.raises(UsageError, match="not both"):
        deployment("--ray", "--replicas", "2", "--autoscale", "1,2")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name.startswith("ray") else
                        real_find_spec(name, *a))
    with pytest.raises(UsageError) as err:
        deployment("--ray")
    assert str(err.value) == RAY_MISSING and "specdec[ray]" in RAY_MISSING


def test_engine_options_fixed_and_autoscaled():
    d = deployment("--spec-type", "ngram", "--max-batch-size", "6", "--max-queue", "20", "--api-key", "k",
                   "--replicas", "3", "--ray")
    assert d.replica.spec.enabled and d.replica.max_batch_size == 6 and d.api_key == "k" and d.affinity
    options = engine_options(d)
    assert options["num_replicas"] == 3 and "autoscaling_config" not in options
    assert options["max_ongoing_requests"] == 6 and options["max_queued_requests"] == 20
    assert options["graceful_shutdown_timeout_s"] >= 60 and options["ray_actor_options"] == {"num_cpus": 1.0}
    options = engine_options(deployment("--ray", "--autoscale", "1,4", "--device", "cuda"))
    assert "num_replicas" not in options and options["ray_actor_options"]["num_gpus"] == 1
    assert options["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4, "initial_replicas": 1,
                                             "target_ongoing_requests": 4}
    assert options["logging_config"] == {"log_level": "WARNING", "enable_access_log": False}
