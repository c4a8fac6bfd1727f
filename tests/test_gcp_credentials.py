"""The queued-TPU provider authenticates like the gcp provider (issue 19 item 5):
each source gives the client the credentials terraform-provider-google would use,
in its order (cloud/gcp_credentials.py). Only credential objects are
inspected: nothing here talks to Google."""

from __future__ import annotations

import http.server
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.auth import external_account, impersonated_credentials
from google.oauth2 import credentials as oauth2
from google.oauth2 import service_account
from pulumi.dynamic import ConfigureRequest
from pulumi.dynamic.config import Config

from cloud import gcp_credentials
from cloud.gcp_credentials import GcpAuth, GcpCredentialsError, build, resolve
from cloud.tpu import ENDPOINT_ENV, tpu_client
from components.queued_tpu import QueuedTpuProvider

DEPLOYER = "prod-deployer@acme-ml-prod.iam.gserviceaccount.com"
OTHER = "someone@acme-ml-prod.iam.gserviceaccount.com"
USER_JSON = {"type": "authorized_user", "client_id": "id.apps.googleusercontent.com",
             "client_secret": "s", "refresh_token": "refresh-1"}
EXTERNAL_JSON = {
    "type": "external_account",
    "audience": "//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/p"
                "/providers/g",
    "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
    "token_url": "https://sts.googleapis.com/v1/token",
}
STACK = {"tpu-stack:storage": '{"location": "US"}', "gcp:project": "acme-ml-prod"}
ENV_NAMES = (*gcp_credentials.CREDENTIALS_ENV, gcp_credentials.ACCESS_TOKEN_ENV,
             gcp_credentials.IMPERSONATE_ENV, "GOOGLE_APPLICATION_CREDENTIALS", ENDPOINT_ENV)


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No credentials from the machine: no variables, no gcloud files, no stack config."""
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")  # never the real metadata server
    monkeypatch.setattr(gcp_credentials, "_stack_config", None)
    yield


def service_account_json() -> dict[str, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    return {"type": "service_account", "project_id": "acme-ml-prod", "private_key_id": "k1",
            "private_key": pem, "client_email": DEPLOYER, "client_id": "1",
            "token_uri": "https://oauth2.googleapis.com/token"}


def configured(config: dict[str, str]) -> None:
    """What the engine does in the plugin process: configure the provider once."""
    QueuedTpuProvider().configure(ConfigureRequest(Config(config, project_name="tpu-stack")))


def client_credentials() -> Any:
    return tpu_client()._transport._credentials


# ---- precedence ----------------------------------------------------------------------


def test_config_beats_the_environment() -> None:
    env = {"GOOGLE_OAUTH_ACCESS_TOKEN": "env-token", "GOOGLE_CREDENTIALS": "{}",
           "GOOGLE_IMPERSONATE_SERVICE_ACCOUNT": OTHER}
    config = {"gcp:credentials": "/keys/ci.json", "gcp:impersonateServiceAccount": DEPLOYER}
    assert resolve(config, env) == GcpAuth(credentials="/keys/ci.json", impersonate=DEPLOYER)


def test_an_access_token_beats_credentials() -> None:
    both = {"gcp:accessToken": "t", "gcp:credentials": "{}"}
    assert resolve(both, {}) == GcpAuth(access_token="t")
    env = {"GOOGLE_OAUTH_ACCESS_TOKEN": "t", "GOOGLE_CREDENTIALS": "{}"}
    assert resolve({}, env) == GcpAuth(access_token="t")


def test_the_environment_in_the_providers_order() -> None:
    env = {"GCLOUD_KEYFILE_JSON": "c", "GOOGLE_CLOUD_KEYFILE_JSON": "b", "GOOGLE_CREDENTIALS": ""}
    assert resolve({}, env) == GcpAuth(credentials="b")
    assert resolve({}, {"GOOGLE_IMPERSONATE_SERVICE_ACCOUNT": OTHER}) == GcpAuth(impersonate=OTHER)
    assert resolve({}, {}) == GcpAuth()


def test_delegates_come_as_json_text() -> None:
    config = {"gcp:impersonateServiceAccount": DEPLOYER,
              "gcp:impersonateServiceAccountDelegates": json.dumps([OTHER])}
    assert resolve(config, {}).delegates == (OTHER,)


def test_external_credentials_in_config_are_refused() -> None:
    with pytest.raises(GcpCredentialsError, match="gcp:externalCredentials"):
        resolve({"gcp:externalCredentials": "{}"}, {})


# ---- each source, built ---------------------------------------------------------------


def test_an_access_token_from_a_file_or_inline(tmp_path: Path) -> None:
    assert build(GcpAuth(access_token="ya29.inline")).token == "ya29.inline"
    path = tmp_path / "token"
    path.write_text("ya29.file\n")
    creds = build(GcpAuth(access_token=str(path)))
    assert isinstance(creds, oauth2.Credentials) and creds.token == "ya29.file"


def test_credentials_json_of_each_type(tmp_path: Path) -> None:
    key = tmp_path / "key.json"
    key.write_text(json.dumps(service_account_json()))
    creds = build(GcpAuth(credentials=str(key)))
    assert isinstance(creds, service_account.Credentials)
    assert creds.service_account_email == DEPLOYER
    assert list(creds.scopes) == list(gcp_credentials.SCOPES)
    user = build(GcpAuth(credentials=json.dumps(USER_JSON)))
    assert isinstance(user, oauth2.Credentials) and user.refresh_token == "refresh-1"
    oidc = tmp_path / "oidc-token"  # what google-github-actions/auth writes
    oidc.write_text("eyJ.header.sig")
    external = {**EXTERNAL_JSON, "credential_source": {"file": str(oidc)}}
    federated = build(GcpAuth(credentials=json.dumps(external)))
    assert isinstance(federated, external_account.Credentials)
    assert federated._audience == EXTERNAL_JSON["audience"]


def test_bad_credentials_name_the_setting() -> None:
    with pytest.raises(GcpCredentialsError, match="gcp:credentials"):
        build(GcpAuth(credentials="/no/such/key.json"))


def test_application_default_credentials_when_nothing_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    adc = tmp_path / "adc.json"
    adc.write_text(json.dumps(USER_JSON))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    creds = build(GcpAuth())
    assert isinstance(creds, oauth2.Credentials) and creds.refresh_token == "refresh-1"


def test_impersonation_over_the_source() -> None:
    creds = build(GcpAuth(access_token="ya29.source", impersonate=DEPLOYER, delegates=(OTHER,)))
    assert isinstance(creds, impersonated_credentials.Credentials)
    assert creds.service_account_email == DEPLOYER
    assert creds._source_credentials.token == "ya29.source"
    assert creds._delegates == [OTHER]


# ---- the provider's client ------------------------------------------------------------


def test_the_client_impersonates_what_the_stack_config_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fails on a TpuClient() of default credentials: it ignores gcp:* config."""
    monkeypatch.setenv("GOOGLE_OAUTH_ACCESS_TOKEN", "ya29.ci")
    configured({**STACK, "gcp:impersonateServiceAccount": DEPLOYER})
    creds = client_credentials()
    assert isinstance(creds, impersonated_credentials.Credentials)
    assert creds.service_account_email == DEPLOYER
    assert creds._source_credentials.token == "ya29.ci"


def test_the_client_takes_a_config_access_token_over_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GOOGLE_OAUTH_ACCESS_TOKEN", "ya29.env")
    configured({**STACK, "gcp:accessToken": "ya29.config"})
    creds = client_credentials()
    assert isinstance(creds, oauth2.Credentials) and creds.token == "ya29.config"


def test_the_client_uses_the_environment_without_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOOGLE_OAUTH_ACCESS_TOKEN", "ya29.env")
    monkeypatch.setenv("GOOGLE_IMPERSONATE_SERVICE_ACCOUNT", OTHER)
    configured(STACK)
    creds = client_credentials()
    assert isinstance(creds, impersonated_credentials.Credentials)
    assert creds.service_account_email == OTHER


def test_an_engine_that_passes_no_stack_config_is_refused() -> None:
    """CLIs before 3.139.0 configure dynamic providers with an empty config."""
    with pytest.raises(GcpCredentialsError, match=r"3\.139\.0"):
        configured({})


# ---- what was found, and why it does not work (issue 29 item 3) ------------------------


def test_a_missing_adc_file_is_named_with_the_variable_that_names_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    absent = tmp_path / "keys" / "absent.json"
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(absent))
    with pytest.raises(gcp_credentials.NoUsableCredentialsError) as caught:
        build(GcpAuth())
    assert str(caught.value) == (
        f"no usable Google credentials: GOOGLE_APPLICATION_CREDENTIALS names {absent}, which "
        "does not exist: point GOOGLE_APPLICATION_CREDENTIALS at a credentials file, or unset "
        "it and run `gcloud auth application-default login`")


@pytest.mark.parametrize(("content", "why"), [
    ("{}", "which is not a credentials file (\"type\" is None; service_account, "
           "authorized_user, external_account, impersonated_service_account are)"),
    ('{"type": "api_key"}', "which is not a credentials file (\"type\" is 'api_key';"),
    ("not json", "which is not JSON, so not a credentials file"),
])
def test_a_file_that_is_not_a_credential_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str, why: str) -> None:
    path = tmp_path / "adc.json"
    path.write_text(content)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    with pytest.raises(gcp_credentials.NoUsableCredentialsError) as caught:
        build(GcpAuth())
    assert f"GOOGLE_APPLICATION_CREDENTIALS names {path}, {why}" in str(caught.value)


def test_a_broken_gcloud_adc_file_is_named(tmp_path: Path) -> None:
    gcloud = tmp_path / "gcloud" / "application_default_credentials.json"
    gcloud.parent.mkdir()
    gcloud.write_text("{}")
    with pytest.raises(gcp_credentials.NoUsableCredentialsError) as caught:
        build(GcpAuth())
    assert f"gcloud's application default credentials, {gcloud}, which is not a credentials " \
           "file" in str(caught.value)
    assert str(caught.value).endswith("run `gcloud auth application-default login` again")


def test_no_credentials_at_all_lists_where_it_looked(tmp_path: Path) -> None:
    from ops.tpu.api import NoCredentialsError, TpuApi

    with pytest.raises(NoCredentialsError) as caught:
        TpuApi(auth=GcpAuth()).list_nodes("acme-ml-dev", "us-central1-a")
    assert str(caught.value) == (
        "no Google credentials: GOOGLE_APPLICATION_CREDENTIALS is not set, "
        f"{tmp_path / 'gcloud' / 'application_default_credentials.json'} does not exist and no "
        "metadata server answered: run `gcloud auth application-default login` or set "
        "GOOGLE_APPLICATION_CREDENTIALS")


@pytest.mark.parametrize(("value", "words"), [
    ("/no/such/key.json", "gcp:credentials / GOOGLE_CREDENTIALS names /no/such/key.json, "
                          "which does not exist"),
    ('{"type": ', "its contents are not JSON, so not a credentials file"),
])
def test_a_provider_key_that_is_no_key_says_what_it_is(value: str, words: str) -> None:
    with pytest.raises(gcp_credentials.NoUsableCredentialsError, match=re.escape(words)):
        build(GcpAuth(credentials=value))


class _TokenEndpoint(http.server.BaseHTTPRequestHandler):
    """oauth2.googleapis.com/token for a login that has expired: 400 invalid_grant."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps({"error": "invalid_grant",
                           "error_description": "Token has been expired or revoked."}).encode()
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


def test_an_expired_adc_login_says_which_credentials_and_to_log_in_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ops.tpu.api import NoCredentialsError, TpuApi

    server = http.server.HTTPServer(("127.0.0.1", 0), _TokenEndpoint)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    # A user's ADC always refreshes at Google's token endpoint (google/oauth2/credentials.py,
    # from_authorized_user_info): here, the loopback one.
    monkeypatch.setattr(oauth2, "_GOOGLE_OAUTH2_TOKEN_ENDPOINT",
                        f"http://127.0.0.1:{server.server_port}/token")
    try:
        gcloud = tmp_path / "gcloud" / "application_default_credentials.json"
        gcloud.parent.mkdir()
        gcloud.write_text(json.dumps(USER_JSON))
        with pytest.raises(NoCredentialsError) as caught:
            TpuApi(auth=GcpAuth()).list_nodes("acme-ml-dev", "us-central1-a")
    finally:
        server.shutdown()
        server.server_close()
    message = str(caught.value)
    assert message.startswith(f"Google refused the credentials from gcloud's application "
                              f"default credentials ({gcloud}): invalid_grant: Token has been "
                              "expired or revoked.")
    assert message.endswith("run `gcloud auth application-default login` again")
