"""README.md says what the code does: the deployer roles, the Pythons CI proves, the
Pulumi CLI it needs."""

from __future__ import annotations

import ast
import re

from model.archive import REPO_ROOT
from model.roles import DEPLOYER_ROLES

README = (REPO_ROOT / "README.md").read_text()


def test_the_deployer_roles_are_exactly_deployer_roles() -> None:
    listed = README.split("<!-- deployer-roles -->")[1].split("<!-- /deployer-roles -->")[0]
    assert re.findall(r"`(roles/[^`]+)`", listed) == list(DEPLOYER_ROLES)


def test_the_pythons_readme_claims_are_the_ones_ci_runs() -> None:
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    infra = re.search(r"^INFRA_MINIMUM=(\S+)", ci, re.M)[1]
    image = re.search(r"^IMAGE_PYTHON=(\S+)", ci, re.M)[1]
    assert f"Python {infra} or newer for the infra side" in README
    assert f"run on Python {image}, the Python of TPU VM images" in README
    assert "3.10+" not in README


def test_every_preview_and_up_runs_the_pack_with_the_repositorys_config() -> None:
    commands = re.findall(r"^pulumi (?:preview|up)\b.*$", README, re.M)
    assert commands, "README names no pulumi preview/up"
    for command in commands:
        assert "--policy-pack policy --policy-pack-config policy/config.json" in command, command


def test_the_files_and_links_readme_names_exist() -> None:
    named = set(re.findall(r"--policy-pack-config (\S+)", README))
    named |= set(re.findall(r"\]\(([^)#:]+)\)", README))  # relative links
    named |= set(re.findall(r"\b((?:scripts|docs|policy)/[\w./-]+\.(?:sh|md|json))", README))
    assert {"policy/config.json", "Pulumi.prod.yaml", "Pulumi.platform.yaml",
            "Pulumi.team-vision.yaml", "scripts/run.sh"} <= named
    assert [path for path in sorted(named) if not (REPO_ROOT / path).exists()] == []


def test_the_tpuctl_verbs_readme_names_exist() -> None:
    from typer.main import get_command

    from ops.cli import app

    verbs = set(get_command(app).commands)  # type: ignore[attr-defined]
    named = set(re.findall(r"\./tpuctl (\w+)", README))
    assert {"plan", "rehearse", "status", "wait", "preflight"} <= named
    assert named <= verbs


def test_start_your_own_stack_copies_dev_and_inits_the_same_name() -> None:
    copied = re.search(r"^cp Pulumi\.dev\.yaml Pulumi\.(\w+)\.yaml$", README, re.M)
    assert copied
    assert f"pulumi stack init {copied[1]} " in README
    assert "pulumi config set gcp:project " in README


def test_the_pulumi_cli_readme_names_is_the_version_file() -> None:
    """README's minimum Pulumi CLI, and any other Pulumi 3.NNN.N version it names, is
    .pulumi-version (Pulumi.yaml's requiredPulumiVersion minimum)."""
    pinned = (REPO_ROOT / ".pulumi-version").read_text().strip()
    claims = re.findall(r"Pulumi CLI must be\s+(\d+\.\d+\.\d+) or newer", README)
    assert claims == [pinned]
    cli_versions = re.findall(r"\b3\.\d{3}\.\d+\b", README)  # not a Python 3.11.x
    assert set(cli_versions) <= {pinned}, cli_versions


def test_a_newcomer_finds_preemption_from_readme_in_one_link() -> None:
    """issue 29 item 7: README links a docs/design.md heading named Preemption, and that
    section walks the notice, the save, the recovery and the resume."""
    assert "(docs/design.md#preemption)" in README
    design = (REPO_ROOT / "docs/design.md").read_text()
    section = design.split("\n## Preemption\n")[1].split("\n## ")[0]
    for step in ("The notice", "The stop save", "The node afterwards", "The resume"):
        assert f"**{step}.**" in section
    assert "tpuctl recover --apply" in section and "self-heal.yml" in section


def test_design_states_the_supported_tensorflow_versions_the_package_carries() -> None:
    from model import catalog

    design = " ".join((REPO_ROOT / "docs/design.md").read_text().split())
    low, high = (".".join(map(str, v)) for v in (catalog.SUPPORTED_TF[0], catalog.SUPPORTED_TF[-1]))
    assert f"Supported TensorFlow versions: {low} to {high}" in design
    images = ", ".join(".".join(map(str, v)) for v in catalog.DOCUMENTED_TF[:-1])
    assert f"TensorFlow {images} and {'.'.join(map(str, catalog.DOCUMENTED_TF[-1]))}" in design
    assert f"TensorFlow {low} to {high}" in README


def tensorflow_versions_the_test_command_runs() -> list[str]:
    """The TensorFlow versions every run of scripts/test.sh proves: its training venvs."""
    script = (REPO_ROOT / "scripts" / "test.sh").read_text()
    venvs = re.search(r"^for tf in ((?:tf2\d+ ?)+); do$", script, re.MULTILINE)
    assert venvs, "scripts/test.sh no longer names its training venvs in one loop"
    return [f"2.{name[3:]}" for name in venvs.group(1).split()]


def test_the_docs_claim_exactly_the_tensorflow_versions_the_test_command_proves() -> None:
    tested = tensorflow_versions_the_test_command_runs()
    assert tested == ["2.18", "2.20"]
    assert f"the test command proves {' and '.join(tested)}" in " ".join(README.split())
    training = " ".join((REPO_ROOT / "training" / "README.md").read_text().split())
    assert "- 2.18 (the newest documented TPU image) and 2.20 (the newest tensorflow-tpu): " \
           "every run of the test command." in training
    # The other versions the package carries say how they were checked, or that they were not.
    assert "- 2.15.1, 2.16.2 and 2.17.1: passed once, by hand, on 2026-12-03" in training
    assert "- 2.19: never tested" in training


def tf_version_modules() -> set[str]:
    """training/tests/conftest.py's TF_VERSION_MODULES, read without importing it (it sets
    the job's environment variables)."""
    tree = ast.parse((REPO_ROOT / "training" / "tests" / "conftest.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == \
                "TF_VERSION_MODULES":
            return set(ast.literal_eval(node.value))
    raise AssertionError("training/tests/conftest.py has no TF_VERSION_MODULES")


def test_the_newest_tensorflow_runs_the_core_claims_the_docs_name() -> None:
    core = {"test_preemption.py", "test_bert_checkpoint.py", "test_bert_hub.py",
            "test_signal_handlers.py", "test_job_output.py"}
    modules = tf_version_modules()
    assert core <= modules
    assert all((REPO_ROOT / "training" / "tests" / name).is_file() for name in modules)
    training = (REPO_ROOT / "training" / "README.md").read_text()
    assert all(name in training for name in core)


class _UnreachableStorage:
    """A bucket whose listing fails: the watcher says when it tries again."""

    def list(self, *args: object) -> list[object]:
        from node_agent.common import TransientError

        raise TransientError("HTTP 503")


def test_the_release_poll_readme_states_is_the_agents_default_and_it_is_used(
        monkeypatch) -> None:
    """README and docs/design.md: the agent lists the release prefix every 30 s. Every
    end-to-end test shortens it (TPU_STACK_RELEASE_POLL_SECONDS); here it is unset."""
    import threading

    from node_agent import watchers
    from node_agent.contract import RELEASE_POLL_SECONDS

    stated = f"every {RELEASE_POLL_SECONDS:g} s"
    assert f"node agent lists the prefix {stated}" in " ".join(README.split())
    design = " ".join((REPO_ROOT / "docs/design.md").read_text().split())
    assert f"at boot and {stated}" in design
    monkeypatch.delenv("TPU_STACK_RELEASE_POLL_SECONDS", raising=False)
    assert watchers.release_poll_seconds() == RELEASE_POLL_SECONDS == 30
    said, noted = [], threading.Event()
    watcher = watchers.ReleaseWatcher(
        _UnreachableStorage(), "gs://bucket/releases/node/", threading.Event(),  # type: ignore[arg-type]
        note=lambda line: (said.append(line), noted.set()))
    try:
        assert noted.wait(60)
    finally:
        watcher.stop()
    assert said == ["release listing failed: HTTP 503; trying again every 30s"]


def test_offline_the_plan_takes_the_wheels_from_tpu_stack_wheel_cache(
        tmp_path, monkeypatch) -> None:
    """README: the first plan fetches the pinned tf-keras wheels into .cache/wheels;
    offline, TPU_STACK_WHEEL_CACHE names a folder holding them. Here nothing can be
    fetched, and the package is built from that folder."""
    import hashlib
    import io
    import tarfile

    from model import archive

    said = " ".join(README.split())
    assert ("once, into `.cache/wheels` (the package carries them); offline, copy them "
            "there or point `TPU_STACK_WHEEL_CACHE` at a folder holding them") in said
    assert archive.DEFAULT_WHEEL_CACHE == REPO_ROOT / ".cache" / "wheels"
    wheel = b"a stand-in wheel"
    training = tmp_path / "training"
    (training / "tpu_training").mkdir(parents=True)
    (training / "tpu_training" / "__init__.py").write_text("")
    (training / "pyproject.toml").write_text("")
    (training / "wheels.lock").write_text(
        f"tf-keras==2.18.0 {hashlib.sha256(wheel).hexdigest()}\n")
    cache = tmp_path / "wheels-from-elsewhere"
    cache.mkdir()
    (cache / "tf_keras-2.18.0-py3-none-any.whl").write_bytes(wheel)

    def offline(pin, folder):
        raise AssertionError(f"fetched {pin.requirement} into {folder}")

    monkeypatch.setattr(archive, "_download_wheel", offline)
    monkeypatch.setenv("TPU_STACK_WHEEL_CACHE", str(cache))
    built = archive.build_archive(training)
    with tarfile.open(fileobj=io.BytesIO(built.data)) as package:
        member = package.extractfile("wheels/tf_keras-2.18.0-py3-none-any.whl")
        assert member is not None and member.read() == wheel


def figures_masked(text: str) -> str:
    """`text` with the figures other changes move (prices, the summary's counts) masked."""
    text = re.sub(r"\$\d[\d,]*\.\d+", "$X", text)
    return re.sub(r"\b\d+ (to \w+|changes\.|unchanged)", r"N \1", text)


def test_what_a_reviewer_sees_is_what_the_renderer_prints_for_that_change() -> None:
    """README's example, rendered again: dev's plan against dev with its subnet narrowed
    to a /21, as `tpuctl plan --against --format table` renders it. The same lines,
    figures aside."""
    import json

    from components.stack_config import file_config
    from ops.plan.diff import diff_plans, render_diff
    from ops.plan.offline import offline_plan
    from ops.plan.report import plain

    section = README.split("## What a reviewer sees", 1)[1].split("\n## ", 1)[0]
    assert "(`tpu-stack:network: {subnetCidr: 10.128.0.0/21}` in Pulumi.dev.yaml)" in \
        " ".join(section.split())
    [example] = re.findall(r"```text\n(.*?)\n```", section, re.DOTALL)
    config = file_config("dev")
    network = json.loads(config.get("tpu-stack:network") or "{}")
    assert "subnetCidr" not in network  # dev's own: the default /20
    narrowed = {**config, "tpu-stack:network": json.dumps({**network,
                                                           "subnetCidr": "10.128.0.0/21"})}
    rendered = render_diff(diff_plans(plain(offline_plan("dev").to_json()),
                                      plain(offline_plan("dev", narrowed).to_json())), "table")
    assert figures_masked(example) == figures_masked(rendered.rstrip("\n"))
