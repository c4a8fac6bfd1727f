"""tpuctl authenticates as the stack's gcp provider does (cloud/gcp_credentials.py):
the stack file's gcp: keys first, then the provider's environment, then plain ADC.
Only credential objects are inspected: nothing here talks to Google."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.auth import impersonated_credentials
from google.oauth2 import credentials as oauth2

from cloud import gcp_credentials
from cloud.gcp_credentials import GcpAuth
from cloud.tpu import ENDPOINT_ENV
from model.archive import REPO_ROOT
from model.fleet import TargetError
from ops.tpu.api import TpuApi
from ops.tpu.logs import AgentLogs
from ops.tpu.target import load_target

DEPLOYER = "dev-deployer@acme-ml-dev.iam.gserviceaccount.com"
OTHER = "someone@acme-ml-dev.iam.gserviceaccount.com"
USER_JSON = {"type": "authorized_user", "client_id": "id.apps.googleusercontent.com",
             "client_secret": "s", "refresh_token": "refresh-1"}
ENV_NAMES = (*gcp_credentials.CREDENTIALS_ENV, gcp_credentials.ACCESS_TOKEN_ENV,
             gcp_credentials.IMPERSONATE_ENV, "GOOGLE_APPLICATION_CREDENTIALS", ENDPOINT_ENV,
             "STORAGE_EMULATOR_HOST")


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No credentials from the machine: no variables, no gcloud files."""
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")  # never the real metadata server
    yield


def stack_root(tmp_path: Path, gcp: str) -> Path:
    """Pulumi.yaml and Pulumi.dev.yaml, with `gcp` (YAML lines) added to dev's config."""
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copy(REPO_ROOT / "Pulumi.yaml", root / "Pulumi.yaml")
    dev = (REPO_ROOT / "Pulumi.dev.yaml").read_text()
    (root / "Pulumi.dev.yaml").write_text(dev.replace("config:\n", f"config:\n{gcp}", 1))
    return root


def tpu_credentials(auth: GcpAuth) -> Any:
    return TpuApi(auth=auth).client._transport._credentials


def test_tpuctl_impersonates_what_the_stack_file_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fails on a client of plain ADC: it ignored the stack file's gcp: keys."""
    monkeypatch.setenv("GOOGLE_OAUTH_ACCESS_TOKEN", "ya29.me")
    root = stack_root(tmp_path, f"  gcp:impersonateServiceAccount: {DEPLOYER}\n"
                                f"  gcp:impersonateServiceAccountDelegates: [{OTHER}]\n")
    auth = load_target("dev", root).auth()

    assert auth == GcpAuth(access_token="ya29.me", impersonate=DEPLOYER, delegates=(OTHER,))
    for creds in (tpu_credentials(auth), AgentLogs("acme-ml-dev", auth=auth).client._credentials):
        assert isinstance(creds, impersonated_credentials.Credentials)
        assert creds.service_account_email == DEPLOYER
        assert creds._source_credentials.token == "ya29.me"


def test_a_stack_file_access_token_beats_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOOGLE_OAUTH_ACCESS_TOKEN", "ya29.env")
    monkeypatch.setenv("GOOGLE_IMPERSONATE_SERVICE_ACCOUNT", OTHER)
    auth = load_target("dev", stack_root(tmp_path, "  gcp:accessToken: ya29.file\n")).auth()

    creds = tpu_credentials(auth)
    assert isinstance(creds, impersonated_credentials.Credentials)
    assert creds._source_credentials.token == "ya29.file"
    assert creds.service_account_email == OTHER, "the environment's impersonation still applies"


def test_plain_adc_without_gcp_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    adc = tmp_path / "adc.json"
    adc.write_text(json.dumps(USER_JSON))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    auth = load_target("dev", stack_root(tmp_path, "")).auth()

    assert auth == GcpAuth()
    for creds in (tpu_credentials(auth), AgentLogs("acme-ml-dev", auth=auth).client._credentials):
        assert isinstance(creds, oauth2.Credentials) and creds.refresh_token == "refresh-1"


def test_a_secret_key_needs_the_providers_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = stack_root(tmp_path, "  gcp:credentials:\n    secure: v1:AAAA\n")

    with pytest.raises(TargetError) as raised:
        load_target("dev", root)
    assert str(raised.value) == (
        "gcp:credentials is a secret in Pulumi.dev.yaml, which tpuctl cannot decrypt: set "
        "GOOGLE_CREDENTIALS or GOOGLE_CLOUD_KEYFILE_JSON or GCLOUD_KEYFILE_JSON to its value")

    monkeypatch.setenv("GOOGLE_CREDENTIALS", json.dumps(USER_JSON))
    creds = tpu_credentials(load_target("dev", root).auth())
    assert isinstance(creds, oauth2.Credentials) and creds.refresh_token == "refresh-1"


def test_external_credentials_are_one_clear_error(tmp_path: Path) -> None:
    target = load_target("dev", stack_root(tmp_path, "  gcp:externalCredentials: x\n"))

    with pytest.raises(TargetError, match=r"^Pulumi\.dev\.yaml: gcp:externalCredentials is set"):
        target.auth()
