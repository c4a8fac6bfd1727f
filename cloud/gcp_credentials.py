"""The gcp provider's credentials, for code that calls Google APIs beside it (the
queued-TPU dynamic provider; tpuctl, from the stack file's gcp: keys,
ops/tpu/target.py), chosen the way the provider chooses them.

terraform-provider-google (pulumi-gcp bridges it), google/provider/provider.go
`providerConfigure` and google/transport/config.go `GetCredentials`:

1. The source. Config `gcp:accessToken` / `gcp:credentials`; only when neither is
   set, the environment: `GOOGLE_OAUTH_ACCESS_TOKEN`, and the first of
   `GOOGLE_CREDENTIALS`, `GOOGLE_CLOUD_KEYFILE_JSON`, `GCLOUD_KEYFILE_JSON`
   ("config beats env var in all cases"). An access token beats credentials.
   Either value is a file path or the contents (`verify.PathOrContents`).
   Neither: Application Default Credentials (`GOOGLE_APPLICATION_CREDENTIALS`,
   gcloud's file, the metadata server).
2. Impersonation over that source: `gcp:impersonateServiceAccount`, else
   `GOOGLE_IMPERSONATE_SERVICE_ACCOUNT` (`HandleSDKDefaults`), with
   `gcp:impersonateServiceAccountDelegates`.

The config keys are pulumi-gcp's (pulumi_gcp/config/vars.py, 10.2.0). A dynamic
provider runs in the engine's pulumi-python plugin process: it inherits the CLI's
environment, and from CLI 3.139.0 on the engine hands it the whole stack config
through `configure` (pulumi/pulumi pkg/resource/deploy/target.go
`GetPackageConfig`, #17673). Older engines hand it nothing, which `use_stack_config`
refuses rather than fall back to other credentials.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

CONFIG_KEYS = {
    "access_token": "gcp:accessToken",
    "credentials": "gcp:credentials",
    "impersonate": "gcp:impersonateServiceAccount",
    "delegates": "gcp:impersonateServiceAccountDelegates",
}
UNSUPPORTED_KEYS = ("gcp:externalCredentials",)
CREDENTIALS_ENV = ("GOOGLE_CREDENTIALS", "GOOGLE_CLOUD_KEYFILE_JSON", "GCLOUD_KEYFILE_JSON")
ACCESS_TOKEN_ENV = "GOOGLE_OAUTH_ACCESS_TOKEN"
IMPERSONATE_ENV = "GOOGLE_IMPERSONATE_SERVICE_ACCOUNT"
SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
# Every stack file sets it (Pulumi.yaml gives it no default): present in any config
# an engine that passes the stack config hands over.
STACK_KEY = "tpu-stack:storage"
MINIMUM_CLI = "3.139.0"


class ConfigSource(Protocol):
    def get(self, key: str) -> Any: ...


class GcpCredentialsError(RuntimeError):
    """The stack's gcp credentials cannot be known or used."""


class NoUsableCredentialsError(GcpCredentialsError):
    """No credentials were found, or those found cannot be used; the message says
    what was found and why it does not work."""


ADC_ENV = "GOOGLE_APPLICATION_CREDENTIALS"
ADC_LOGIN = "gcloud auth application-default login"
CREDENTIAL_TYPES = ("service_account", "authorized_user", "external_account",
                    "impersonated_service_account")


@dataclass(frozen=True)
class GcpAuth:
    """Where the credentials come from; empty fields are unset."""

    access_token: str = ""
    credentials: str = ""
    impersonate: str = ""
    delegates: tuple[str, ...] = ()


def resolve(config: ConfigSource, env: Mapping[str, str]) -> GcpAuth:
    """The provider's choice of source and impersonation, from config and environment."""
    for key in UNSUPPORTED_KEYS:
        if config.get(key):
            raise GcpCredentialsError(f"{key} is set: the queued-TPU provider supports "
                                      f"{', '.join(CONFIG_KEYS.values())} and the environment")
    token = config.get(CONFIG_KEYS["access_token"]) or ""
    credentials = config.get(CONFIG_KEYS["credentials"]) or ""
    if not token and not credentials:
        token = env.get(ACCESS_TOKEN_ENV, "")
        credentials = next((env[name] for name in CREDENTIALS_ENV if env.get(name)), "")
    return GcpAuth(
        access_token=token,
        credentials="" if token else credentials,
        impersonate=config.get(CONFIG_KEYS["impersonate"]) or env.get(IMPERSONATE_ENV, ""),
        delegates=_delegates(config.get(CONFIG_KEYS["delegates"])),
    )


def _delegates(value: Any) -> tuple[str, ...]:
    # A list-valued config key reaches a dynamic provider as JSON text.
    if not value:
        return ()
    items = json.loads(value) if isinstance(value, str) else value
    return tuple(str(item) for item in items)


def path_or_contents(value: str) -> str:
    """A file's text if `value` names an existing file (`~` expanded), else `value`."""
    path = Path(value).expanduser()
    try:
        return path.read_text() if path.is_file() else value
    except OSError:  # e.g. a JSON blob too long to be a file name
        return value


def build(auth: GcpAuth) -> Any:
    """google.auth credentials for `auth`: the source, impersonated if asked."""
    from google.auth import impersonated_credentials
    from google.oauth2 import credentials as oauth2

    if auth.access_token:
        source = oauth2.Credentials(token=path_or_contents(auth.access_token).strip())
    elif auth.credentials:
        source = from_info(_credentials_info(auth.credentials))
    else:
        source = _application_default(os.environ)
    if not auth.impersonate:
        return source
    return impersonated_credentials.Credentials(
        source_credentials=source,
        target_principal=auth.impersonate,
        target_scopes=list(SCOPES),
        delegates=list(auth.delegates) or None,
    )


_CREDENTIALS_NAMES = "gcp:credentials / GOOGLE_CREDENTIALS"


def _credentials_info(value: str) -> dict[str, Any]:
    """The JSON of a `gcp:credentials` value (a key's contents or its path), or one
    error saying what the value is and why it is no key."""
    looks_like_json = value.lstrip().startswith("{")
    path = Path(value).expanduser()
    if not looks_like_json and not path.is_file():
        raise NoUsableCredentialsError(
            f"{_CREDENTIALS_NAMES} names {value}, which does not exist: give the path of a "
            "JSON key (or the key itself)")
    try:
        info = json.loads(path_or_contents(value))
    except json.JSONDecodeError:
        what = "its contents are" if looks_like_json else f"{value} is"
        raise NoUsableCredentialsError(f"{_CREDENTIALS_NAMES}: {what} not JSON, so not a "
                                       "credentials file") from None
    if not isinstance(info, dict):
        raise NoUsableCredentialsError(f"{_CREDENTIALS_NAMES} is JSON but not an object, so "
                                       "not a credentials file")
    return info


def adc_file(env: Mapping[str, str]) -> Path:
    """Where `gcloud auth application-default login` writes its credentials:
    $CLOUDSDK_CONFIG, else ~/.config/gcloud (google/auth/_cloud_sdk.py,
    get_application_default_credentials_path)."""
    config = env.get("CLOUDSDK_CONFIG") or str(Path(env.get("HOME", "~")) / ".config" / "gcloud")
    return Path(config).expanduser() / "application_default_credentials.json"


def adc_problem(env: Mapping[str, str]) -> str | None:
    """Why the Application Default Credentials google.auth.default would load cannot
    work, naming what it found (the file GOOGLE_APPLICATION_CREDENTIALS names, or
    gcloud's file); None when they look usable (or come from a metadata server)."""
    named = env.get(ADC_ENV)
    if named:
        return _file_problem(Path(named).expanduser(), f"{ADC_ENV} names {named}",
                             f"point {ADC_ENV} at a credentials file, or unset it and run "
                             f"`{ADC_LOGIN}`")
    gcloud = adc_file(env)
    if gcloud.exists():
        return _file_problem(gcloud, f"gcloud's application default credentials, {gcloud}",
                             f"run `{ADC_LOGIN}` again")
    return None


def _file_problem(path: Path, found: str, fix: str) -> str | None:
    if not path.is_file():
        return f"{found}, which does not exist: {fix}"
    try:
        info = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return f"{found}, which is not JSON, so not a credentials file: {fix}"
    kind = info.get("type") if isinstance(info, dict) else None
    if kind not in CREDENTIAL_TYPES:
        return (f"{found}, which is not a credentials file (\"type\" is {kind!r}; "
                f"{', '.join(CREDENTIAL_TYPES)} are): {fix}")
    return None


def no_credentials_message(env: Mapping[str, str]) -> str:
    """What google.auth.default found nothing in, and what to do."""
    return (f"no Google credentials: {ADC_ENV} is not set, {adc_file(env)} does not exist "
            f"and no metadata server answered: run `{ADC_LOGIN}` or set {ADC_ENV}")


def _application_default(env: Mapping[str, str]) -> Any:
    import google.auth
    from google.auth import exceptions as auth_exceptions

    problem = adc_problem(env)
    if problem:
        raise NoUsableCredentialsError(f"no usable Google credentials: {problem}")
    try:
        source, _ = google.auth.default(scopes=list(SCOPES))
    except auth_exceptions.DefaultCredentialsError as error:
        if env.get(ADC_ENV) or adc_file(env).exists():
            raise NoUsableCredentialsError(f"no usable Google credentials: {error}") from None
        raise NoUsableCredentialsError(no_credentials_message(env)) from None
    return source


def describe(auth: GcpAuth, env: Mapping[str, str]) -> str:
    """Where `auth`'s credentials come from, for a message."""
    if auth.access_token:
        source = "the access token (gcp:accessToken / GOOGLE_OAUTH_ACCESS_TOKEN)"
    elif auth.credentials:
        source = f"the key in {_CREDENTIALS_NAMES}"
    elif env.get(ADC_ENV):
        source = f"the file {ADC_ENV} names ({env[ADC_ENV]})"
    else:
        source = f"gcloud's application default credentials ({adc_file(env)})"
    return source + (f", impersonating {auth.impersonate}" if auth.impersonate else "")


def refresh_message(auth: GcpAuth, env: Mapping[str, str], error: Exception) -> str:
    """Google refused to refresh the credentials (an expired or revoked login, a
    deleted key): which credentials, Google's reason, and what to do."""
    reason = error.args[0] if error.args else str(error)
    fix = (f"run `{ADC_LOGIN}` again" if not (auth.access_token or auth.credentials
                                             or env.get(ADC_ENV))
           else "renew them (a new key or token)")
    return f"Google refused the credentials from {describe(auth, env)}: {reason}; {fix}"


def from_info(info: dict[str, Any]) -> Any:
    """Credentials from a JSON credentials file's content, by its `type`, as
    google.auth.load_credentials_from_dict would, without its network call for an
    external account's project (google/auth/_default.py,
    `_get_external_account_credentials`)."""
    from google.auth import aws, identity_pool, impersonated_credentials, pluggable
    from google.oauth2 import credentials as oauth2
    from google.oauth2 import service_account

    scopes = list(SCOPES)
    kind = info.get("type")
    if kind == "service_account":
        return service_account.Credentials.from_service_account_info(info, scopes=scopes)
    if kind == "authorized_user":
        return oauth2.Credentials.from_authorized_user_info(info, scopes=scopes)
    if kind == "impersonated_service_account":
        return impersonated_credentials.Credentials.from_impersonated_service_account_info(
            info, scopes=scopes)
    if kind == "external_account":
        if info.get("subject_token_type") == "urn:ietf:params:aws:token-type:aws4_request":
            return aws.Credentials.from_info(info, scopes=scopes)
        if (info.get("credential_source") or {}).get("executable") is not None:
            return pluggable.Credentials.from_info(info, scopes=scopes)
        return identity_pool.Credentials.from_info(info, scopes=scopes)
    raise GcpCredentialsError(
        f"gcp:credentials / GOOGLE_CREDENTIALS has type {kind!r}: service_account, "
        "authorized_user, external_account or impersonated_service_account are allowed")


# The stack config the engine gave this plugin process. Like the environment, it is
# process-wide there: one plugin process serves one stack's deployment.
_stack_config: ConfigSource | None = None


def use_stack_config(config: ConfigSource) -> None:
    """Remember the config a dynamic provider's `configure` received."""
    global _stack_config
    if config.get(STACK_KEY) is None:
        raise GcpCredentialsError(
            f"the Pulumi CLI passed no stack config to the dynamic provider: it is older "
            f"than {MINIMUM_CLI}, and the queued TPU would be created with other credentials "
            f"than the rest of the stack. Install the CLI in .pulumi-version ({MINIMUM_CLI}+)"
        )
    _stack_config = config


class _NoConfig:
    def get(self, _key: str) -> None:
        return None


def stack_credentials() -> Any:
    """The gcp provider's credentials for this process's stack."""
    return build(resolve(_stack_config or _NoConfig(), os.environ))
