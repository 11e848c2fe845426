"""Ray Serve entry point for a KubeRay ``RayService`` (deploy/rayservice.yaml)::

    serveConfigV2:
      applications:
        - name: vertumnus
          import_path: vertumnus.serving.serve_entry:build_app
          route_prefix: /
          args: {config: /etc/vertumnus/config.yaml}

One ingress replica hosts exactly what ``vertumnus serve`` runs in its process — the pool, the engine's driver
and the HTTP app — inside the Ray cluster the RayService created (the replica is already connected, so hosting
joins it and never stops it). The replica's constructor loads the config and assembles the runtime
(:func:`build_runtime`: placement groups, rank actors, decode); Serve then asks it for its ASGI app
(``__serve_build_asgi_app__``, the late-bound form of ``@serve.ingress()``) and gets the full app
(:func:`create_app`), whose lifespan — run by Serve on the replica's user-code event loop, the loop that also
serves every request — starts the pool (the replica counts as started once every initial worker is ACTIVE)
and closes it when the replica shuts down; the destructor then removes the pool's placement groups.

Verified with ``serve run`` of this very ``serveConfigV2`` on a local cluster (tests/serving/test_serve_entry.py,
deploy/README.md). Needs ``ray[serve]`` (the ``serve`` extra; in the image, see deploy/Dockerfile).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI
from ray import serve

from vertumnus.config import load_config
from vertumnus.serving.app import create_app
from vertumnus.serving.hosting import RayHosting
from vertumnus.serving.launcher import build_runtime
from vertumnus.serving.runtime import ServingRuntime

DEFAULT_CONFIG = "/etc/vertumnus/config.yaml"
log = logging.getLogger("ray.serve")  # Serve writes this logger to the replica's log file


@serve.deployment(
    num_replicas=1,  # one pool per cluster: the pool is the single place requests are placed from
    ray_actor_options={"num_cpus": 1},
    max_ongoing_requests=4096,  # admission is the app's own (serving.max_inflight → 429)
    health_check_period_s=10,
)
@serve.ingress()  # the app is late-bound: __serve_build_asgi_app__
class VertumnusIngress:
    """The server inside a Serve replica."""

    runtime: ServingRuntime
    hosting: RayHosting

    def __init__(self, config_path: str = DEFAULT_CONFIG) -> None:
        cfg = load_config(config_path)
        self.runtime, self.hosting = build_runtime(cfg)  # joins the replica's cluster (never stops it)

    def __serve_build_asgi_app__(self) -> FastAPI:
        """The ASGI app Serve routes to (called once, after ``__init__``); its lifespan starts and closes the
        runtime, as under ``vertumnus serve``."""
        return create_app(self.runtime, manage_runtime=True)

    def check_health(self) -> None:
        """Serve's periodic replica health check: unhealthy once the runtime is no longer ready (closed)."""
        if not self.runtime.admission.ready:
            raise RuntimeError("prefill pool not ready")

    def __del__(self) -> None:
        """Replica shutdown, after the app's lifespan closed the runtime: remove the pool's placement groups."""
        hosting = getattr(self, "hosting", None)  # absent when __init__ failed
        if hosting is not None:
            hosting.close()
            log.info("vertumnus: replica shut down (pool closed, placement groups removed)")


def build_app(args: dict[str, Any]) -> Any:
    """Ray Serve application builder (``import_path`` target); ``args.config``: the mounted config file."""
    return VertumnusIngress.bind(str(args.get("config", DEFAULT_CONFIG)))  # type: ignore[attr-defined]
