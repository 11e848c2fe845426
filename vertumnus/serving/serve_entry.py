"""Ray Serve entry point for a KubeRay ``RayService`` (deploy/rayservice.yaml)::

    serveConfigV2:
      applications:
        - name: vertumnus
          import_path: vertumnus.serving.serve_entry:build_app
          route_prefix: /
          args: {config: /etc/vertumnus/config.yaml}

One ingress replica hosts exactly what ``vertumnus serve`` runs in its process — the pool, the engine's driver
and the HTTP app — inside the Ray cluster the RayService created (the replica is already connected, so hosting
joins it and never stops it). The ingress app is a thin shell: the full app (:func:`create_app`) is mounted on
it once the replica's asynchronous constructor has brought the pool up, on the replica's own event loop, which
is then the one loop that owns the pool. Needs ``ray[serve]`` in the image (not in the development
environment: this module is imported only by Ray Serve).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from ray import serve

from vertumnus.config import load_config
from vertumnus.serving.app import create_app
from vertumnus.serving.launcher import build_runtime

DEFAULT_CONFIG = "/etc/vertumnus/config.yaml"
shell = FastAPI(title="Vertumnus", docs_url=None, redoc_url=None)


@serve.deployment(
    num_replicas=1,  # one pool per cluster: the pool is the single place requests are placed from
    ray_actor_options={"num_cpus": 1},
    max_ongoing_requests=4096,  # admission is the app's own (serving.max_inflight → 429)
    health_check_period_s=10,
)
@serve.ingress(shell)
class VertumnusIngress:
    """The server inside a Serve replica."""

    async def __init__(self, config_path: str = DEFAULT_CONFIG) -> None:  # type: ignore[misc]  # Serve awaits it
        cfg = load_config(config_path)
        self.runtime, self.hosting = build_runtime(cfg)
        await self.runtime.start(cfg.serving.startup_timeout_s)
        shell.mount("/", create_app(self.runtime, manage_runtime=False))

    def check_health(self) -> None:
        """Serve's replica health check: unhealthy until every initial worker is ACTIVE."""
        if not self.runtime.ready:
            raise RuntimeError("prefill pool not ready")

    async def __del__(self) -> None:  # Serve awaits an async __del__ at replica shutdown
        await self.runtime.close()
        self.hosting.close()


def build_app(args: dict[str, Any]) -> Any:
    """Ray Serve application builder (``import_path`` target); ``args.config``: the mounted config file."""
    return VertumnusIngress.bind(str(args.get("config", DEFAULT_CONFIG)))  # type: ignore[attr-defined]
