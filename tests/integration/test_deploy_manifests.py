"""The deployment files validate offline: docker-compose.yml, the Dockerfile, and the Helm chart.

* Compose: the Compose Specification JSON schema vendored in ``deploy/schemas/compose-spec.json``
  (see ``deploy/schemas/README.md``), plus what a schema cannot know: ``depends_on`` targets exist and
  can satisfy their condition, and the healer services' environment builds real
  :class:`healer.config.Settings`.
* Kubernetes: the chart in deploy/chart/healer rendered by the real ``helm template`` (helm built
  from its Go module by deploy/scripts/build-helm.sh) with default values and with the example of an
  acting install, ``helm lint --strict``, every object validated against the Kubernetes OpenAPI
  schemas bundled by ``kubernetes-validate`` (strict: unknown fields fail), then the properties we
  promise: least-privilege RBAC covering every call the adapter makes, 2 replicas with probes and a
  non-root, read-only security context, secrets only by reference, the rule pack in sync with rules/.
  Without helm these skip with one line, unless ``HEALER_REQUIRE_KUBE=1``.

No network, no container engine, no cluster.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import typer
import yaml

import healer
from healer import cli as healer_cli
from healer.config import Settings, load_settings
from healer.controller.repair import xid_catalog as xid_catalog_of
from healer.errors import ConfigError
from healer.ruleset.loading import load_ruleset
from healer.store import migrate
from healer.tickets.coverage import refuse_acting_without_providers
from healer_dev.simulator.scenario import load_scenario
from tests.helm import CHART, IMAGE, NAMESPACE, documents, require_helm, run_helm, template
from tests.service_skips import require_binary

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
EMULATED_CLUSTER_WRAPPER = DEPLOY / "compose" / "healer_with_emulated_cluster.py"

#: Oldest Kubernetes minor we promise the manifests for, and the newest the schemas know.
K8S_VERSIONS = ("1.29", kubernetes_validate.utils.latest_version())

#: (apiGroup, resource, verb) the ClusterRole grants: exactly what the Kubernetes adapter calls.
CLUSTER_PERMISSIONS = {
    *(("", "nodes", verb) for verb in ("get", "list", "watch", "patch")),
    ("", "nodes/status", "patch"),
    ("", "pods", "get"),
    ("", "pods", "list"),
    ("", "pods", "watch"),  # the drain's pod store (healer/actions/pod_watch.py)
    ("", "pods", "delete"),  # drain's delete_after_timeout
    ("", "pods", "patch"),  # drain's checkpoint request (pod annotations)
    ("", "pods/eviction", "create"),
    ("", "events", "create"),
    ("events.k8s.io", "events", "create"),
    ("policy", "poddisruptionbudgets", "list"),
    ("policy", "poddisruptionbudgets", "watch"),  # a drain waits on the budgets it is held by
    *(("kueue.x-k8s.io", "clusterqueues", verb) for verb in ("get", "list", "patch")),  # quota sync
    ("kueue.x-k8s.io", "workloads", "list"),  # capacity rules: Kueue's pending workloads
    *(("resource.k8s.io", "devicetaintrules", verb) for verb in ("list", "create", "delete")),  # GPU out
}
LEASE_PERMISSIONS = {("coordination.k8s.io", "leases", verb) for verb in ("get", "create", "update")}

#: The image's user (Dockerfile ``HEALER_UID``), which the pod's securityContext must name.
HEALER_UID = 10001


# --- helpers ------------------------------------------------------------------------------------


def _interpolate(text: str) -> str:
    """Compose variable interpolation with no variables set: ``${VAR:-default}`` → default."""

    def value(match: re.Match[str]) -> str:
        default = match.group(2)
        if default is None:
            raise AssertionError(f"${{{match.group(1)}}} has no default: compose up would need it set")
        return default

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}", value, text)


def _settings_from_env(env: dict[str, str], monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> Settings:
    """``load_settings`` with exactly ``env`` as the HEALER_ environment (nothing from the test run)."""

    for name in list(os.environ):
        if name.upper().startswith("HEALER_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        if name != "HEALER_CONFIG":
            monkeypatch.setenv(name, value)
    return load_settings(**kwargs)


def _setting_exists(env_name: str) -> bool:
    """Whether ``HEALER_A__B`` names a field path of :class:`Settings` (pydantic-settings silently
    ignores unknown names, so a typo would otherwise go unnoticed)."""
    if env_name == "HEALER_CONFIG":
        return True
    parts = env_name.removeprefix("HEALER_").lower().split("__")
    model: Any = Settings
    for part in parts:
        fields = getattr(model, "model_fields", None)
        if fields is None or part not in fields:
            return False
        model = fields[part].annotation
    return True


def _go_duration(value: object) -> bool:
    return not isinstance(value, str) or bool(re.fullmatch(r"([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+", value))


# --- compose ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(_interpolate(COMPOSE_FILE.read_text(encoding="utf-8")))


@pytest.fixture(scope="module")
def compose_validator() -> jsonschema.protocols.Validator:
    schema = json.loads((DEPLOY / "schemas" / "compose-spec.json").read_text(encoding="utf-8"))
    formats = jsonschema.FormatChecker()
    formats.checks("duration")(_go_duration)
    # The file says ``http://json-schema.org/draft/2019-09/schema#``, not the draft's canonical URI,
    # so name the draft instead of letting jsonschema guess from ``$schema``.
    jsonschema.Draft201909Validator.check_schema(schema)
    return jsonschema.Draft201909Validator(schema, format_checker=formats)


def test_compose_matches_the_compose_specification(
    compose: dict[str, Any], compose_validator: jsonschema.protocols.Validator
) -> None:
    errors = [f"{e.json_path}: {e.message}" for e in compose_validator.iter_errors(compose)]
    assert errors == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("services", "healer", "depends_on", "migrate", "condition"), "service_finished"),
        (("services", "postgres", "healthcheck", "interval"), "5 seconds"),
        (("services", "healer", "restart_policy"), "always"),
        (("services", "healer", "ports"), "8080"),
    ],
)
def test_the_compose_schema_rejects_mistakes(
    compose: dict[str, Any],
    compose_validator: jsonschema.protocols.Validator,
    path: tuple[str, ...],
    value: object,
) -> None:
    broken = json.loads(json.dumps(compose))
    node = broken
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert list(compose_validator.iter_errors(broken))


def test_compose_dependencies_exist_and_can_be_met(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {"prometheus", "postgres", "migrate", "simulator", "provider", "healer"} <= set(services)
    for name, service in services.items():
        for target, spec in (service.get("depends_on") or {}).items():
            assert target in services, f"{name} depends on unknown service {target}"
            condition = spec["condition"]
            if condition == "service_healthy":
                check = services[target].get("healthcheck", {})
                assert check.get("test") and not check.get("disable"), f"{target} has no health check"
            if condition == "service_completed_successfully":
                assert services[target].get("restart") == "no", f"{target} is not a one-shot service"
    healer_deps = services["healer"]["depends_on"]
    assert healer_deps["migrate"]["condition"] == "service_completed_successfully"
    assert healer_deps["prometheus"]["condition"] == "service_healthy"
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("postgres", "prometheus", "simulator", "provider", "healer"):
        assert services[name]["healthcheck"]["test"], name


def _healer_command(args: list[str]) -> Any:
    """Parse ``healer ARGS...`` the way the CLI would, without running it, and return the leaf
    command's context (``.info_name``, ``.params``). An unknown sub-command fails the assertion; an
    unknown option or a bad value raises the CLI's usage error. Duck-typed: typer ships its own click."""
    command: Any = typer.main.get_command(healer_cli.app)
    parent = command.context_class(command, info_name="healer")
    rest = list(args)
    while hasattr(command, "get_command"):
        name, *rest = rest
        command = command.get_command(parent, name)
        assert command is not None, f"`healer {' '.join(args)}`: no sub-command {name!r}"
        parent = command.context_class(command, info_name=name, parent=parent)
    return command.make_context(parent.info_name, rest, parent=parent.parent)


def _healer_args(service: dict[str, Any]) -> list[str]:
    """The ``healer`` arguments a healer-image service runs, seeing through the compose wrapper that
    runs ``healer run`` against the emulated cluster (``WRAPPER [OPTIONS] -- [RUN ARGS]``)."""
    entrypoint = service.get("entrypoint")
    if entrypoint is None:
        return list(service["command"])
    mounts = dict(reversed(v.split(":")[:2]) for v in service["volumes"])
    assert entrypoint[0] == "python"
    script = Path(entrypoint[1])
    assert REPO / mounts[str(script.parent)] / script.name == EMULATED_CLUSTER_WRAPPER
    command = service["command"]
    return ["run", *command[command.index("--") + 1 :]]


def _healer_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose["services"].items() if s.get("image") == "healer:local"}


def test_compose_runs_real_healer_commands(compose: dict[str, Any]) -> None:
    services = _healer_services(compose)
    assert set(services) == {"migrate", "simulator", "provider", "healer"}
    for name, service in services.items():
        ctx = _healer_command(_healer_args(service))
        assert (
            ctx.command.name
            == {
                "migrate": "upgrade",
                "simulator": "simulate",
                "provider": "provider-receiver",
                "healer": "run",
            }[name]
        )
    simulate = _healer_command(services["simulator"]["command"]).params
    load_scenario(simulate["scenario"])
    assert simulate["host"] == "0.0.0.0"
    assert simulate["advertise"] == f"simulator:{simulate['port']}"
    # The emulated cluster holds the nodes the simulator serves metrics for.
    wrapper_options = services["healer"]["command"][: services["healer"]["command"].index("--")]
    assert wrapper_options == ["--nodes", str(simulate["nodes"])]


def test_compose_emulated_cluster_wrapper_imports() -> None:
    # The wrapper uses healer's CLI app and the Kubernetes emulator; importing it checks both exist.
    spec = importlib.util.spec_from_file_location("compose_wrapper", EMULATED_CLUSTER_WRAPPER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert callable(module.main)


def test_compose_healer_environment_is_real_settings(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    services = compose["services"]
    env = {k: str(v) for k, v in services["healer"]["environment"].items()}
    unknown = [n for n in env if n.startswith("HEALER_") and not _setting_exists(n)]
    assert unknown == []
    settings = _settings_from_env(env, monkeypatch)
    # Compose has no Kubernetes: healer may act only on the emulated API inside its container.
    assert settings.safety.dry_run is True or (
        services["healer"]["entrypoint"][1].endswith(EMULATED_CLUSTER_WRAPPER.name)
        and settings.kubernetes.kubeconfig is None
    )
    assert settings.database.url.startswith("postgresql+psycopg://healer:")
    assert settings.database.url.endswith("@postgres:5432/healer")
    assert settings.database.url == services["migrate"]["environment"]["HEALER_DATABASE__URL"]
    assert settings.prometheus.url == "http://prometheus:9090"
    assert settings.api.host == "0.0.0.0"
    assert f"{settings.api.port}:{settings.api.port}" in services["healer"]["ports"][0]
    postgres = services["postgres"]["environment"]
    assert f"{postgres['POSTGRES_USER']}:{postgres['POSTGRES_PASSWORD']}@" in settings.database.url
    # Tickets go to the stand-in provider, signed with the secret it verifies, and its callbacks are
    # signed with the secret healer checks.
    receiver = _healer_command(services["provider"]["command"]).params
    (provider,) = settings.tickets.providers
    assert provider.url.startswith(f"http://provider:{receiver['port']}/")
    provider_env = services["provider"]["environment"]
    assert provider.secret_env == receiver["secret_env"]
    assert env[provider.secret_env] == provider_env[receiver["secret_env"]]
    assert settings.tickets.callback_secret_env == receiver["callback_secret_env"]
    assert env[receiver["callback_secret_env"]] == provider_env[receiver["callback_secret_env"]]
    assert receiver["callback_url"] == f"http://healer:{settings.api.port}"
    assert _providers_the_rules_use() <= {p.name for p in settings.tickets.providers}


def _providers_the_rules_use() -> set[str]:
    """Provider names in the rule pack's ``ticket: {provider: NAME}`` actions."""
    found: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            ticket = node.get("ticket")
            if isinstance(ticket, dict) and "provider" in ticket:
                found.add(str(ticket["provider"]))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for path in sorted((REPO / "rules").glob("*.y*ml")):
        walk(yaml.safe_load(path.read_text(encoding="utf-8")))
    return found


def test_compose_prometheus_scrapes_the_simulator(compose: dict[str, Any]) -> None:
    services = compose["services"]
    config_path = next(
        v.split(":")[0] for v in services["prometheus"]["volumes"] if v.endswith("prometheus.yml:ro")
    )
    config = yaml.safe_load((REPO / config_path).read_text(encoding="utf-8"))
    targets = {
        t for job in config["scrape_configs"] for sc in job.get("static_configs", []) for t in sc["targets"]
    }
    http_sd = [sd["url"] for job in config["scrape_configs"] for sd in job.get("http_sd_configs", [])]
    simulate = _healer_command(services["simulator"]["command"]).params
    assert http_sd == [f"http://simulator:{simulate['port']}/targets"]
    for target in targets:
        host = target.split(":")[0]
        assert host in services or host in {"127.0.0.1", "localhost"}, target


def test_compose_prometheus_config_passes_promtool() -> None:
    promtool = require_binary("promtool", package="prometheus")
    result = subprocess.run(
        [promtool, "check", "config", "--syntax-only", str(DEPLOY / "compose" / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- Dockerfile ---------------------------------------------------------------------------------


def _dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text(encoding="utf-8").replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
        for line in lines
        if line and not line.startswith("#")
    ]


def test_dockerfile_builds_a_slim_non_root_healer_image() -> None:
    instructions = _dockerfile_instructions()
    values = lambda kind: [v for k, v in instructions if k == kind]  # noqa: E731
    assert values("ARG")[0] == "PYTHON_IMAGE=python:3.11-slim"
    assert f"HEALER_UID={HEALER_UID}" in values("ARG")
    assert values("USER") == ["${HEALER_UID}:${HEALER_UID}"]
    assert values("ENTRYPOINT") == ['["healer"]']
    assert values("CMD") == ['["run"]']
    (healthcheck,) = values("HEALTHCHECK")
    assert "/healthz" in healthcheck and "python" in healthcheck and "curl" not in healthcheck
    runs = " ".join(values("RUN"))
    assert "pip install \".[agent]\"" in runs and "[dev]" not in runs  # NVML bindings, no dev tools
    copied = {v.split()[-2] for v in values("COPY") if not v.startswith("--from")}
    for needed in ("healer", "api", "migrations", "rules", "pyproject.toml"):
        assert any(c == needed or c.startswith(f"{needed} ") for c in copied) or needed in " ".join(
            values("COPY")
        ), needed
    for source in ("healer", "api", "migrations", "rules", "pyproject.toml", "README.md"):
        assert (REPO / source).exists(), source
    assert not any(re.search(r"(?i)(password|secret|token)=", v) for k, v in instructions if k == "ENV")


def test_dockerfile_puts_migrations_where_healer_looks() -> None:
    # The image copies migrations/ into site-packages, beside the installed package: that is
    # where healer.store.migrate looks. Fails here first if migrate.py changes its mind.
    assert migrate.MIGRATIONS_DIR.parent == Path(healer.__file__).resolve().parents[1]
    assert 'cp -r migrations "$site/migrations"' in DOCKERFILE.read_text(encoding="utf-8")


def test_dockerignore_keeps_what_the_image_needs() -> None:
    ignored = {
        line.strip().rstrip("/")
        for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {"healer", "api", "migrations", "rules", "pyproject.toml", "README.md"}.isdisjoint(ignored)
    assert {".git", "tests", ".env"} <= ignored


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_image_tags_the_release_the_chart_installs() -> None:
    # The chart's image.tag defaults to its appVersion: `make image` must build that tag.
    version = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    assert version is not None
    chart = yaml.safe_load((DEPLOY / "chart" / "healer" / "Chart.yaml").read_text(encoding="utf-8"))
    assert chart["appVersion"] == version.group(1)
    result = subprocess.run(
        ["make", "-n", "image", "IMAGE=registry.example.com/healer"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        cwd=REPO,
    )
    assert result.stdout.split() == [
        "docker",
        "build",
        "-t",
        f"registry.example.com/healer:{version.group(1)}",
        ".",
    ]


# --- Helm chart ---------------------------------------------------------------------------------

PRODUCTION_VALUES = DEPLOY / "chart" / "examples" / "production-values.yaml"
#: What each render is given besides the chart: default values (and the image), and the example
#: of an acting install.
RENDERS: dict[str, tuple[str, ...]] = {
    "default": IMAGE,
    "production": ("-f", str(PRODUCTION_VALUES)),
}


@pytest.fixture(scope="module")
def helm() -> str:
    return require_helm()


@pytest.fixture(scope="module")
def rendered(helm: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for name, args in RENDERS.items():
        result = template(helm, *args)
        assert result.returncode == 0, f"helm template ({name}): {result.stderr}"
        out[name] = documents(result.stdout)
    return out


def _one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _grants(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) a Role or ClusterRole grants."""
    return {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def _container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = _one(objects, "Deployment", "healer")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def _objects(rendered: dict[str, list[dict[str, Any]]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for render, objects in rendered.items():
        for obj in objects:
            yield f"{render}: {obj['kind']}/{obj['metadata']['name']}", obj


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_matches_the_kubernetes_schemas(
    rendered: dict[str, list[dict[str, Any]]], version: str
) -> None:
    problems, unchecked = [], set()
    for where, obj in _objects(rendered):
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            unchecked.add(f"{obj['apiVersion']}/{obj['kind']}")
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"{where}: {str(exc).splitlines()[0]}")
    assert problems == []
    # Custom resources have no bundled schema; the ServiceMonitor is checked by hand below.
    assert unchecked <= {"monitoring.coreos.com/v1/ServiceMonitor"}


@pytest.mark.parametrize("render", RENDERS)
def test_helm_lint_passes(helm: str, render: str) -> None:
    result = run_helm(helm, "lint", "--strict", str(CHART), "--kube-version", "1.29.0", *RENDERS[render])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


def _documented_installs() -> list[tuple[str, list[str]]]:
    """Every ``helm install`` / ``helm upgrade`` command in README.md and deploy/README.md, as
    (where, arguments after the chart path); continuation lines joined."""
    found = []
    for doc in (REPO / "README.md", DEPLOY / "README.md"):
        text = doc.read_text(encoding="utf-8").replace("\\\n", " ")
        for line in text.splitlines():
            if not line.lstrip().startswith("helm "):
                continue
            words = shlex.split(line.split(" # ")[0], comments=False)
            if words[:2] in (["helm", "install"], ["helm", "upgrade"]) and "deploy/chart/healer" in words:
                rest = words[words.index("deploy/chart/healer") + 1 :]
                found.append((f"{doc.relative_to(REPO)}: {' '.join(words[:3])}", rest))
    return found


def test_the_documented_helm_commands_render(helm: str, tmp_path: Path) -> None:
    installs = _documented_installs()
    assert len(installs) >= 4, installs
    my_values = tmp_path / "my-values.yaml"
    my_values.write_text(PRODUCTION_VALUES.read_text(encoding="utf-8"), encoding="utf-8")
    for where, args in installs:
        args = [a for a in args if a != "--reuse-values"]
        args = [str(my_values) if a == "my-values.yaml" else a for a in args]
        # --reuse-values builds on the install before it: render on top of a dry-run install's values.
        result = template(helm, *IMAGE, *[a for a in args if a not in ("-n", NAMESPACE)])
        assert result.returncode == 0, f"{where} {args}: {result.stderr}"


def test_the_image_must_name_a_registry(helm: str) -> None:
    result = template(helm)
    assert result.returncode != 0
    assert "image.repository is required" in result.stderr
    assert "make image" in result.stderr


def test_more_than_one_replica_needs_the_csrf_secret(helm: str) -> None:
    result = template(helm, *IMAGE, "--set", "api.csrfSecret.name=")
    assert result.returncode != 0
    assert "api.csrfSecret.name is required with more than one replica" in result.stderr
    # One replica signs with a key of its own; no budget would let a drain through, so none is made.
    single = template(helm, *IMAGE, "--set", "api.csrfSecret.name=", "--set", "replicas=1")
    assert single.returncode == 0, single.stderr
    objects = documents(single.stdout)
    assert "HEALER_API__CSRF_SECRET" not in _env(_container(objects))
    assert not any(o["kind"] == "PodDisruptionBudget" for o in objects)


def test_alertmanager_token_is_a_mounted_secret_for_alerts_mode(helm: str, tmp_path: Path) -> None:
    token = ("--set", "alertmanagerToken.name=healer-alertmanager")
    refused = template(helm, *IMAGE, *token)
    assert refused.returncode != 0
    assert "alertmanagerToken wakes alerts mode only: set settings.detection.mode: alerts" in refused.stderr
    result = template(helm, *IMAGE, *token, "--set", "settings.detection.mode=alerts")
    assert result.returncode == 0, result.stderr
    objects = documents(result.stdout)
    container = _container(objects)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in _one(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    items = {
        (source["secret"]["name"], item["key"]): item["path"]
        for source in volumes["secrets"]["projected"]["sources"]
        for item in source["secret"]["items"]
    }
    config = tmp_path / "healer.yaml"
    config.write_text(_one(objects, "ConfigMap", "healer-settings")["data"]["healer.yaml"], encoding="utf-8")
    settings = load_settings(config)
    assert settings.detection.mode == "alerts"
    assert settings.detection.alertmanager_token_file == (
        Path(mounts["secrets"]) / items[("healer-alertmanager", "token")]
    )


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("dryrun=false", "dryrun"),  # a misspelled safety switch must not be ignored
        ("api.anonymousRole=admin", "anonymousRole"),
        ("settings.rules_paths={/tmp}", "rules_paths"),
    ],
)
def test_values_schema_refuses_mistakes(helm: str, setting: str, complaint: str) -> None:
    result = template(helm, *IMAGE, "--set", setting)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert complaint in result.stderr


def test_settings_values_merge_under_the_chart_values(helm: str) -> None:
    result = template(
        helm,
        *IMAGE,
        "--set",
        "settings.prometheus.timeout_seconds=5",
        "--set",
        "settings.safety.allow_missing_providers=true",
        "--set",
        "prometheus.url=http://thanos-query.monitoring.svc:9090",
    )
    assert result.returncode == 0, result.stderr
    settings_map = _one(documents(result.stdout), "ConfigMap", "healer-settings")
    settings = yaml.safe_load(settings_map["data"]["healer.yaml"])
    assert settings["prometheus"] == {"url": "http://thanos-query.monitoring.svc:9090", "timeout_seconds": 5}
    assert settings["safety"]["allow_missing_providers"] is True
    assert settings["safety"]["max_unhealthy"] == 2  # the chart's defaults stay


def test_every_render_installs_the_same_shape(rendered: dict[str, list[dict[str, Any]]]) -> None:
    expected = {
        ("ServiceAccount", "healer"),
        ("ClusterRole", "healer"),
        ("ClusterRoleBinding", "healer"),
        ("Role", "healer-leader-election"),
        ("RoleBinding", "healer-leader-election"),
        ("Deployment", "healer"),
        ("Service", "healer"),
        ("PodDisruptionBudget", "healer"),
        ("ConfigMap", "healer-rules"),
        ("ConfigMap", "healer-settings"),
        ("ConfigMap", "healer-xid-catalog"),
    }
    for name, objects in rendered.items():
        kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
        assert expected <= kinds, name
        # No secret values in the repository: Secrets are created by the user (deploy/README.md).
        assert not any(o["kind"] == "Secret" for o in objects)
        for obj in objects:
            if obj["kind"] in {"ClusterRole", "ClusterRoleBinding"}:
                continue
            if obj["metadata"]["name"] == "healer-dcgm-metrics":
                # For dcgm-exporter, in its namespace (values dcgmExporterCounters.namespace).
                assert obj["metadata"]["namespace"] == "gpu-operator"
                continue
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["metadata"]["name"]
    # ServiceMonitor is on/off: off by default (it needs the Prometheus Operator CRDs).
    assert not any(o["kind"] == "ServiceMonitor" for o in rendered["default"])
    _one(rendered["production"], "ServiceMonitor", "healer")


@pytest.mark.parametrize("render", RENDERS)
def test_cluster_role_is_least_privilege(rendered: dict[str, list[dict[str, Any]]], render: str) -> None:
    objects = rendered[render]
    granted = {
        (group, resource, verb)
        for rule in _one(objects, "ClusterRole", "healer")["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == CLUSTER_PERMISSIONS
    role = _one(objects, "Role", "healer-leader-election")
    leases = _grants(role)
    assert leases == LEASE_PERMISSIONS
    for rule in [*role["rules"], *_one(objects, "ClusterRole", "healer")["rules"]]:
        assert "resourceNames" not in rule or rule["resourceNames"]
        assert "*" not in json.dumps(rule), rule
    for kind, name in (("ClusterRoleBinding", "healer"), ("RoleBinding", "healer-leader-election")):
        binding = _one(objects, kind, name)
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "healer", "namespace": NAMESPACE}]
    assert _one(objects, "RoleBinding")["roleRef"]["name"] == role["metadata"]["name"]
    assert _one(objects, "ClusterRoleBinding")["roleRef"]["name"] == "healer"
    deployment = _one(objects, "Deployment", "healer")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "healer"


def test_cluster_role_covers_every_kubernetes_call_the_adapter_makes() -> None:
    """Every CoreV1/Policy/Events/Coordination method healer/actions calls maps to a granted verb."""
    calls = set()
    for path in (REPO / "healer" / "actions").glob("*.py"):
        text = path.read_text()
        calls |= set(re.findall(r"\.((?:create|delete|list|read|patch|replace)_[a-z_]+)\(", text))
        # A watch streams a list method: ``Watch().stream(api.list_..., ...)`` needs the watch verb.
        calls |= {f"watch_{m}" for m in re.findall(r"\.stream\(\s*\w+\.list_([a-z_]+),", text)}
    verbs = {"create": "create", "delete": "delete", "list": "list", "read": "get", "patch": "patch"}
    verbs["replace"] = "update"
    verbs["watch"] = "watch"
    resources = {
        "namespaced_pod_eviction": ("", "pods/eviction"),
        "namespaced_pod": ("", "pods"),
        "pod_for_all_namespaces": ("", "pods"),
        "node_status": ("", "nodes/status"),
        "node": ("", "nodes"),
        "namespaced_event": ("", "events"),
        "namespaced_lease": ("coordination.k8s.io", "leases"),
        "pod_disruption_budget_for_all_namespaces": ("policy", "poddisruptionbudgets"),
        "namespaced_pod_disruption_budget": ("policy", "poddisruptionbudgets"),
        "namespaced_job": ("batch", "jobs"),
        # The only custom objects healer touches: Kueue's ClusterQueues (healer/actions/kueue.py).
        "cluster_custom_object": ("kueue.x-k8s.io", "clusterqueues"),
        "device_taint_rule": ("resource.k8s.io", "devicetaintrules"),
    }
    needed = set()
    for call in sorted(calls):
        verb, _, rest = call.partition("_")
        assert rest in resources, (
            f"healer/actions calls {call}: add its resource here and to the chart's RBAC"
        )
        group, resource = resources[rest]
        needed.add((group, resource, verbs[verb]))
    assert needed, "no Kubernetes calls found in healer/actions"
    assert needed <= CLUSTER_PERMISSIONS | LEASE_PERMISSIONS | VALIDATION_PERMISSIONS


@pytest.mark.parametrize("render", RENDERS)
def test_deployment_is_ha_probed_and_locked_down(
    rendered: dict[str, list[dict[str, Any]]], render: str
) -> None:
    objects = rendered[render]
    deployment = _one(objects, "Deployment", "healer")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == HEALER_UID
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = _container(objects)
    assert container["image"].startswith("registry.example.com/")
    assert container["image"].endswith(":0.1.0")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8080}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    for c in [*pod["containers"], *pod.get("initContainers", [])]:
        assert c["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        }, c["name"]
        assert c["image"] == container["image"]
        assert set(c["resources"]["requests"]) == {"cpu", "memory"}, c["name"]
        assert "memory" in c["resources"]["limits"], c["name"]
        for name, entry in _env(c).items():
            assert _setting_exists(name), f"{c['name']}: {name} is not a healer setting"
            if name == "HEALER_DATABASE__URL":
                # The URL holds a password: only ever by reference.
                assert entry["valueFrom"]["secretKeyRef"] == {"name": "healer-database", "key": "url"}
            if name in {"HEALER_API__CSRF_SECRET", "HEALER_API__TOKENS"}:
                assert "value" not in entry and entry["valueFrom"]["secretKeyRef"]["name"], name
    (migrate_init,) = pod["initContainers"]
    assert migrate_init["args"] == ["db", "upgrade"]
    assert container["args"] == ["run"]
    # Mounted volumes exist, and every ConfigMap they name is part of the install or listed by the
    # user as one of theirs (rules.extraConfigMaps).
    volumes = {v["name"]: v for v in pod["volumes"]}
    config_maps = {o["metadata"]["name"] for o in objects if o["kind"] == "ConfigMap"}
    settings = yaml.safe_load(_one(objects, "ConfigMap", "healer-settings")["data"]["healer.yaml"])
    users = {Path(p).name for p in settings["rules_paths"]} - {"default"}
    for c in [*pod["containers"], *pod["initContainers"]]:
        for mount in c["volumeMounts"]:
            volume = volumes[mount["name"]]
            if "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps | users
    # Every Secret the pod reads is required: a missing one keeps the pod from starting.
    for source in volumes.get("secrets", {}).get("projected", {}).get("sources", []):
        assert source["secret"].get("optional") is not True


def test_dry_run_is_the_default_and_production_acts(rendered: dict[str, list[dict[str, Any]]]) -> None:
    def dry_run(render: str) -> str:
        return _env(_container(rendered[render]))["HEALER_SAFETY__DRY_RUN"]["value"]

    assert dry_run("default") == "true"
    assert dry_run("production") == "false"
    volumes = {
        v["name"]: v
        for v in _one(rendered["production"], "Deployment")["spec"]["template"]["spec"]["volumes"]
    }
    # Tickets are part of acting: the provider and callback keys come from required Secrets.
    secrets = {
        (s["secret"]["name"], item["key"], item["path"])
        for s in volumes["secrets"]["projected"]["sources"]
        for item in s["secret"]["items"]
    }
    assert secrets == {
        ("healer-provider-secrets", "provider-hmac", "providers/default"),
        ("healer-provider-secrets", "callback-hmac", "callback-hmac"),
    }


@pytest.mark.parametrize("render", RENDERS)
def test_settings_file_and_env_build_real_settings(
    rendered: dict[str, list[dict[str, Any]]],
    render: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    objects = rendered[render]
    container = _container(objects)
    env = _env(container)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    config_path = Path(env["HEALER_CONFIG"]["value"])
    assert str(config_path.parent) == mounts["config"]
    settings_map = _one(objects, "ConfigMap", "healer-settings")
    config_file = tmp_path / config_path.name
    config_file.write_text(settings_map["data"][config_path.name], encoding="utf-8")
    stand_ins = {
        "HEALER_DATABASE__URL": "postgresql+psycopg://healer:x@postgres.example:5432/healer",
        "HEALER_KUBERNETES__NAMESPACE": NAMESPACE,
        "HEALER_API__CSRF_SECRET": "csrf-key-from-the-secret",
        "HEALER_API__TOKENS": json.dumps([{"token": "t" * 32, "user": "alice", "role": "operator"}]),
    }
    values = {name: e.get("value", stand_ins.get(name)) for name, e in env.items()}
    assert None not in values.values(), values
    settings = _settings_from_env(values, monkeypatch, config_file=config_file)
    assert settings.safety.dry_run is (render == "default")
    rule_mounts = {Path(path) for name, path in mounts.items() if name.startswith("rules-")}
    assert set(settings.rules_paths) == rule_mounts and Path(mounts["rules-default"]) in rule_mounts
    assert settings.api.host == "0.0.0.0" and settings.api.port == 8080
    assert settings.api.csrf_secret == "csrf-key-from-the-secret"
    assert settings.kubernetes.namespace == NAMESPACE
    assert settings.kubernetes.lease_name == "healer-leader"
    assert settings.kubernetes.renew_interval_seconds < settings.kubernetes.lease_duration_seconds
    if render == "default":
        # Nobody unidentified may act, or even look, until the user chooses otherwise.
        assert settings.api.anonymous_role == "none"
        assert settings.tickets.providers == []
        return
    # Each provider's key file and the callback key file are where the Secret volume puts them.
    volumes = {v["name"]: v for v in _one(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    secret_files = {
        Path(mounts["secrets"]) / item["path"]
        for source in volumes["secrets"]["projected"]["sources"]
        for item in source["secret"]["items"]
    }
    assert {p.secret_file for p in settings.tickets.providers} | {
        settings.tickets.callback_secret_file
    } == secret_files
    assert [t.role for t in settings.api.tokens] == ["operator"]
    # Acting: every provider the rendered rule pack opens tickets with is configured, so healer starts.
    assert _providers_the_rules_use() <= {p.name for p in settings.tickets.providers}
    assert settings.safety.allow_missing_providers is False
    pack = tmp_path / "rules"
    pack.mkdir()
    for name, text in _one(objects, "ConfigMap", "healer-rules")["data"].items():
        (pack / name).write_text(text, encoding="utf-8")
    refuse_acting_without_providers(load_ruleset([pack], promtool=False).rules, settings)
    without = settings.model_copy(update={"tickets": settings.tickets.model_copy(update={"providers": []})})
    with pytest.raises(ConfigError, match="provider 'default'"):
        refuse_acting_without_providers(load_ruleset([pack], promtool=False).rules, without)


def test_service_monitor_and_pdb_select_the_pods(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["production"]
    pod_labels = _one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    service = _one(objects, "Service", "healer")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8080, "protocol": "TCP", "targetPort": "http"}
    ]
    monitor = _one(objects, "ServiceMonitor", "healer")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert [(e["port"], e["path"]) for e in monitor["spec"]["endpoints"]] == [("http", "/metrics")]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    pdb = _one(objects, "PodDisruptionBudget", "healer")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pdb["spec"]["minAvailable"] < _one(objects, "Deployment")["spec"]["replicas"]


def test_rule_configmap_holds_the_rule_pack(rendered: dict[str, list[dict[str, Any]]]) -> None:
    rules = {
        p.name: p.read_text(encoding="utf-8")
        for p in sorted((REPO / "rules").iterdir())
        if p.suffix in {".yaml", ".yml"}
    }
    assert rules, "rules/ has no rule files"
    data = _one(rendered["default"], "ConfigMap", "healer-rules")["data"]
    assert data == rules, "the chart's rule pack is stale: run python deploy/scripts/sync_rules.py"
    check = subprocess.run(
        [sys.executable, str(DEPLOY / "scripts" / "sync_rules.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert check.returncode == 0, check.stdout


def _rendered_settings(objects: list[dict[str, Any]]) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(
        _one(objects, "ConfigMap", "healer-settings")["data"]["healer.yaml"]
    )
    return data


@pytest.mark.parametrize("render", RENDERS)
def test_the_xid_catalog_is_shipped_mounted_and_read_by_default(
    rendered: dict[str, list[dict[str, Any]]], render: str, tmp_path: Path
) -> None:
    """In a real install the default ladders find the catalog: an Xid 48 is a reset, 79 a reboot
    (not class unknown, which would go straight to a ticket)."""
    objects = rendered[render]
    catalog = (REPO / "rules" / "catalog" / "xid-catalog.yaml").read_text(encoding="utf-8")
    config_map = _one(objects, "ConfigMap", "healer-xid-catalog")
    assert config_map["data"] == {"xid-catalog.yaml": catalog}, (
        "the chart's Xid catalog is stale: run python deploy/scripts/sync_rules.py"
    )
    path = Path(_rendered_settings(objects)["repair"]["xid_catalog"])
    container = _container(objects)
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["xid-catalog"]["mountPath"] == str(path.parent) and mounts["xid-catalog"]["readOnly"]
    volumes = {v["name"]: v for v in _one(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["xid-catalog"]["configMap"]["name"] == "healer-xid-catalog"
    assert path.name in config_map["data"]
    # What healer reads there: the catalog's classes.
    local = tmp_path / path.name
    local.write_text(config_map["data"][path.name], encoding="utf-8")
    settings = load_settings(repair={"xid_catalog": str(local)})
    found = xid_catalog_of(settings)
    assert found is not None and found.classify(48) == "reset" and found.classify(79) == "reboot"


def test_the_xid_catalog_setting_is_the_users_when_given(helm: str) -> None:
    objects = documents(template(helm, *IMAGE, "--set", "settings.repair.xid_catalog=/site/xids.yaml").stdout)
    assert _rendered_settings(objects)["repair"]["xid_catalog"] == "/site/xids.yaml"
    off = documents(template(helm, *IMAGE, "--set", "rules.xidCatalog=false").stdout)
    assert "xid_catalog" not in (_rendered_settings(off).get("repair") or {})
    assert not any(o["metadata"]["name"] == "healer-xid-catalog" for o in off)
    assert "xid-catalog" not in {m["name"] for m in _container(off)["volumeMounts"]}


def test_dcgm_exporter_counters_configmap(rendered: dict[str, list[dict[str, Any]]]) -> None:
    config_map = _one(rendered["production"], "ConfigMap", "healer-dcgm-metrics")
    counters = (DEPLOY / "dcgm-exporter" / "counters-4.x.csv").read_text(encoding="utf-8")
    assert config_map["data"] == {"dcgm-metrics.csv": counters}
    assert not any(o["metadata"]["name"] == "healer-dcgm-metrics" for o in rendered["default"])


def test_no_secret_values_in_deploy() -> None:
    templates = CHART / "templates"
    for path in DEPLOY.rglob("*"):
        if path.suffix not in {".yaml", ".yml"} or templates in path.parents:
            continue  # templates are checked rendered, above
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if isinstance(doc, dict):
                assert doc.get("kind") != "Secret", f"{path}: create Secrets with kubectl, not in git"


AGENT = (*IMAGE, "--set", "agent.enabled=true")


def test_node_agent_is_off_by_default(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for objects in rendered.values():
        assert not any(o["kind"] == "DaemonSet" for o in objects)
        assert not any(o["metadata"]["name"] == "healer-agent" for o in objects)


def test_node_agent_render_reads_and_annotates_nodes_only(helm: str) -> None:
    """agent.enabled: a DaemonSet on GPU nodes (every taint tolerated, its node name from the downward
    API), a ClusterRole of nodes get/list/watch/patch only, and the signing key mounted into both the
    controller and the agent; the controller's ClusterRole does not grow (it already patches nodes)."""
    result = template(helm, *AGENT)
    assert result.returncode == 0, result.stderr
    objects = documents(result.stdout)
    role = _one(objects, "ClusterRole", "healer-agent")
    granted = _grants(role)
    assert granted == {("", "nodes", v) for v in ("get", "list", "watch", "patch")}
    controller_role = _one(objects, "ClusterRole", "healer")
    assert _grants(controller_role) == CLUSTER_PERMISSIONS
    binding = _one(objects, "ClusterRoleBinding", "healer-agent")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "healer-agent", "namespace": NAMESPACE}]
    daemonset = _one(objects, "DaemonSet", "healer-agent")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "healer-agent"
    assert {"operator": "Exists"} in pod["tolerations"]
    (container,) = pod["containers"]
    assert container["args"] == ["agent", "--metrics-port", "9402"]
    assert container["ports"] == [{"name": "metrics", "containerPort": 9402, "protocol": "TCP"}]
    env = {e["name"]: e for e in container["env"]}
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"  # NVML mounted by the toolkit
    assert json.loads(env["HEALER_REPAIR__AGENT_BUNDLE_COMMAND"]["value"])[-2:] == ["nvidia-smi", "-q"]
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert json.loads(env["HEALER_REPAIR__AGENT_COMMANDS"]["value"])["reboot"][-2:] == ["systemctl", "reboot"]
    settings = yaml.safe_load(_one(objects, "ConfigMap", "healer-settings")["data"]["healer.yaml"])
    assert settings["repair"] == {
        "actions": ["reset-gpu", "reboot"],
        "secret_file": "/etc/healer/secrets/repair-hmac",
        "xid_catalog": "/etc/healer/catalog/xid-catalog.yaml",  # the chart's catalog (rules.xidCatalog)
    }
    deployment = _one(objects, "Deployment", "healer")
    sources = deployment["spec"]["template"]["spec"]["volumes"]
    projected = next(v for v in sources if v["name"] == "secrets")["projected"]["sources"]
    assert {"key": "hmac", "path": "repair-hmac"} in [i for s in projected for i in s["secret"]["items"]]


#: The Role rendered with settings.validation.enabled (validation Jobs in the release namespace).
VALIDATION_PERMISSIONS = {("batch", "jobs", v) for v in ("create", "get", "delete")}


def test_validation_jobs_role_only_when_enabled(helm: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    for objects in rendered.values():
        assert not any(o["metadata"]["name"] == "healer-validation" for o in objects)
    result = template(helm, *IMAGE, "--set", "settings.validation.enabled=true")
    assert result.returncode == 0, result.stderr
    objects = documents(result.stdout)
    role = _one(objects, "Role", "healer-validation")
    assert role["metadata"]["namespace"] == NAMESPACE
    granted = _grants(role)
    assert granted == VALIDATION_PERMISSIONS
    binding = _one(objects, "RoleBinding", "healer-validation")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "healer", "namespace": NAMESPACE}]
    settings = yaml.safe_load(_one(objects, "ConfigMap", "healer-settings")["data"]["healer.yaml"])
    assert settings["validation"] == {"enabled": True, "namespace": NAMESPACE}
