"""deploy/: the manifests parse, name only keys the KubeRay v1.3 RayService CRD defines (sets below, from the
KubeRay v1.3 API reference, docs/reference/api.md of ray-project/kuberay), agree with the config they ship,
and the dashboard and docs name only metrics the server exports."""

from __future__ import annotations

import ast
import json
import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from vertumnus.config import config_from_dict, load_config
from vertumnus.engines.vllm.metrics import VllmCollector
from vertumnus.serving.hosting import NodePlacement
from vertumnus.serving.metrics import ServingMetrics, WorkerRow
from vertumnus.serving.ray_placement import PlacementCollector

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"

# KubeRay v1.3, ray.io/v1
RAYSERVICE = {"apiVersion", "kind", "metadata", "spec"}
RAYSERVICE_SPEC = {
    "serviceUnhealthySecondThreshold",
    "deploymentUnhealthySecondThreshold",
    "serveService",
    "upgradeStrategy",
    "serveConfigV2",
    "rayClusterConfig",
    "excludeHeadPodFromServeSvc",
}
RAYCLUSTER_SPEC = {
    "suspend",
    "managedBy",
    "autoscalerOptions",
    "headServiceAnnotations",
    "enableInTreeAutoscaling",
    "gcsFaultToleranceOptions",
    "headGroupSpec",
    "rayVersion",
    "workerGroupSpecs",
}
HEAD_GROUP = {"template", "headService", "enableIngress", "rayStartParams", "serviceType"}
WORKER_GROUP = {
    "suspend",
    "groupName",
    "replicas",
    "minReplicas",
    "maxReplicas",
    "idleTimeoutSeconds",
    "rayStartParams",
    "template",
    "scaleStrategy",
    "numOfHosts",
}
# Kubernetes core v1 (the subset a pod template here may use)
POD_TEMPLATE = {"metadata", "spec"}
POD_SPEC = {
    "containers",
    "initContainers",
    "volumes",
    "nodeSelector",
    "tolerations",
    "affinity",
    "serviceAccountName",
    "securityContext",
    "imagePullSecrets",
    "priorityClassName",
    "terminationGracePeriodSeconds",
}
CONTAINER = {
    "name",
    "image",
    "imagePullPolicy",
    "command",
    "args",
    "env",
    "envFrom",
    "ports",
    "resources",
    "volumeMounts",
    "lifecycle",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "securityContext",
    "workingDir",
}
# Ray Serve config file (serveConfigV2)
SERVE_TOP = {"proxy_location", "http_options", "grpc_options", "logging_config", "applications"}
SERVE_APP = {
    "name",
    "route_prefix",
    "import_path",
    "runtime_env",
    "deployments",
    "args",
    "logging_config",
    "external_scaler_enabled",
}


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d is not None]


def _keys(obj: dict[str, Any], allowed: set[str], where: str) -> None:
    extra = set(obj) - allowed
    assert not extra, f"{where}: keys not in the CRD / schema: {sorted(extra)}"


def _pod(template: dict[str, Any], where: str) -> list[dict[str, Any]]:
    _keys(template, POD_TEMPLATE, where)
    spec = template["spec"]
    _keys(spec, POD_SPEC, f"{where}.spec")
    for c in spec["containers"]:
        _keys(c, CONTAINER, f"{where}.spec.containers[{c['name']}]")
    return spec["containers"]  # type: ignore[no-any-return]


def _gpus(containers: list[dict[str, Any]]) -> int:
    return sum(int(c["resources"]["limits"].get("nvidia.com/gpu", 0)) for c in containers)


def _start_resources(group: dict[str, Any]) -> dict[str, float]:
    """The custom resources a group's ``rayStartParams.resources`` declares (``'"{\\"name\\": 1}"'``)."""
    text = group["rayStartParams"].get("resources")
    if text is None:
        return {}
    assert text.startswith('"') and text.endswith('"'), text
    return dict(json.loads(text[1:-1].replace('\\"', '"')))


def test_rayservice_uses_only_crd_keys_and_matches_the_config() -> None:
    (svc,) = _docs("rayservice.yaml")
    _keys(svc, RAYSERVICE, "RayService")
    assert svc["apiVersion"] == "ray.io/v1" and svc["kind"] == "RayService"
    spec = svc["spec"]
    _keys(spec, RAYSERVICE_SPEC, "spec")
    rc = spec["rayClusterConfig"]
    _keys(rc, RAYCLUSTER_SPEC, "spec.rayClusterConfig")
    head = rc["headGroupSpec"]
    _keys(head, HEAD_GROUP, "headGroupSpec")
    assert all(isinstance(v, str) for v in head["rayStartParams"].values())  # map[string]string
    _pod(head["template"], "headGroupSpec.template")
    groups = {g["groupName"]: g for g in rc["workerGroupSpecs"]}
    for name, g in groups.items():
        _keys(g, WORKER_GROUP, f"workerGroupSpecs[{name}]")
        assert all(isinstance(v, str) for v in g["rayStartParams"].values())
        _pod(g["template"], f"workerGroupSpecs[{name}].template")
    # the pool's shape: one prefill pod per node with gpus_per_node GPUs, decode GPUs for the decode actors
    cfg = load_config(REPO / "configs" / "h200x8-example.yaml")
    prefill = groups["prefill-h200x8"]
    assert prefill["replicas"] == cfg.pool.nodes
    assert _gpus(prefill["template"]["spec"]["containers"]) == cfg.pool.gpus_per_node
    assert _gpus(groups["decode-h200"]["template"]["spec"]["containers"]) >= cfg.serving.decode_actors
    # pool node ↔ prefill pod: every prefill pod offers one unit of serving.ray_node_resource, no other pod any
    # (KubeRay passes rayStartParams.resources to `ray start --resources` as written: a quoted JSON object)
    marker = cfg.serving.ray_node_resource
    assert marker
    assert _start_resources(prefill) == {marker: 1}
    assert marker not in _start_resources(groups["decode-h200"]) and marker not in _start_resources(head)
    # image built from the Ray version the cluster declares
    assert f"rayproject/ray:{rc['rayVersion']}-" in (DEPLOY / "Dockerfile").read_text()


def test_serve_config_points_at_the_entry_point_and_the_mounted_config() -> None:
    (svc,) = _docs("rayservice.yaml")
    serve = yaml.safe_load(svc["spec"]["serveConfigV2"])
    _keys(serve, SERVE_TOP, "serveConfigV2")
    (app,) = serve["applications"]
    _keys(app, SERVE_APP, "serveConfigV2.applications[0]")
    module, attr = app["import_path"].split(":")
    tree = ast.parse((REPO / Path(*module.split("."))).with_suffix(".py").read_text())
    assert attr in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    mounts = {
        m["mountPath"]: m["name"]
        for m in svc["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    }
    path = Path(app["args"]["config"])
    assert mounts[str(path.parent)] == "vertumnus-config"
    (cm,) = _docs("configmap.yaml")
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["name"] == "vertumnus-config"
    assert path.name in cm["data"]


def test_configmap_config_is_valid_and_equals_the_example_config() -> None:
    (cm,) = _docs("configmap.yaml")
    shipped = config_from_dict(yaml.safe_load(cm["data"]["config.yaml"]), "deploy/configmap.yaml")
    assert shipped == load_config(REPO / "configs" / "h200x8-example.yaml")
    assert shipped.pool.engine == "torch" and shipped.serving.device == "cuda"


def test_prometheus_scrape_config() -> None:
    (prom,) = _docs("prometheus.yaml")
    assert set(prom) <= {"global", "scrape_configs", "rule_files", "alerting"}
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    for j in jobs.values():
        assert j["metrics_path"] == "/metrics"
        assert set(j) <= {
            "job_name",
            "metrics_path",
            "scrape_interval",
            "scheme",
            "static_configs",
            "kubernetes_sd_configs",
            "relabel_configs",
        }
    keep = [r["regex"] for r in jobs["vertumnus"]["relabel_configs"] if r.get("action") == "keep"]
    assert "vertumnus-serve-svc" in keep  # KubeRay's serve Service of the RayService named "vertumnus"


def _exported_metric_names() -> set[str]:
    """Every name a server exports: its own metrics plus the vLLM backend's (registered with pool.engine vllm)."""
    m = ServingMetrics(lambda: [WorkerRow(0, "torch", 2, 0, (0, 1), "active", 1, 0.0, 0)], [1, 2, 4])
    plane = SimpleNamespace(feeds=[SimpleNamespace(counters=Counter(stored=1))], counters=Counter(),
                            engine_start_s=[1.0], restarts=[])  # fmt: skip
    m.registry.register(VllmCollector(plane))  # type: ignore[arg-type]
    # and the torch engine's on Ray: where each pool node is
    m.registry.register(PlacementCollector(SimpleNamespace(placements=[NodePlacement(0, "id", "CREATED")])))  # type: ignore[arg-type]
    names: set[str] = set()
    for fam in m.registry.collect():
        names.add(fam.name)
        names.update(s.name for s in fam.samples)
    return names


def test_dashboard_and_docs_name_only_exported_metrics() -> None:
    exported = _exported_metric_names()
    dash = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {n for e in exprs for n in re.findall(r"\bvertumnus_[a-z_]+", e)}
    assert used and used <= exported, sorted(used - exported)
    documented = set(re.findall(r"`(vertumnus_[a-z_]+)`", (REPO / "docs" / "metrics.md").read_text()))
    assert documented <= exported, sorted(documented - exported)
    required = {
        "vertumnus_requests_total",
        "vertumnus_ttft_seconds",
        "vertumnus_prefill_seconds",
        "vertumnus_queue_workload_seconds",
        "vertumnus_prefix_cached_tokens_total",
        "vertumnus_prompt_tokens_total",
        "vertumnus_workers",
        "vertumnus_reconfigurations_total",
        "vertumnus_reconfiguration_seconds",
        "vertumnus_cache_ops_total",
        "vertumnus_slo_attained_tokens_total",
    }
    assert required <= exported and required <= documented


def test_ingress_health_check_is_the_apps_ready_route_on_the_serve_service() -> None:
    """deploy/ingress.yaml: the load balancer (not the head pod) uses GET /ready, on the Serve service and port
    the RayService exposes (http_options.port of its serveConfigV2)."""
    (ing,) = _docs("ingress.yaml")
    (svc,) = _docs("rayservice.yaml")
    assert ing["apiVersion"] == "networking.k8s.io/v1" and ing["kind"] == "Ingress"
    ann = ing["metadata"]["annotations"]
    assert ann["alb.ingress.kubernetes.io/healthcheck-path"] == "/ready"
    assert ann["alb.ingress.kubernetes.io/success-codes"] == "200"
    (rule,) = ing["spec"]["rules"]
    (path,) = rule["http"]["paths"]
    backend = path["backend"]["service"]
    assert backend["name"] == f"{svc['metadata']['name']}-serve-svc"  # KubeRay's name for the Serve service
    assert backend["port"]["number"] == yaml.safe_load(svc["spec"]["serveConfigV2"])["http_options"]["port"]
    head = svc["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert "readinessProbe" not in head  # an unready head pod would cut the workers off the GCS
