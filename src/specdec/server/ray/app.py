"""The Ray Serve application builder for ``serve run`` and ``serve deploy`` on an existing cluster.

Its arguments are the ``specdec serve`` flags without dashes, so a config file and the command
line are checked by the same parser::

    serve run specdec.server.ray.app:build model=HuggingFaceTB/SmolLM2-135M-Instruct spec_type=suffix replicas=2

    # serve_config.yaml (serve deploy serve_config.yaml)
    applications:
      - name: specdec
        route_prefix: /
        import_path: specdec.server.ray.app:build
        args: {model: HuggingFaceTB/SmolLM2-135M-Instruct, spec_type: suffix, autoscale: "1,4"}

Host and port are Serve's ``http_options``, not flags; ``ray_address`` does not apply.
"""

from __future__ import annotations

from collections.abc import Mapping

from specdec.cli.args import Parser
from specdec.errors import UsageError
from specdec.server.cli import add_serve_args, serve_config
from specdec.server.ray.deployment import build_app
from specdec.server.ray.options import deployment_from_args

NOT_HERE = {"host", "port", "ray", "ray_address", "log_level"}  # the cluster's or the CLI's, not the app's


def flags_from_args(args: Mapping[str, object]) -> list[str]:
    """{"spec_type": "ngram", "replicas": 2, "flag": True} -> ["--spec-type", "ngram", "--replicas", "2", "--flag"]."""
    argv = []
    for key, value in args.items():
        name = key.replace("-", "_")
        if name in NOT_HERE:
            raise UsageError(f"{key!r} is not an application argument: set it in the Serve config / CLI")
        if value is None or value is False or value == "false":
            continue
        argv.append("--" + name.replace("_", "-"))
        if value is not True and value != "true":
            argv.append(str(value))
    return argv


def build(args: Mapping[str, object]):
    """Serve application builder: ``args`` (from ``serve run ... key=value`` or a config) -> Application."""
    parser = Parser(prog="specdec.server.ray.app:build")
    add_serve_args(parser)
    ns = parser.parse_args(flags_from_args(args))
    spec, budget = serve_config(ns)
    return build_app(deployment_from_args(ns, spec, budget))
