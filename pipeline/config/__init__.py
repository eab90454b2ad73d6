"""Typed configuration: the schema of conf/ (`schema`), each job's primary config composed and validated (`compose`),
the diff's engine entries (`entries`), the Hydra entry points' one runner (`command`: composed once, validated before
anything is built; a sweep's overrides checked by `overrides`) and whose settings a model gets (`model_group`: a
user's checkpoint never inherits a tiny model's)."""
from pipeline.config.compose import check_override_keys, config_groups, register_configs, resolved_dict, to_config
from pipeline.config.entries import CONF_DIR
from pipeline.config.model_group import check_model_group
from pipeline.config.overrides import check_overrides
from pipeline.config.regen_schema import RegenerateConfig, SamplingConfig
from pipeline.core.cli import ConfigError
from pipeline.config.schema import (
    AlignmentConfig,
    CaptureConfig,
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
           "check_model_group", "check_override_keys", "check_overrides", "config_groups", "register_configs",
           "resolved_dict", "to_config"]
