"""The regeneration directory's owner: its layout and lifecycle kind (`layout`), the samples extract reads from it
(`reader`) and its verifier (`verify`, what `python -m pipeline.verify` runs on it). Nothing else names its files."""
from pipeline.data.regeneration.layout import (KIND, LAYOUT, LOCK, MANIFEST, RECORDS_DIR, REGEN_DIR, REGEN_FORMAT_VERSION,
                                               REJECTS, SCHEMA, START_FILE, TURN, conversation_id, is_regeneration,
                                               iter_conversations, manifest_digest, part_name, part_paths,
                                               read_manifest)
from pipeline.data.regeneration.reader import (RegeneratedData, answers_of, answers_record, generated_mask,
                                               read_regenerated)

__all__ = ["KIND", "LAYOUT", "LOCK", "MANIFEST", "RECORDS_DIR", "REGEN_DIR", "REGEN_FORMAT_VERSION", "REJECTS", "SCHEMA",
           "START_FILE", "TURN", "RegeneratedData", "answers_of", "answers_record", "conversation_id",
           "generated_mask", "is_regeneration", "iter_conversations", "manifest_digest", "part_name", "part_paths",
           "read_manifest", "read_regenerated"]
