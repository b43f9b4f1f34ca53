"""Validating rendered manifests offline, as the API server would on `kubectl apply`.

Core kinds go to `kubernetes-validate` (Kubernetes' own OpenAPI schemas, strict: unknown fields fail).
Custom resources go to their CRD's `openAPIV3Schema` with `jsonschema`, after the steps the API server
takes first: `default:` values filled in and `null` dropped where a field is not nullable. The schema is
translated from Kubernetes' structural dialect: `x-kubernetes-int-or-string` becomes a type union,
`nullable` a "null" type, and objects with declared properties reject unknown fields (what kubectl's
default --validate=strict does; the server would otherwise prune them silently). CEL rules are not run.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

DATA = Path(__file__).resolve().parent / "data"
KUBE_VERSION = "1.30"
CRDS = {
    ("ray.io/v1", "RayService"): "ray.io_rayservices.yaml",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_servicemonitors.yaml",
}
_DROPPED = ("description", "format", "nullable")


@functools.cache
def crd_schema(api_version: str, kind: str) -> dict:
    crd = yaml.safe_load((DATA / CRDS[(api_version, kind)]).read_text())
    version = api_version.split("/")[1]
    return next(v for v in crd["spec"]["versions"] if v["name"] == version)["schema"]["openAPIV3Schema"]


def to_json_schema(node):
    """The structural schema `node` as plain JSON Schema (see the module docstring)."""
    if isinstance(node, list):
        return [to_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in ("properties", "patternProperties"):
            out[key] = {name: to_json_schema(sub) for name, sub in value.items()}
        elif key.startswith("x-kubernetes-") or key in _DROPPED:
            continue
        else:
            out[key] = to_json_schema(value)
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    keeps_unknown = node.get("x-kubernetes-preserve-unknown-fields") or node.get(
        "x-kubernetes-embedded-resource"
    )
    if node.get("type") == "object" and "properties" in node and not keeps_unknown:
        out.setdefault("additionalProperties", False)
    return out


def admit(schema: dict, value):
    """What the API server stores before validating: defaults filled in, non-nullable nulls dropped."""
    if isinstance(value, dict) and schema.get("type") == "object":
        for name, sub in (schema.get("properties") or {}).items():
            if name in value and value[name] is None and not sub.get("nullable"):
                del value[name]
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                admit(sub, value[name])
        if isinstance(schema.get("additionalProperties"), dict):
            for item in value.values():
                admit(schema["additionalProperties"], item)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            admit(schema["items"], item)
    return value


def crd_errors(obj: dict) -> list[str]:
    """'path: message' for every way `obj` breaks its CRD's schema."""
    schema = crd_schema(obj["apiVersion"], obj["kind"])
    validator = jsonschema.Draft202012Validator(to_json_schema(schema))
    admitted = admit(schema, copy.deepcopy(obj))
    return [
        f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in sorted(validator.iter_errors(admitted), key=lambda e: list(map(str, e.absolute_path)))
    ]


def core_errors(obj: dict) -> list[str]:
    """The first way `obj` breaks Kubernetes' own schema for its kind (strict), or nothing."""
    try:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{obj['kind']} {'.'.join(map(str, e.path)) or '<root>'}: {e.message}"]
    return []


def errors(obj: dict) -> list[str]:
    if (obj["apiVersion"], obj["kind"]) in CRDS:
        return crd_errors(obj)
    return core_errors(obj)


def embedded_core_objects(rayservice: dict) -> list[dict]:
    """The core objects a RayService carries (pod templates, the serve Service), to check them too."""
    cluster = rayservice["spec"]["rayClusterConfig"]
    groups = [cluster["headGroupSpec"], *cluster.get("workerGroupSpecs", [])]
    found = [
        {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": g["template"]}
        for g in groups
    ]
    if service := rayservice["spec"].get("serveService"):
        found.append({"apiVersion": "v1", "kind": "Service", **service})
    return found


def kuberay_errors(rayservice: dict) -> list[str]:
    """Rules the KubeRay operator enforces that its CRD schema does not (utils/validation.go)."""
    found = []
    name = rayservice["metadata"]["name"]
    if len(name) > 47:
        found.append(f"metadata.name: {name!r} is longer than 47 characters")
    spec = rayservice["spec"]
    strategy = spec.get("upgradeStrategy", {}).get("type", "NewCluster")
    if strategy not in ("NewCluster", "NewClusterWithIncrementalUpgrade", "None"):
        found.append(f"spec.upgradeStrategy.type: {strategy!r} is not a RayService upgrade type")
    cluster = spec["rayClusterConfig"]
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    if not any(p.get("name") == "serve" or p.get("name", "").startswith("serve-") for p in head["ports"]):
        found.append("head container: no port named 'serve' or 'serve-*' for the serve Service")
    for group in cluster.get("workerGroupSpecs", []):
        low, high = group["minReplicas"], group["maxReplicas"]
        if not 0 <= low <= group.get("replicas", low) <= high:
            found.append(f"worker group {group['groupName']}: replicas outside [minReplicas, maxReplicas]")
    return found
