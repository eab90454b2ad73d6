"""Typed configuration: the schema of conf/ (`schema`), each job's primary config composed and validated (`compose`),
the diff's engine entries (`entries`) and the entry points' overrides checked before Hydra runs (`overrides`)."""
from pipeline.config.compose import config_groups, exit_on_unknown_overrides, register_configs, resolved_dict, to_config
from pipeline.config.entries import CONF_DIR
from pipeline.config.overrides import exit_on_bad_overrides
from pipeline.config.schema import (
    AlignmentConfig,
    CaptureConfig,
    ConfigError,
    DataConfig,
    DiffConfig,
    DiffJobConfig,
    ExtractConfig,
    GateConfig,
    ModelConfig,
    ProbeConfig,
    RoutingFlipConfig,
    RunnerConfig,
    Thresholds,
)

__all__ = ["AlignmentConfig", "CaptureConfig", "CONF_DIR", "ConfigError", "DataConfig", "DiffConfig", "DiffJobConfig",
           "ExtractConfig", "GateConfig", "ModelConfig", "ProbeConfig", "RoutingFlipConfig", "RunnerConfig", "Thresholds",
           "config_groups", "exit_on_bad_overrides", "exit_on_unknown_overrides", "register_configs", "resolved_dict",
           "to_config"]
