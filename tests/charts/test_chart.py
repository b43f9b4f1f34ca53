"""charts/dspark rendered by real Helm (its Go SDK) for every values profile, checked as a cluster would:
the RayService against KubeRay's CRD, core kinds against Kubernetes' schemas, the serveConfigV2 against
Ray Serve's schema and against the application builder itself."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import helm_python as helm
import pytest
import yaml
from manifests import embedded_core_objects, errors, kuberay_errors
from ray.serve.schema import ServeDeploySchema
from sglang_cpu import install_torchvision_stand_in

from deployments.app import GRPC_SERVICERS, PROXY_ENV, build_app, controller_export_env
from deployments.config import AppConfig
from scripts.chart import CHART, lint, manifests, profiles
from tests.drafter_service.drafter_fixtures import save_untrained_dspark

REPO = Path(__file__).resolve().parents[2]
PROFILES = profiles()


def of_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def rayservice(values: dict) -> dict:
    (rs,) = of_kind(manifests(values), "RayService")
    return rs


def serve_config(values: dict) -> dict:
    return yaml.safe_load(rayservice(values)["spec"]["serveConfigV2"])


def replacing(defaults: dict, new: dict) -> dict:
    """Values that replace the map `defaults` by `new` (Helm merges maps; a null removes a default key)."""
    out = {key: None for key in defaults if key not in new}
    for key, value in new.items():
        nested = isinstance(value, dict) and isinstance(defaults.get(key), dict)
        out[key] = replacing(defaults[key], value) if nested else value
    return out


@pytest.mark.parametrize("profile", PROFILES)
def test_lint_is_clean(profile):
    assert lint(PROFILES[profile]) == []


@pytest.mark.parametrize("profile", PROFILES)
def test_every_manifest_validates(profile):
    docs = manifests(PROFILES[profile])
    assert len(of_kind(docs, "RayService")) == 1
    for doc in docs:
        assert errors(doc) == [], doc["kind"]
    rs = rayservice(PROFILES[profile])
    assert kuberay_errors(rs) == []
    for obj in embedded_core_objects(rs):
        assert errors(obj) == [], obj["kind"]


@pytest.mark.parametrize("profile", PROFILES)
def test_serve_config_builds_the_app(profile, qwen3_dir, tmp_path):
    """The chart and the code agree: Serve accepts the rendered config, build_app accepts its args."""
    config = serve_config(PROFILES[profile])
    schema = ServeDeploySchema.model_validate(config)
    assert list(schema.grpc_options.grpc_servicer_functions) == GRPC_SERVICERS
    assert (schema.http_options.port, schema.grpc_options.port) == (8000, 9000)
    (app,) = config["applications"]
    assert app["import_path"] == "deployments.app:build_app"
    args = AppConfig(**app["args"])
    # The checkpoint lives in the cluster; the test model stands in for it (nothing else changes).
    update = {"model": str(qwen3_dir)}
    if args.backend == "sglang":  # SGLang's own resolution (build_app runs it) reads the drafter's config
        install_torchvision_stand_in()  # where sglang is installed for the CPU tests (tests/sglang_cpu.py)
        drafter = save_untrained_dspark(qwen3_dir, tmp_path / "dspark", gamma=7)
        update["engine"] = args.engine | {"drafter_model": str(drafter)}
    assert build_app(args.model_copy(update=update)) is not None


def test_local_config_round_trips_through_the_chart():
    """One description of the app: configs/local.yaml's args as chart values render configs/local.yaml."""
    local = yaml.safe_load((REPO / "configs" / "local.yaml").read_text())
    (app,) = local["applications"]
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    values = {"app": {"args": replacing(defaults["app"]["args"], app["args"])}, "workers": {"gpusPerNode": 0}}
    assert serve_config(values) == local


@pytest.mark.parametrize(
    ("gpus", "tp", "counts", "autoscaler", "pods"),
    [
        (8, 2, {"num_replicas": 6}, False, (2, 2, 2)),  # 4 replicas per pod
        (8, 8, {"num_replicas": 3}, False, (3, 3, 3)),
        (4, 2, {"autoscaling_config": {"min_replicas": 1, "max_replicas": 5}}, True, (1, 1, 3)),
        (4, 2, {"autoscaling_config": {"min_replicas": 1, "max_replicas": 5}}, False, (3, 3, 3)),
        (1, 1, {"autoscaling_config": {"min_replicas": 0, "max_replicas": 4}}, True, (0, 0, 4)),
        (
            2,
            1,
            {"autoscaling_config": {"min_replicas": 2, "initial_replicas": 3, "max_replicas": 6}},
            True,
            (2, 1, 3),
        ),
    ],
)
def test_worker_group_follows_tp_and_replicas(gpus, tp, counts, autoscaler, pods):
    values = {
        "app": {"args": {"tensor_parallel_size": tp, **counts}},
        "workers": {"gpusPerNode": gpus},
        "autoscaler": {"enabled": autoscaler},
    }
    cluster = rayservice(values)["spec"]["rayClusterConfig"]
    (group,) = cluster["workerGroupSpecs"]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == pods
    worker = group["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == str(gpus)
    assert {"name": "dshm", "mountPath": "/dev/shm"} in worker["volumeMounts"]
    assert cluster["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"
    assert cluster["enableInTreeAutoscaling"] is autoscaler


def test_cpu_workers_hold_the_configured_replicas():
    values = {
        "app": {"args": {"num_replicas": 5, "engine": {"device": "cpu"}}},
        "workers": {"gpusPerNode": 0, "cpuReplicasPerNode": 2},
    }
    (group,) = rayservice(values)["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (3, 3, 3)
    assert "nvidia.com/gpu" not in group["template"]["spec"]["containers"][0]["resources"]["limits"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"app": {"args": {"tensor_parallel_size": 3}}, "workers": {"gpusPerNode": 4}},
            "at '/app/args/tensor_parallel_size': value must be one of 1, 2, 4",
        ),
        ({"workers": {"gpusPerNode": 3}}, "at '/workers/gpusPerNode': value must be one of 0, 1, 2, 4, 8"),
        (
            {"app": {"args": {"engine": {"device": "cpu"}}}},
            "at '/app/args/engine/device': 'cpu' does not match",
        ),
        ({"workers": {"gpusPerNode": 0}}, "at '/app/args/engine/device': value must be 'cpu'"),
        (
            {"app": {"args": {"num_replicas": 2, "autoscaling_config": {"max_replicas": 3}}}},
            "at '/app/args/num_replicas': got number, want null",
        ),
        ({"upgradeStrategy": {"type": "Bogus"}}, "at '/upgradeStrategy/type': value must be one of"),
        (
            {"upgradeStrategy": {"type": "NewClusterWithIncrementalUpgrade"}},
            "at '/autoscaler/enabled': value must be true",
        ),
        ({"models": {"source": "init"}}, "at '/models/init/image': minLength"),
        ({"telemetry": {"otlpEndpoint": "collector:4317"}}, "at '/telemetry/otlpEndpoint'"),
        ({"app": {"args": {"api_keys": ["secret"]}}}, "at '/app/args/api_keys': maxItems"),
        ({"worker": {"gpusPerNode": 2}}, "additional properties 'worker' not allowed"),
        ({"fullnameOverride": "x" * 48}, "at '/fullnameOverride': maxLength"),
    ],
)
def test_values_schema_rejects_bad_values(values, message):
    with pytest.raises(helm.HelmValuesError) as caught:
        manifests(values)
    assert message in str(caught.value)
    assert any(message in line for line in lint(values)), "helm lint reports it too"


def test_api_keys_come_from_a_secret():
    def wiring(values):
        docs = manifests(values)
        rs = of_kind(docs, "RayService")[0]
        pod = rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        args = yaml.safe_load(rs["spec"]["serveConfigV2"])["applications"][0]["args"]
        return of_kind(docs, "Secret"), volumes.get("api-keys"), args.get("api_keys_file")

    assert wiring({}) == ([], None, None)  # open, as locally without api_keys
    secrets, volume, path = wiring({"apiKeys": {"existingSecret": "team-keys"}})
    assert secrets == [] and volume["secret"]["secretName"] == "team-keys"
    assert path == "/etc/dspark/api-keys/api-keys"
    (secret,), volume, _ = wiring({"apiKeys": {"keys": ["k1", "k2"]}})
    assert secret["stringData"]["api-keys"].split() == ["k1", "k2"]
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]


def test_telemetry_reaches_the_app_as_otel_variables():
    assert "runtime_env" not in serve_config({})["applications"][0]
    values = {"telemetry": {"otlpEndpoint": "http://collector:4317", "samplerArg": "0.25"}}
    assert serve_config(values)["applications"][0]["runtime_env"] == {
        "env_vars": {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_SERVICE_NAME": "dspark",
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.25",
        }
    }


def test_router_controller_and_extra_args_pass_through():
    values = {
        "router": {"policy": "slack"},
        "controller": {"period_s": 2},
        "app": {"extraArgs": {"stuck_after_s": 45, "engine": {"seed": 7}}},
    }
    args = serve_config(values)["applications"][0]["args"]
    assert args["router"] == {"policy": "slack"} and args["controller"] == {"period_s": 2}
    assert args["stuck_after_s"] == 45
    assert args["engine"]["seed"] == 7 and args["engine"]["drafter"] == "dspark"  # merged, not replaced
    assert "router" not in serve_config({})["applications"][0]["args"]


def test_the_controllers_otlp_receiver_gets_a_service_the_replicas_export_to(qwen3_dir):
    """With otlp_port the controller is pinned to the head pod (a Ray resource only the head offers),
    a Service selects exactly the head pod on the receiver's ports, and the app's args point the
    replicas at the Service's name (what build_app hands them as OTEL_EXPORTER_OTLP_ENDPOINT)."""
    assert of_kind(manifests({"controller": {"period_s": 2}}), "Service") == []  # no receiver: no Service
    values = {"controller": {"period_s": 2, "otlp_port": 4317, "otlp_http_port": 4318}}
    docs = manifests(values)
    (service,) = of_kind(docs, "Service")
    assert errors(service) == []
    assert service["metadata"]["name"] == "dspark-controller"
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert {n: (p["port"], p["targetPort"]) for n, p in ports.items()} == {
        "otlp-grpc": (4317, "otlp-grpc"),
        "otlp-http": (4318, "otlp-http"),
    }
    assert ports["otlp-grpc"]["appProtocol"] == "kubernetes.io/h2c"
    cluster = of_kind(docs, "RayService")[0]["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]
    worker = cluster["workerGroupSpecs"][0]["template"]
    selector = service["spec"]["selector"].items()
    assert selector <= head["template"]["metadata"]["labels"].items()
    assert not selector <= worker["metadata"]["labels"].items()  # the receiver runs on the head only
    container = head["template"]["spec"]["containers"][0]
    assert {(p["name"], p["containerPort"]) for p in container["ports"]} >= {
        ("otlp-grpc", 4317),
        ("otlp-http", 4318),
    }
    # `ray start --resources=...` in a shell: the JSON quoted once more.
    assert head["rayStartParams"]["resources"] == '"{\\"dspark_controller\\": 1}"'
    assert "resources" not in cluster["workerGroupSpecs"][0]["rayStartParams"]

    args = AppConfig(**serve_config(values)["applications"][0]["args"])
    host = "dspark-controller.dspark.svc"
    assert (args.controller.otlp_host, args.controller.resources) == (host, {"dspark_controller": 1.0})
    assert controller_export_env(args)["OTEL_EXPORTER_OTLP_ENDPOINT"] == f"http://{host}:4317"
    app = build_app(args.model_copy(update={"model": str(qwen3_dir)}))
    # The bound Controller deployment asks for the resource (Serve's Application keeps its bind args).
    (controller,) = [
        a._bound_deployment
        for a in app._bound_deployment.init_args
        if hasattr(a, "_bound_deployment") and a._bound_deployment.name == "Controller"
    ]
    assert controller.ray_actor_options["resources"] == {"dspark_controller": 1.0}

    # A Collector of yours: the replicas keep exporting to it; it fans out to the controller's Service.
    collector = {**values, "telemetry": {"otlpEndpoint": "http://collector:4317"}}
    args = AppConfig(**serve_config(collector)["applications"][0]["args"])
    assert args.telemetry.otlp_endpoint == "http://collector:4317" and controller_export_env(args) == {}
    # Over OTLP/HTTP, and with a host of your own.
    own = {
        "controller": {**values["controller"], "otlp_protocol": "http/protobuf", "otlp_host": "ctl.example"}
    }
    args = AppConfig(**serve_config(own)["applications"][0]["args"])
    assert controller_export_env(args)["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://ctl.example:4318"


def test_upgrade_default_needs_no_second_set_of_gpus():
    spec = rayservice({})["spec"]
    assert spec["upgradeStrategy"] == {"type": "None"}
    options = {
        "gatewayClassName": "istio",
        "stepSizePercent": 25,
        "intervalSeconds": 60,
        "maxSurgePercent": 25,
    }
    values = {
        "upgradeStrategy": {"type": "NewClusterWithIncrementalUpgrade", "clusterUpgradeOptions": options},
        "autoscaler": {"enabled": True},
    }
    assert rayservice(values)["spec"]["upgradeStrategy"] == {
        "type": "NewClusterWithIncrementalUpgrade",
        "clusterUpgradeOptions": options,
    }


def test_serve_service_exposes_http_and_grpc():
    rs = rayservice({})
    service = rs["spec"]["serveService"]
    assert {(p["name"], p["port"]) for p in service["spec"]["ports"]} == {
        ("serve", 8000),
        ("serve-grpc", 9000),
    }
    head = rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    # KubeRay keeps only serve ports the head declares under the same names.
    assert {"serve", "serve-grpc"} <= {p["name"] for p in head["ports"]}


def test_serve_proxies_get_the_streaming_path_flags():
    """The proxies' environment is the container's: it carries what `make serve` passes to ray.init."""
    cluster = rayservice({})["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    (worker,) = cluster["workerGroupSpecs"][0]["template"]["spec"]["containers"]
    for container in (head, worker):
        assert PROXY_ENV.items() <= {e["name"]: e.get("value") for e in container["env"]}.items()


def test_monitoring_objects():
    assert of_kind(manifests({}), "ServiceMonitor") == []
    values = {"metrics": {"serviceMonitor": {"enabled": True}, "grafanaDashboard": {"enabled": True}}}
    docs = manifests(values)
    (monitor,), (service,) = of_kind(docs, "ServiceMonitor"), of_kind(docs, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"] == "metrics"
    pod_labels = rayservice(values)["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["metadata"][
        "labels"
    ]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (dashboard,) = of_kind(docs, "ConfigMap")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((CHART / "dashboards" / "dspark.json").read_text())
    assert json.loads(dashboard["data"]["dspark.json"]) == shipped
    assert all(t["expr"] for panel in shipped["panels"] for t in panel.get("targets", []))


@pytest.mark.parametrize(
    "workers, args, ports",
    [
        ({"gpusPerNode": 1}, {}, [9464]),
        ({"gpusPerNode": 4}, {"tensor_parallel_size": 2}, [9464, 9465]),
        ({"gpusPerNode": 0, "cpuReplicasPerNode": 3}, {"engine": {"device": "cpu"}}, [9464, 9465, 9466]),
    ],
)
def test_target_replicas_metrics_are_scraped(workers, args, ports):
    """Each target replica's own /metrics (what the dashboard reads): DSPARK_PROMETHEUS_PORT on every
    Ray container, one named port per replica a worker pod holds, each in the Service and scraped."""
    values = {"workers": workers, "app": {"args": args}, "metrics": {"serviceMonitor": {"enabled": True}}}
    docs = manifests(values)
    cluster = rayservice(values)["spec"]["rayClusterConfig"]
    (worker,) = cluster["workerGroupSpecs"][0]["template"]["spec"]["containers"]
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    for container in (head, worker):
        assert {"name": "DSPARK_PROMETHEUS_PORT", "value": "9464"} in container["env"]
    names = [f"replica-m{i}" for i in range(len(ports))]
    assert [(p["name"], p["containerPort"]) for p in worker["ports"]] == list(zip(names, ports))
    (service,), (monitor,) = of_kind(docs, "Service"), of_kind(docs, "ServiceMonitor")
    assert [(p["name"], p["port"]) for p in service["spec"]["ports"]] == [
        ("metrics", 8080),
        *zip(names, ports),
    ]
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics", *names]

    off = manifests({"metrics": {"replicaPort": 0, "serviceMonitor": {"enabled": True}}})
    (worker,) = of_kind(off, "RayService")[0]["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"][
        "spec"
    ]["containers"]
    assert "ports" not in worker and all(e["name"] != "DSPARK_PROMETHEUS_PORT" for e in worker["env"])
    assert [e["port"] for e in of_kind(off, "ServiceMonitor")[0]["spec"]["endpoints"]] == ["metrics"]


def test_manifest_checks_catch_mistakes():
    """The validators above can fail: a few broken RayServices, each named for what is wrong."""
    rs = rayservice({})
    cases = {
        "spec.serveConfigV2": lambda r: r["spec"].__setitem__("serveConfigV2", {"applications": []}),
        "rayStartParams.num-gpus": lambda r: r["spec"]["rayClusterConfig"]["headGroupSpec"][
            "rayStartParams"
        ].__setitem__("num-gpus", 0),
        "enableInTreeAutoscalling": lambda r: r["spec"]["rayClusterConfig"].__setitem__(
            "enableInTreeAutoscalling", True
        ),
    }
    for expected, breaks in cases.items():
        broken = copy.deepcopy(rs)
        breaks(broken)
        assert any(expected in e for e in errors(broken)), expected
    broken = copy.deepcopy(rs)
    broken["spec"]["upgradeStrategy"]["type"] = "Bogus"
    assert errors(broken) == []  # the CRD has no enum here; the operator's own rule catches it
    assert kuberay_errors(broken) == ["spec.upgradeStrategy.type: 'Bogus' is not a RayService upgrade type"]
    (pod_template, *_) = embedded_core_objects(rs)
    pod_template["template"]["spec"]["containers"][0]["imagee"] = "typo"
    assert errors(pod_template) and "imagee" in errors(pod_template)[0]
