"""The cluster's configuration: typed, validated, immutable, loaded from YAML.

Everything the gateway needs is here: pools, models (by name, any number per role, with their
LoRA adapters), the CPU fallback, failover chains, API keys, admission classes and placement
thresholds. Backends are derived (`model@pool`,
core/topology.py), never written by hand. Cross-field checks name the field and the fix, so a
broken file fails at start with a readable message (`ConfigError`), not a stack trace.
"""

from core.config.base import ConfigError, FrozenDict
from core.config.cluster import ClusterConfig
from core.config.load import (
    API_KEYS_ENV,
    EMBEDDED_CONFIG,
    hash_key,
    keys_from_env,
    load_config,
    parse_config,
)
from core.config.placement import PlacementConfig
from core.config.recovery import (
    ClusterManagerConfig,
    CommandProvisioner,
    NoProvisioner,
    ProvisionerConfig,
    RayAutoscalerProvisioner,
    TerraformProvisioner,
)
from core.config.router import DEFAULT_CLASS_SHARES, PreemptConfig, RouterConfig
from core.config.serving import (
    DEFAULT_CAPS,
    AdapterConfig,
    AutoscalingConfig,
    FallbackConfig,
    ModelConfig,
    PoolConfig,
    ToolsConfig,
)
from core.config.traffic import (
    DEFAULT_DEPTH_ROUTES,
    ApiKeyConfig,
    BatchConfig,
    DepthConfig,
    DepthRoute,
    GatewayConfig,
    KeyFields,
    MediaConfig,
)

__all__ = [
    "API_KEYS_ENV",
    "DEFAULT_CAPS",
    "DEFAULT_CLASS_SHARES",
    "DEFAULT_DEPTH_ROUTES",
    "EMBEDDED_CONFIG",
    "AdapterConfig",
    "ApiKeyConfig",
    "AutoscalingConfig",
    "BatchConfig",
    "ClusterConfig",
    "ClusterManagerConfig",
    "CommandProvisioner",
    "ConfigError",
    "DepthConfig",
    "DepthRoute",
    "FallbackConfig",
    "FrozenDict",
    "GatewayConfig",
    "KeyFields",
    "MediaConfig",
    "ModelConfig",
    "NoProvisioner",
    "PlacementConfig",
    "PoolConfig",
    "PreemptConfig",
    "ProvisionerConfig",
    "RayAutoscalerProvisioner",
    "RouterConfig",
    "TerraformProvisioner",
    "ToolsConfig",
    "hash_key",
    "keys_from_env",
    "load_config",
    "parse_config",
]
