"""Typed configuration: the schema of conf/ (`schema`), each job's primary config composed and validated (`compose`),
the diff's engine entries (`entries`), the entry points' overrides checked before Hydra runs (`overrides`) and whose
settings a model gets (`model_group`: a user's checkpoint never inherits a tiny model's)."""
from pipeline.config.compose import config_groups, exit_on_unknown_overrides, register_configs, resolved_dict, to_config
from pipeline.config.entries import CONF_DIR
from pipeline.config.model_group import check_model_group, model_group_overrides
from pipeline.config.overrides import exit_on_bad_overrides
from pipeline.config.regen_schema import RegenerateConfig, SamplingConfig
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
           "ExtractConfig", "GateConfig", "ModelConfig", "ProbeConfig", "RegenerateConfig", "RoutingFlipConfig", "RunnerConfig",
           "SamplingConfig", "Thresholds",
           "check_model_group", "config_groups", "exit_on_bad_overrides", "exit_on_unknown_overrides",
           "model_group_overrides", "register_configs", "resolved_dict", "to_config"]
