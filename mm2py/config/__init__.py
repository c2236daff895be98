"""mm2py configuration: MM2's mm2.properties or the native YAML form, as pydantic models.

Use ``load_config(path)``; it raises ConfigError (one line, names the key and the file).
Clients get their librdkafka settings from ``ClusterConfig.librdkafka(role)`` only.
"""

from mm2py.config.errors import ConfigError
from mm2py.config.loader import load_config
from mm2py.config.models import ClusterConfig, FlowConfig, FlowSettings, MirrorConfig

__all__ = [
    "ClusterConfig",
    "ConfigError",
    "FlowConfig",
    "FlowSettings",
    "MirrorConfig",
    "load_config",
]
