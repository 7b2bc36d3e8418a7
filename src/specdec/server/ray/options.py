"""What a Ray Serve deployment of specdec is built from: replica settings and scaling, from the serve flags.

Pure data and parsing, no Ray import: ``specdec serve`` checks these flags (and says how to
install Ray) before anything heavy loads, and the tests run without Ray.
"""

from __future__ import annotations

import argparse
import importlib.util
from dataclasses import dataclass

from specdec.budget import DraftBudget
from specdec.cli.args import model_options
from specdec.config import SpecConfig
from specdec.errors import UsageError
from specdec.server.edge import EdgePolicy

RAY_MISSING = "--ray needs Ray Serve: pip install 'specdec[ray]' (or pip install 'ray[serve]')"
DRAIN_TIMEOUT_S = 300.0  # a replica scaled away finishes its running generations for this long


@dataclass(frozen=True)
class Scale:
    """A fixed number of replicas, or autoscaling between ``min_replicas`` and ``max_replicas``."""

    min_replicas: int = 1
    max_replicas: int = 1

    @property
    def autoscale(self) -> bool:
        return self.max_replicas > self.min_replicas


@dataclass(frozen=True)
class ReplicaSettings:
    """Everything one replica needs to build its engine and app (pickled to every replica)."""

    model: str | None
    spec: SpecConfig
    budget: DraftBudget
    dtype: str = "float32"
    kv_cache_dtype: str = "auto"
    device: str | None = None
    backend: str | None = None
    quantization: str | None = None
    max_model_len: int = 4096
    max_batch_size: int = 8
    max_queue: int = 64
    prefill_seconds: float | None = None
    max_request_bytes: int = 16 * 1024 * 1024
    served_model_name: str | None = None
    logprobs_mode: str = "raw_logprobs"

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model or "SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class RayDeployment:
    """A whole deployment: the replicas, how many, and the ingress in front of them."""

    replica: ReplicaSettings
    scale: Scale = Scale()
    api_key: str | None = None
    # The ingress's host, origin and metrics policy (``specdec serve``'s flags): the one front door
    edge: EdgePolicy = EdgePolicy.for_bind("127.0.0.1")
    affinity: bool = True  # False: Ray's default power-of-two-choices router (for comparisons)
    num_cpus: float = 1.0  # logical CPUs Ray reserves per replica
    drain_timeout_s: float = DRAIN_TIMEOUT_S
    log_level: str = "warning"  # Serve's logs (controller, proxy, replicas); "info" adds one line per request

    @property
    def logging_config(self) -> dict:
        return {"log_level": self.log_level.upper(), "enable_access_log": self.log_level in ("info", "debug")}


def parse_autoscale(text: str) -> Scale:
    """'MIN,MAX' -> Scale; 1 <= MIN <= MAX. Raises UsageError."""
    parts = text.split(",")
    try:
        low, high = (int(p) for p in parts)
    except ValueError:
        raise UsageError(f"--autoscale takes MIN,MAX (two integers), got {text!r}") from None
    if not 1 <= low <= high:
        raise UsageError(f"--autoscale MIN,MAX needs 1 <= MIN <= MAX, got {text!r}")
    return Scale(low, high)


def scale_from_args(args: argparse.Namespace) -> Scale:
    if args.replicas is not None and args.autoscale is not None:
        raise UsageError("give either --replicas or --autoscale, not both")
    if args.autoscale is not None:
        return parse_autoscale(args.autoscale)
    n = args.replicas or 1
    return Scale(n, n)


def check_ray_args(args: argparse.Namespace) -> None:
    """Ray flags only with --ray, and Ray installed when --ray is given (UsageError otherwise)."""
    ray_flags = [f for f, v in (("--replicas", args.replicas), ("--autoscale", args.autoscale),
                                ("--ray-address", args.ray_address)) if v is not None]
    if not args.ray:
        if ray_flags:
            raise UsageError(f"{', '.join(ray_flags)} need --ray")
        return
    scale_from_args(args)
    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("ray.serve") is None:
        raise UsageError(RAY_MISSING)


def deployment_from_args(args: argparse.Namespace, spec: SpecConfig, budget: DraftBudget) -> RayDeployment:
    replica = ReplicaSettings(
        model=args.model, spec=spec, budget=budget, **model_options(args), max_batch_size=args.max_batch_size,
        max_queue=args.max_queue, prefill_seconds=args.prefill_seconds, max_request_bytes=args.max_request_bytes,
        served_model_name=args.served_model_name, logprobs_mode=args.logprobs_mode,
    )
    edge = EdgePolicy.for_bind(args.host, args.allowed_hosts, args.allowed_origins, args.metrics_public)
    return RayDeployment(replica, scale_from_args(args), api_key=args.api_key, edge=edge, log_level=args.log_level)


def engine_options(d: RayDeployment) -> dict:
    """Ray Serve deployment options of the engine replicas (``Deployment.options(**this)``).

    A replica takes at most ``max_batch_size`` requests at once, its KV cache slots: a request
    beyond that waits in the ingress's router for any replica to free a slot, instead of
    queueing behind a busy one. Autoscaling aims at replicas half full.
    """
    r = d.replica
    options: dict = {
        "max_ongoing_requests": r.max_batch_size,
        "max_queued_requests": max(r.max_queue, 1),
        "graceful_shutdown_timeout_s": d.drain_timeout_s,
        "logging_config": d.logging_config,
        "ray_actor_options": {"num_cpus": d.num_cpus, **({"num_gpus": 1} if r.device == "cuda" else {})},
    }
    if d.scale.autoscale:
        options["autoscaling_config"] = {
            "min_replicas": d.scale.min_replicas, "max_replicas": d.scale.max_replicas,
            "initial_replicas": d.scale.min_replicas, "target_ongoing_requests": max(1, r.max_batch_size // 2),
        }
    else:
        options["num_replicas"] = d.scale.min_replicas
    return options
