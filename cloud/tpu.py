"""The one Cloud TPU API client of tpu-stack (google-cloud-tpu's tpu_v2): the dynamic
providers, `tpuctl` and the functions build theirs here, with the same credentials and
the same retries."""

from __future__ import annotations

import os
from typing import Any

from cloud import gcp_credentials

ENDPOINT_ENV = "TPU_STACK_TPU_ENDPOINT"


def tpu_client(auth: gcp_credentials.GcpAuth | None = None, credentials: Any = None) -> Any:
    """A TpuClient with the gcp provider's credentials (cloud/gcp_credentials.py):
    `credentials` already built, else `auth`'s (tpuctl resolves them from the stack
    file), else this plugin process's stack's; or anonymous REST against
    `$TPU_STACK_TPU_ENDPOINT`."""
    from google.cloud import tpu_v2

    endpoint = os.environ.get(ENDPOINT_ENV)
    if not endpoint:
        if credentials is None:
            credentials = (gcp_credentials.build(auth) if auth is not None
                           else gcp_credentials.stack_credentials())
        return tpu_v2.TpuClient(credentials=credentials)
    from google.auth.credentials import AnonymousCredentials

    return tpu_v2.TpuClient(
        credentials=AnonymousCredentials(),
        transport="rest",
        client_options={"api_endpoint": endpoint},
    )


def transient_retry(deadline: float = 60.0) -> Any:
    """Retries for 503/429/500 and dropped connections: the TPU v2 client sets none itself."""
    from google.api_core import exceptions as gexc
    from google.api_core import retry as gretry

    predicate = gretry.if_exception_type(
        gexc.ServiceUnavailable, gexc.TooManyRequests, gexc.InternalServerError, ConnectionError
    )
    return gretry.Retry(
        predicate=predicate, initial=0.1, maximum=5.0, multiplier=2.0, timeout=deadline
    )


def create_retry(deadline: float = 60.0) -> Any:
    """transient_retry less 429: a create refused for quota answers 429 RESOURCE_EXHAUSTED
    (model/capacity.py), which the classifier must see at once, not after a minute of
    retries; a rate limit among them is told apart there (ErrorInfo.reason)."""
    from google.api_core import exceptions as gexc
    from google.api_core import retry as gretry

    predicate = gretry.if_exception_type(
        gexc.ServiceUnavailable, gexc.InternalServerError, ConnectionError)
    return gretry.Retry(
        predicate=predicate, initial=0.1, maximum=5.0, multiplier=2.0, timeout=deadline
    )
