"""compose/ runs the demo with containers. There is no Docker engine here, so the file
is parsed and schema-checked by a compose implementation that needs none (Debian's
docker-compose: `config`), and everything the demo needs is checked to be present."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from delvefs.devtools.demo.__main__ import build_parser
from tests.conftest import service_unavailable

COMPOSE_DIR = Path(__file__).resolve().parents[2] / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
DOCKERFILE = COMPOSE_DIR / "Dockerfile"
CLIENT_ENV = {"AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION",
              "DELVEFS_HANDLER_URL", "DELVEFS_HANDLER_TOKEN", "DELVEFS_NOTIFY_ARN"}


@pytest.fixture(scope="module")
def compose():
    """The file as an engine would see it: anchors, merges and defaults resolved by `config`."""
    tool = shutil.which("docker-compose")
    if not tool:
        service_unavailable("docker-compose (Debian package, installed by scripts/bootstrap.sh) is missing")
    out = subprocess.run([tool, "-f", str(COMPOSE_FILE), "config"], capture_output=True, text=True,
                         cwd=COMPOSE_DIR)
    assert out.returncode == 0, out.stderr
    return YAML(typ="safe").load(out.stdout)


def env_of(service) -> dict:
    env = service.get("environment", {})
    return env if isinstance(env, dict) else dict(item.split("=", 1) for item in env)


def test_every_service_has_an_image_or_a_build_target_that_exists(compose):
    stages = set(re.findall(r"^FROM \S+ AS (\S+)", DOCKERFILE.read_text(), re.M))
    for name, service in compose["services"].items():
        assert "image" in service or "build" in service, name
        if "build" in service:
            assert service["build"]["target"] in stages, name
            assert (Path(service["build"]["context"]) / service["build"]["dockerfile"]).resolve() == DOCKERFILE


def test_dockerfile_copies_only_what_exists():
    root = COMPOSE_DIR.parent
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            for source in line.split()[1:-1]:
                assert (root / source).exists(), source


def test_minio_publishes_to_the_exchange_the_handler_consumes(compose):
    minio, handler = env_of(compose["services"]["minio"]), env_of(compose["services"]["handler"])
    target = "PRIMARY"
    for suffix in ("ENABLE", "URL", "EXCHANGE", "EXCHANGE_TYPE", "DURABLE", "DELIVERY_MODE"):
        assert f"MINIO_NOTIFY_AMQP_{suffix}_{target}" in minio
    assert minio[f"MINIO_NOTIFY_AMQP_PUBLISHING_CONFIRMS_{target}"] == "on"
    assert minio[f"MINIO_NOTIFY_AMQP_EXCHANGE_{target}"] == handler["DELVEFS_AMQP_EXCHANGE"]
    assert minio[f"MINIO_NOTIFY_AMQP_EXCHANGE_TYPE_{target}"] == "fanout"
    assert handler["DELVEFS_NOTIFY_ARN"] == f"arn:minio:sqs::{target}:amqp"
    assert "rabbitmq:5672" in minio[f"MINIO_NOTIFY_AMQP_URL_{target}"]
    assert minio["MINIO_ROOT_USER"] == handler["AWS_ACCESS_KEY_ID"]


def aligners(compose) -> list[str]:
    return [n for n in compose["services"] if n.startswith("aligner-")]


def test_demo_roles_have_their_environment_and_commands(compose):
    roles = set(build_parser()._subparsers._group_actions[0].choices)
    services = compose["services"]
    assert len(aligners(compose)) >= 2
    for name in ["init", "publisher", *aligners(compose)]:
        command = services[name]["command"]
        assert command[:3] == ["python", "-m", "delvefs.devtools.demo"] and command[3] in roles, name
        assert CLIENT_ENV <= set(env_of(services[name])), name
    assert "--listen" in services["handler"]["command"]
    port = services["handler"]["command"][services["handler"]["command"].index("--listen") + 1].rsplit(":", 1)[1]
    assert env_of(services["publisher"])["DELVEFS_HANDLER_URL"] == f"http://handler:{port}"


def test_aligners_and_the_publisher_can_mount_fuse(compose):
    for name in [*aligners(compose), "publisher"]:
        service = compose["services"][name]
        assert any(d.startswith("/dev/fuse") for d in service["devices"]), name
        assert "SYS_ADMIN" in service["cap_add"], name
    for name in aligners(compose):
        assert compose["services"][name]["depends_on"]["handler"]["condition"] == "service_healthy"


def test_the_aligners_are_one_group_and_the_publisher_reads_their_journals(compose):
    """The same role with the same views (one view, one group): the commands differ only
    in the aligner's name; no share of the reads per worker. The journals volume is shared;
    an init as PID 1 lets the SIGKILL of an aligner's process group take the aligner."""
    services = compose["services"]
    commands = {n: services[n]["command"] for n in aligners(compose)}
    unnamed = set()
    for name, command in commands.items():
        at = command.index("--name")
        assert command[3] == "aligner" and command[at + 1] == name
        assert "--worker" not in command
        unnamed.add(tuple(command[:at] + command[at + 2:]))
        assert command[command.index("--journals") + 1] == "/journals"
        assert services[name]["init"] is True, name
    assert len(unnamed) == 1, unnamed
    for name in [*aligners(compose), "publisher"]:
        volumes = services[name]["volumes"]
        sources = [v["source"] if isinstance(v, dict) else v.split(":")[0] for v in volumes]
        targets = [v["target"] if isinstance(v, dict) else v.split(":")[1] for v in volumes]
        assert ("journals", "/journals") in zip(sources, targets), name
    publisher = services["publisher"]["command"]
    assert publisher[publisher.index("--journals") + 1] == "/journals"
    assert publisher[publisher.index("--aligners") + 1] == str(len(commands))


def test_volumes_and_health_checks(compose):
    declared = set(compose.get("volumes", {}))
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume["source"] if isinstance(volume, dict) else volume.split(":")[0]
            kind = volume.get("type") if isinstance(volume, dict) else None
            if kind == "bind" or source.startswith(("/", ".")):
                assert Path(source).exists(), f"{name}: {source}"
            else:
                assert source in declared, f"{name}: {source}"
    for name in ("rabbitmq", "minio", "handler"):
        assert "healthcheck" in compose["services"][name], name


DEMO_DOC = COMPOSE_DIR.parent / "docs" / "DEMO.md"
RUN_COMMAND = "docker compose run --build --rm publisher"


def test_the_documented_command_runs_the_demo_to_its_end(compose):
    """`up --exit-code-from` implies --abort-on-container-exit: the stack would stop when
    the one-shot `init` exits. `run publisher` starts its dependencies (each ready first)
    and exits with the publisher's status."""
    for text in (DEMO_DOC.read_text(), COMPOSE_FILE.read_text()):
        assert RUN_COMMAND in text
        assert "up --build --exit-code-from" not in text
    services = compose["services"]
    assert services["init"].get("restart", "no") == "no"
    publisher = services["publisher"]["depends_on"]
    assert publisher["init"]["condition"] == "service_completed_successfully"
    for name in aligners(compose):
        assert publisher[name]["condition"] == "service_healthy", name
        assert "healthcheck" in services[name], name


def test_dockerignore_keeps_local_state_out_of_the_build_context():
    ignored = (COMPOSE_DIR.parent / ".dockerignore").read_text().split()
    for entry in (".git", ".venv", "**/__pycache__", "*.egg-info"):
        assert entry in ignored, entry


def test_license_matches_the_package_metadata():
    import tomllib
    root = COMPOSE_DIR.parent
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT" and "LICENSE" in project["license-files"]
    assert (root / "LICENSE").read_text().startswith("MIT License")
