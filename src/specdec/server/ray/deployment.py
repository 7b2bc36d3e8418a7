"""specdec on Ray Serve: replicas of the engine behind one OpenAI-compatible ingress.

    HTTP -> Ray proxy -> SpecdecIngress (one replica: the edge policy (hosts, origins, API key, body
                                         limit; ``edge.py``, as ``specdec serve``), affinity key, retries,
                                         /health and /metrics from what every replica reports)
                      -> AffinityRouter (in the ingress: same conversation, same replica)
                      -> SpecdecEngine x N (each the app of ``specdec serve``: its own LLM, scheduler,
                                            continuous batching, speculation and drafter caches)

A replica runs ``create_app`` in-process on each forwarded request (``forward.py``), so
routes, validation, errors and streaming are those of ``specdec serve``; every response names
its replica in the ``x-specdec-replica`` header.

Faults: a replica that dies before the first byte of its response reached the client costs
nothing but a retry on another replica; after that the client gets the server's usual
failure (a streamed ``data: {"error": ...}`` event). Ray Serve's controller replaces dead
replicas, and a replica removed by scale-down first finishes what it runs (drain, up to
``drain_timeout_s``).

No ``from __future__ import annotations``: FastAPI reads the route annotations.
"""

import asyncio
import logging
import math
import os
import signal
import sys
import time

import ray
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.config import RequestRouterConfig
from ray.serve.exceptions import BackPressureError, ReplicaUnavailableError

from specdec.llm import LLM
from specdec.log import get_logger
from specdec.server import limits
from specdec.server.app import create_app
from specdec.server.edge import EdgePolicy, GuardMiddleware
from specdec.server.errors import add_error_handlers, error_body, error_event
from specdec.server.ray.affinity import affinity_key
from specdec.server.ray.forward import ForwardedRequest, ResponsePart, call_asgi
from specdec.server.ray.metrics_merge import merge_expositions
from specdec.server.ray.options import RayDeployment, ReplicaSettings, engine_options
from specdec.server.ray.router import AffinityRouter

logger = get_logger(__name__)

APP_NAME, ENGINE, INGRESS = "specdec", "SpecdecEngine", "SpecdecIngress"
REPLICA_HEADER = "x-specdec-replica"
MAX_ATTEMPTS = 3  # a request whose replica died before answering is sent again, at most this often
RETRYABLE = (RayActorError, ActorUnavailableError, ReplicaUnavailableError)  # the replica, not the request
REPORT_EVERY_S = 0.5  # replicas push health and metrics this often
REPORT_STALE_S = 5.0  # a replica silent this long is gone (died or scaled away)


class EngineReplica:
    """One engine: the ``specdec serve`` app on this replica's own LLM and scheduler thread."""

    async def __init__(self, settings: ReplicaSettings) -> None:
        s = settings
        context = serve.get_replica_context()
        self.replica_id = context.replica_id.unique_id
        # Built on this thread, as `specdec serve` does: LLM sets torch's (OpenMP) thread count, which
        # the scheduler thread started below inherits.
        llm = LLM(s.model, dtype=s.dtype, kv_cache_dtype=s.kv_cache_dtype, spec=s.spec, max_model_len=s.max_model_len,
                  device=s.device, max_num_seqs=s.max_batch_size, backend=s.backend, quantization=s.quantization,
                  logprobs_mode=s.logprobs_mode)
        llm.warmup()
        # No API key, host or origin check here: only the ingress is reachable from outside, and it
        # applies the deployment's EdgePolicy (the replicas see no Host: forward.HOP_HEADERS).
        self.app = create_app(llm, served_model_name=s.served_model_name, max_queue=s.max_queue,
                              budget=s.budget, max_body_bytes=s.max_request_bytes, edge=EdgePolicy.open(),
                              prefill_seconds=s.prefill_seconds)
        self.state = self.app.state.specdec
        self.state.scheduler.start()  # what the app's lifespan does under uvicorn
        self.ingress = serve.get_deployment_handle(INGRESS, app_name=context.app_name)
        self.reporter = asyncio.get_running_loop().create_task(self._report_forever())

    async def forward(self, request: ForwardedRequest, affinity=None):
        """Stream the response parts; ``affinity`` is for the router and unused here."""
        async for part in call_asgi(self.app, request):
            if part.headers is not None:
                part.headers.append((REPLICA_HEADER, self.replica_id))
            yield part

    async def _report_forever(self) -> None:
        """Push health and metrics to the ingress: a call *to* a replica waits for a free request
        slot (Serve's max_ongoing_requests), so a busy replica could not answer /health in time."""
        while True:
            try:
                health = {"replica": self.replica_id, **self.state.scheduler.snapshot()}
                await self.ingress.report.remote(self.replica_id, health, self.state.metrics.render().decode())
            except Exception:  # noqa: BLE001 - the ingress restarting; the next report retries
                logger.warning("replica %s could not report to the ingress", self.replica_id, exc_info=True)
            await asyncio.sleep(REPORT_EVERY_S)

    def __del__(self) -> None:  # Serve calls this once the replica has drained
        if getattr(self, "reporter", None) is not None:
            self.reporter.cancel()
        if getattr(self, "state", None) is not None:
            self.state.scheduler.stop()


@serve.ingress()
class Ingress:
    """The one HTTP entry: checks, then forwards each request to a replica chosen by the router."""

    def __init__(self, engine, api_key: str | None, max_request_bytes: int, model_name: str,
                 edge: EdgePolicy) -> None:
        self.engine = engine  # DeploymentHandle of the engine replicas
        self.api_key, self.max_request_bytes, self.model_name = api_key, max_request_bytes, model_name
        self.edge = edge
        self.retries = 0  # requests re-sent after their replica died before answering
        self.failed = 0  # requests whose replica failed after the client got the first byte
        self.reports: dict[str, tuple[float, dict, str]] = {}  # replica -> (when, health, metrics page)

    async def report(self, replica: str, health: dict, metrics: str) -> None:
        """Called by each replica every REPORT_EVERY_S (async: runs on the loop that reads ``reports``)."""
        self.reports[replica] = (time.monotonic(), health, metrics)

    def live_reports(self) -> dict[str, tuple[dict, str]]:
        now = time.monotonic()
        for replica in [r for r, (when, _, _) in self.reports.items() if now - when > REPORT_STALE_S]:
            del self.reports[replica]
        return {r: (health, metrics) for r, (_, health, metrics) in sorted(self.reports.items())}

    def __serve_build_asgi_app__(self) -> FastAPI:
        app = FastAPI(title="specdec-ray", docs_url=None, redoc_url=None, openapi_url=None)
        app.add_middleware(GuardMiddleware, api_key=self.api_key, max_body_bytes=self.max_request_bytes,
                           edge=self.edge)  # the same edge as `specdec serve`: hosts, origins, metrics

        add_error_handlers(app, logger)  # e.g. 405 for a method no route takes

        @app.get("/health")
        async def health():
            replicas = [h for h, _ in self.live_reports().values()]
            if not replicas:
                return JSONResponse(error_body("no replica is ready yet", "server_error", 503), 503)
            totals = {k: sum(r[k] for r in replicas) for k in replicas[0] if k != "replica"}
            return {"status": "ok", "model": self.model_name, "replicas": len(replicas), **totals,
                    "per_replica": replicas}

        @app.get("/metrics")
        async def metrics():
            pages = {replica: page for replica, (_, page) in self.live_reports().items()}
            own = (f"# TYPE specdec:ray_request_retries_total counter\n"
                   f"specdec:ray_request_retries_total {self.retries}\n"
                   f"# TYPE specdec:ray_request_failed_total counter\n"
                   f"specdec:ray_request_failed_total {self.failed}\n")
            return Response(merge_expositions(pages) + own.encode(), media_type="text/plain; version=0.0.4")

        @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
        async def forward(request: Request):
            return await self._forward(request)

        return app

    async def _forward(self, request):
        body = await _read_body(request, self.max_request_bytes)
        if body is None:
            return _json_error(413, f"request body too large (> {self.max_request_bytes} bytes)",
                               "invalid_request_error", "request_too_large")
        headers = list(request.headers.items())  # lower-case names
        key = affinity_key(dict(headers), _json_or_none(body)) if request.method == "POST" else None
        forwarded = ForwardedRequest(request.method, request.url.path, request.url.query.encode(), headers, body)
        last = None
        for attempt in range(MAX_ATTEMPTS):
            stream = self.engine.options(stream=True).forward.remote(forwarded, affinity=key)
            try:
                first = await anext(stream)
            except RETRYABLE as exc:
                last = exc
                self.retries += 1
                logger.warning("replica failed before answering (attempt %d): %s", attempt + 1, exc)
                await asyncio.sleep(0.2 * attempt)  # give the controller time to mark it dead
                continue
            except BackPressureError:
                return _json_error(429, "every replica is busy and the queue is full; retry later",
                                   "rate_limit_error", "rate_limit_exceeded")
            except BaseException:
                stream.cancel()  # the client left (cancellation) or the replica raised
                raise
            return _response(first, stream, self)
        return _json_error(503, f"the replicas serving this request failed {MAX_ATTEMPTS} times: "
                                f"{type(last).__name__}", "server_error", 503)


def _response(first: ResponsePart, stream, ingress: Ingress) -> Response:
    headers = {k: v for k, v in first.headers or [] if k != "content-length"}
    if not first.more:
        return Response(first.body, status_code=first.status or 500, headers=headers)
    sse = headers.get("content-type", "").startswith("text/event-stream")

    async def rest():
        try:
            yield first.body
            async for part in stream:
                yield part.body
        except Exception as exc:  # noqa: BLE001 - too late to retry: the client has part of the answer
            ingress.failed += 1
            logger.warning("replica failed mid-stream: %s", exc)
            if sse:
                why = "the replica died" if isinstance(exc, RETRYABLE) else "the replica failed"
                yield (error_event(f"generation failed: {why} ({type(exc).__name__})", 500)
                       + "data: [DONE]\n\n").encode()
        finally:
            stream.cancel()  # no-op once finished; stops the replica's generation if the client left

    return StreamingResponse(rest(), status_code=first.status or 200, headers=headers)


async def _read_body(request, limit: int) -> bytes | None:
    """The body, or None once it passes ``limit`` (a chunked upload has no content-length to check)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _json_or_none(body: bytes):
    try:
        return limits.loads(body.decode("utf-8", "replace"))
    except ValueError:  # not JSON, too deep, too long a number: no affinity key, the replica answers 400
        return None


def _json_error(status: int, message: str, type_: str, code: str | int) -> JSONResponse:
    return JSONResponse(error_body(message, type_, code), status_code=status)


def build_app(d: RayDeployment):
    """The Ray Serve application: ``serve.run(build_app(d))``."""
    engine = serve.deployment(EngineReplica, name=ENGINE).options(**engine_options(d))
    if d.affinity:
        engine = engine.options(request_router_config=RequestRouterConfig(request_router_class=AffinityRouter))
    ingress = serve.deployment(Ingress, name=INGRESS, num_replicas=1, ray_actor_options={"num_cpus": 0},
                               max_ongoing_requests=10_000, logging_config=d.logging_config)
    return ingress.bind(engine.bind(d.replica), d.api_key, d.replica.max_request_bytes, d.replica.model_name,
                        d.edge)


def run(d: RayDeployment, host: str, port: int, address: str | None = None) -> int:
    """``specdec serve --ray``: deploy on a local Ray cluster (or the one at ``address``) until stopped.

    Without ``address`` a local cluster starts with at least one logical CPU per replica, so
    ``--replicas N`` always fits; they share the real cores. With an address, Serve's HTTP
    options (host, port) are the cluster's if Serve already runs there.
    """
    if address:
        ray.init(address=address, logging_level=logging.WARNING)
    else:
        cpus = max(os.cpu_count() or 1, math.ceil(d.scale.max_replicas * d.num_cpus))
        ray.init(address="local", num_cpus=cpus, include_dashboard=False, logging_level=logging.WARNING)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # clean up on `kill` as on Ctrl-C
    try:
        serve.start(http_options={"host": host, "port": port}, logging_config=d.logging_config)
        serve.run(build_app(d), name=APP_NAME, route_prefix="/")
        scale = (f"autoscaling {d.scale.min_replicas}..{d.scale.max_replicas}" if d.scale.autoscale
                 else f"{d.scale.min_replicas} replica(s)")
        print(f"specdec: serving {d.replica.model_name} on Ray Serve, {scale}, at http://{host}:{port}/v1",
              file=sys.stderr, flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        if address:
            serve.delete(APP_NAME)  # leave the cluster, and Serve on it, to its owner
        else:
            serve.shutdown()
        ray.shutdown()
    return 0
