"""KimiK25Config for the pipeline's tiny Kimi-K2.5-layout checkpoints (remote code: written by this project).

config.json's auto_map names this module, as the real checkpoint names its own, so loading the config with
trust_remote_code=True runs this file. It only parses config.json: the text model's config becomes a DeepseekV3Config
(Kimi's text model_type kimi_k2 is DeepSeek-V3), the vision config stays a plain dict. It imports transformers only.
"""
from transformers import DeepseekV3Config, PretrainedConfig


class KimiK25Config(PretrainedConfig):
    model_type = "kimi_k25"

    def __init__(self, text_config=None, vision_config=None, media_placeholder_token_id=None,
                 projection_hidden_size=None, **kwargs):
        if isinstance(text_config, dict):
            text_config = DeepseekV3Config(**{k: v for k, v in text_config.items() if k != "model_type"})
        self.text_config = text_config if text_config is not None else DeepseekV3Config()
        self.vision_config = dict(vision_config or {})
        self.media_placeholder_token_id = media_placeholder_token_id
        self.projection_hidden_size = projection_hidden_size
        super().__init__(**kwargs)

    def get_text_config(self, *args, **kwargs):
        return self.text_config
