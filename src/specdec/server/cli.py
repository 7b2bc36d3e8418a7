"""`specdec serve`: the command's flags, vLLM's --speculative-config, and starting uvicorn.

The model code, FastAPI and uvicorn load inside ``cmd_serve``: the flags parse without them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from specdec.budget import DraftBudget
from specdec.cli.args import (
    add_logprobs_mode_arg,
    add_model_args,
    add_spec_args,
    model_options,
    positive_int,
    positive_seconds,
    spec_from_args,
)
from specdec.config import SpecConfig, SpecType
from specdec.errors import UsageError
from specdec.server.edge import DEFAULT_MAX_BODY_BYTES, EdgePolicy
from specdec.server.ray.options import check_ray_args, deployment_from_args


def _names(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def add_serve_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_spec_args(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--api-key", default=os.environ.get("SPECDEC_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on every /v1 route, /metrics and /health "
                        "(default: $SPECDEC_API_KEY)")
    g.add_argument("--allowed-hosts", type=_names, default=[], metavar="NAME,...",
                   help="Host header names answered besides localhost, IP addresses and --host; '*' = any "
                        "(others get 400: DNS rebinding cannot read replies)")
    g.add_argument("--allowed-origins", type=_names, default=[], metavar="ORIGIN,...",
                   help="origins (https://app.example) whose pages may POST besides the server's own; '*' = any "
                        "(others get 403)")
    g.add_argument("--metrics-public", action="store_true",
                   help="with --api-key: /metrics and /health open without the key")
    g.add_argument("--served-model-name", default=None, help="model id reported and accepted by the API")
    g.add_argument("--max-batch-size", type=positive_int, default=8,
                   help="most sequences decoded together (one KV cache slot each)")
    g.add_argument("--max-queue", type=int, default=64,
                   help="most sequences waiting for a slot; beyond it requests get 429")
    g.add_argument("--prefill-seconds", type=positive_seconds, default=None, metavar="S",
                   help="while other requests stream, prefill a new prompt about S seconds a step (chunks sized "
                        "from the last prefill's rate; GGUF weights): their tokens wait less (inter-token latency), "
                        "the new request's first token and the throughput pay a little (docs/server.md); default: "
                        "512 prompt tokens a step")
    g.add_argument("--max-request-bytes", type=positive_int, default=DEFAULT_MAX_BODY_BYTES,
                   help="largest request body (413 beyond)")
    g.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    add_logprobs_mode_arg(g)
    s = p.add_argument_group("speculation under load")
    s.add_argument("--speculative-config", default=None,
                   help='vLLM-style JSON instead of --spec-type, e.g. \'{"method": "ngram", '
                        '"num_speculative_tokens": 5, "prompt_lookup_max": 4}\'')
    s.add_argument("--spec-batch-draft-tokens", type=int, default=None,
                   help="cap on drafted tokens per step over the whole batch: K(b) <= this // b (default: no "
                        "cap; the engine plans each step's drafts from the measured cost of the batch's pass)")
    s.add_argument("--spec-disable-batch-size", type=int, default=None,
                   help="no drafting when more sequences than this run (vLLM's disable_by_batch_size)")
    r = p.add_argument_group("scale out on Ray Serve (pip install 'specdec[ray]'; docs/server.md)")
    r.add_argument("--ray", action="store_true",
                   help="serve replicas of this engine on Ray Serve behind one endpoint, with conversation affinity")
    r.add_argument("--replicas", type=positive_int, default=None, help="with --ray: this many replicas (default 1)")
    r.add_argument("--autoscale", default=None, metavar="MIN,MAX",
                   help="with --ray: autoscale between MIN and MAX replicas on load")
    r.add_argument("--ray-address", default=None, metavar="auto|HOST:PORT",
                   help="with --ray: join this Ray cluster (default: start a local one)")


def spec_from_vllm_config(text: str) -> tuple[SpecConfig, int | None]:
    """vLLM's --speculative-config JSON -> (SpecConfig, disable_by_batch_size). Raises ValueError.

    {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4} -> ngram, K=5, n-gram size 4;
    {"method": "suffix", ...}; {"method": "draft_model", "model": "path"} (or just {"model": "path"});
    {"method": "mtp", "num_speculative_tokens": 2} -> draft-mtp (the target checkpoint's MTP module; with
    "model": a module trained by `specdec train mtp`); "parallel_drafting": true -> --spec-parallel-drafting.
    """
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--speculative-config is not valid JSON: {exc.msg}") from None
    if not isinstance(cfg, dict):
        raise ValueError("--speculative-config must be a JSON object")
    method = cfg.get("method")
    model = cfg.get("model")
    if method is None:
        method = "ngram" if model in ("ngram", "[ngram]") else ("draft_model" if model else None)
    aliases = {"ngram": SpecType.NGRAM, "suffix": SpecType.SUFFIX, "draft_model": SpecType.DRAFT_MODEL,
               "mtp": SpecType.DRAFT_MTP}
    aliases.update({t.value: t for t in SpecType if t is not SpecType.NONE})
    if method not in aliases:
        raise ValueError(f"--speculative-config method {method!r} is not supported; "
                         f"choose from: {', '.join(sorted(aliases))}")
    kind = aliases[method]
    changes: dict = {"types": (kind,)}
    if "num_speculative_tokens" in cfg:
        changes["draft_n_max"] = _int_field(cfg, "num_speculative_tokens")
    if "prompt_lookup_max" in cfg:
        changes["ngram_size_n"] = _int_field(cfg, "prompt_lookup_max")
    if kind is SpecType.DRAFT_MODEL:
        if not isinstance(model, str) or not model:
            raise ValueError('--speculative-config with method "draft_model" needs "model"')
        changes["draft_model"] = model
    if kind is SpecType.EAGLE3:  # vLLM drafts a chain of num_speculative_tokens with the head in "model"
        changes["spec_model"] = model if isinstance(model, str) and model else None
        k = changes.get("draft_n_max", SpecConfig.num_draft_tokens)
        changes.update(eagle_topk=1, num_steps=k, num_draft_tokens=k, draft_n_max=k)
    if kind is SpecType.DRAFT_MTP and isinstance(model, str) and model:
        changes["spec_model"] = model
    if "parallel_drafting" in cfg:
        if not isinstance(cfg["parallel_drafting"], bool):
            raise ValueError(f"--speculative-config parallel_drafting must be true or false, got "
                             f"{cfg['parallel_drafting']!r}")
        changes["parallel_drafting"] = cfg["parallel_drafting"]
    known = {"method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
             "disable_by_batch_size", "parallel_drafting"}
    ignored = sorted(set(cfg) - known)
    if "prompt_lookup_min" in cfg:
        ignored.append("prompt_lookup_min (the n-gram drafter falls back to 2-grams)")
    if ignored:
        print(f"specdec: warning: --speculative-config ignores: {', '.join(ignored)}", file=sys.stderr)
    disable = _int_field(cfg, "disable_by_batch_size") if "disable_by_batch_size" in cfg else None
    return SpecConfig(**changes), disable


def _int_field(cfg: dict, key: str) -> int:
    value = cfg[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"--speculative-config {key} must be a positive integer, got {value!r}")
    return value


def serve_config(args: argparse.Namespace) -> tuple[SpecConfig, DraftBudget]:
    """The speculation settings and batch draft budget from the serve flags (UsageError when bad)."""
    disable = args.spec_disable_batch_size
    if args.speculative_config is not None:
        if args.spec_type is not None:
            raise UsageError("give either --speculative-config or --spec-type, not both")
        try:
            spec, vllm_disable = spec_from_vllm_config(args.speculative_config)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        disable = disable if disable is not None else vllm_disable
    else:
        spec = spec_from_args(args)
    try:
        budget = DraftBudget(spec.draft_n_max, args.spec_batch_draft_tokens, disable)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return spec, budget


def cmd_serve(args: argparse.Namespace) -> int:
    spec, budget = serve_config(args)
    if not 0 < args.port < 65536:
        raise UsageError(f"--port must be in 1..65535, got {args.port}")
    if args.max_queue < 0:
        raise UsageError("--max-queue must be >= 0")
    check_ray_args(args)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        print(f"specdec: warning: serving on {args.host} without --api-key: anyone who can reach it can use it",
              file=sys.stderr)
    if args.ray:
        from specdec.server.ray import deployment  # Ray is an optional extra: import it only when asked for

        return deployment.run(deployment_from_args(args, spec, budget), args.host, args.port, args.ray_address)
    import uvicorn

    from specdec.llm import LLM
    from specdec.server.app import create_app

    edge = EdgePolicy.for_bind(args.host, args.allowed_hosts, args.allowed_origins, args.metrics_public)
    llm = LLM(args.model, spec=spec, max_num_seqs=args.max_batch_size, logprobs_mode=args.logprobs_mode,
              **model_options(args))
    llm.warmup()
    app = create_app(llm, served_model_name=args.served_model_name, api_key=args.api_key,
                     max_queue=args.max_queue, budget=budget, max_body_bytes=args.max_request_bytes,
                     edge=edge, prefill_seconds=args.prefill_seconds)
    print(f"specdec: serving {args.served_model_name or llm.model_name} on http://{args.host}:{args.port}/v1 "
          f"(batch {args.max_batch_size}, spec {','.join(t.value for t in spec.types)}, "
          f"backend {llm.runner.backend}, KV cache {llm.runner.kv_cache_label} "
          f"{llm.runner.kv_bytes() / 2**20:.0f} MiB); playground http://{args.host}:{args.port}/, dashboard /dashboard",
          file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
