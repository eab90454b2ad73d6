"""Typed configuration: the schema of conf/ (`schema`) and the diff's engine entries (`entries`)."""
from pipeline.config.schema import (
    AlignmentConfig,
    CaptureConfig,
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

__all__ = ["AlignmentConfig", "CaptureConfig", "ConfigError", "DataConfig", "DiffConfig", "ExtractConfig",
           "ModelConfig", "ProbeConfig", "RoutingFlipConfig", "RunnerConfig", "Thresholds", "exit_on_unknown_overrides",
           "register_configs", "resolved_dict", "to_config"]
