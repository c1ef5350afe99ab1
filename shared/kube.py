"""The Kubernetes client edge: building an ApiClient from a kubeconfig (or in-cluster service account)."""

from __future__ import annotations

import os
from pathlib import Path

from kubernetes_asyncio import client, config


async def new_api_client(kubeconfig: str | Path | None = None, impersonate: str | None = None) -> client.ApiClient:
    """An ApiClient for `kubeconfig`, else $KUBECONFIG, else the in-cluster service account.

    `impersonate` (a user name such as `system:serviceaccount:ns:name`) sends Impersonate-User, so a test can
    run a component with exactly the permissions its ServiceAccount has.
    """
    configuration = client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path:
        await config.load_kube_config(config_file=str(path), client_configuration=configuration)
    else:
        config.load_incluster_config(client_configuration=configuration)
    api = client.ApiClient(configuration=configuration)
    if impersonate:
        api.set_default_header("Impersonate-User", impersonate)
    return api
