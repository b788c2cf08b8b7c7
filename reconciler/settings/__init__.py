"""The agent's own settings (never the deployment repo's): this package's face.

``agent`` holds the settings as frozen dataclasses, ``load`` reads them from ``--config`` and
flags (``sections`` and ``remoteurl`` check its parts, ``problems`` says every mistake at
once); callers write ``from reconciler.settings import AgentConfig, load_config``.
"""

from reconciler.settings.agent import (
    AgentConfig,
    DockerConfig,
    HostConfig,
    MetricsConfig,
    NotifyConfig,
    RemoteConfig,
    SecretsConfig,
    TrustConfig,
    WebhookConfig,
)
from reconciler.settings.load import load_config
from reconciler.settings.sections import is_loopback, split_listen

__all__ = ["AgentConfig", "DockerConfig", "HostConfig", "MetricsConfig", "NotifyConfig", "RemoteConfig",
           "SecretsConfig", "TrustConfig", "WebhookConfig", "is_loopback", "load_config", "split_listen"]
