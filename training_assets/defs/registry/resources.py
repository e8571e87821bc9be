"""The deployment resource: which vLLM servers registry_entry may call, from instance configuration.

    TRAINING_ASSETS_DEPLOY_ALLOWED_URLS=http://vllm:8000   # the allow-list (comma-separated)
    VLLM_BASE_URL=http://vllm:8000/v1                      # the server used when a run names none

A run config may only *choose among* the allowed servers: anything else is refused before a
request (and so the API key) leaves the process. The default server is allowed implicitly.
"""

import os

import dagster as dg
from pydantic import Field

from training_assets.deploy import ALLOWED_URLS_ENV, DeploymentError, DeploymentTarget, env_allowed_urls, require_allowed


class VllmDeployment(dg.ConfigurableResource):
    """Where registered models may be deployed (instance configuration, never run config)."""

    base_url: str = Field("", description="Default vLLM server; empty: $VLLM_BASE_URL, else record the serve command only.")
    allowed_urls: list[str] = Field(default_factory=list, description=f"Servers runs may name; empty: ${ALLOWED_URLS_ENV}.")

    def default_url(self) -> str | None:
        return self.base_url or os.environ.get("VLLM_BASE_URL") or None

    def allowed(self) -> tuple[str, ...]:
        listed = tuple(self.allowed_urls) or env_allowed_urls() or ()
        default = self.default_url()
        return listed + ((default,) if default else ())

    def target(self, role: str, served_model_name: str, requested_url: str = "") -> DeploymentTarget:
        """The target for a run: its ``requested_url`` if allowed (else a refusal naming the fix), else the default."""
        url = requested_url or self.default_url()
        allowed = self.allowed()
        if url is not None:
            try:
                require_allowed(url, allowed)
            except DeploymentError as exc:
                raise dg.Failure(description=f"registry_entry config base_url: {exc}") from None
        return DeploymentTarget(role, served_model_name, url, allowed_urls=allowed)


@dg.definitions
def registry_resources() -> dg.Definitions:
    return dg.Definitions(resources={"deployment": VllmDeployment()})
