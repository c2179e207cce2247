"""The docker path: the compose file parses, uses only the official p4lang images and the
project's own image (built from them), and names only files that exist."""

from __future__ import annotations

import re

import yaml

from bml.paths import REPO_ROOT

OFFICIAL = {"p4lang/p4c", "p4lang/behavioral-model"}


def compose() -> dict:
    return yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())


def image_name(image: str) -> str:
    return image.split(":")[0]


def test_compose_parses_with_the_documented_services():
    services = compose()["services"]
    assert {"p4c", "demo", "test"} <= set(services)
    assert all(s.get("privileged") for name, s in services.items() if name != "p4c")


def test_only_official_images_and_our_own_built_from_them():
    for name, service in compose()["services"].items():
        if "build" in service:
            dockerfile = REPO_ROOT / service["build"]["context"] / service["build"]["dockerfile"]
            bases = re.findall(r"^FROM\s+(\S+)", dockerfile.read_text(), re.M)
            assert bases and all(image_name(b) in OFFICIAL for b in bases), (name, bases)
            assert image_name(service["image"]) == "bml-ina"
        else:
            assert image_name(service["image"]) in OFFICIAL, name


def test_named_files_exist():
    for name, service in compose()["services"].items():
        if "build" in service:
            context = REPO_ROOT / service["build"]["context"]
            assert (context / service["build"]["dockerfile"]).is_file(), name
        for volume in service.get("volumes", []):
            assert (REPO_ROOT / volume.split(":")[0]).exists(), (name, volume)
        command = service.get("entrypoint", []) + service.get("command", [])
        for word in command:
            if "/" in word and not word.startswith("/"):
                assert (REPO_ROOT / word).exists(), (name, word)
        if "make" in command:
            target = command[command.index("make") + 1]
            assert re.search(rf"^{target}:", (REPO_ROOT / "Makefile").read_text(), re.M)
    dockerfile = (REPO_ROOT / "docker" / "Dockerfile").read_text()
    for path in re.findall(r"bash (\S+)", dockerfile):
        assert (REPO_ROOT / path).exists(), path
