"""Typed configuration: the schema of conf/ (`schema`), the diff's engine entries (`entries`) and the entry points'
overrides checked before Hydra runs (`overrides`)."""
from pipeline.config.overrides import exit_on_bad_overrides
from pipeline.config.schema import (
    AlignmentConfig,
    CaptureConfig,
    CONF_DIR,
    ConfigError,
    DataConfig,
    DiffConfig,
    ExtractConfig,
    exit_on_unknown_overrides,
    ModelConfig,
    ProbeConfig,
    RoutingFlipConfig,
    RunnerConfig,
    Thresholds,
    register_configs,
    resolved_dict,
    to_config,
)

__all__ = ["AlignmentConfig", "CaptureConfig", "CONF_DIR", "ConfigError", "DataConfig", "DiffConfig",
           "ExtractConfig", "ModelConfig", "ProbeConfig", "RoutingFlipConfig", "RunnerConfig", "Thresholds",
           "exit_on_bad_overrides", "exit_on_unknown_overrides", "register_configs", "resolved_dict", "to_config"]
