"""`python -m pipeline.extract [overrides]`: capture hidden states into verified, provenance-carrying shards."""
from __future__ import annotations

import logging
import sys

from pipeline.core.cli import ExitCode, interrupts_from_here, os_error_text, run_command

interrupts_from_here(__name__, "extract")  # before the imports below (seconds): Ctrl-C there is one line too

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from pipeline.config import (CONF_DIR, ConfigError, check_model_group, exit_on_bad_overrides,  # noqa: E402
                             model_group_overrides, register_configs)
from pipeline.core.claim import ClaimLost, DirBusy  # noqa: E402
from pipeline.engines.base import EngineStartError  # noqa: E402
from pipeline.factory import build_step  # noqa: E402
from pipeline.run.gate import DiffGateError, describe, describe_storage  # noqa: E402
from pipeline.run.answers import answers_line  # noqa: E402
from pipeline.run.job import NoValidRecords, count_text, run_extract  # noqa: E402

register_configs()
log = logging.getLogger("pipeline.extract")


def os_error_line(e: OSError) -> str:
    return (f"run stopped, no manifest written: {os_error_text(e)}; finished shards are kept: fix the cause and rerun "
            f"the same command to resume (hydra.verbose=pipeline shows the traceback)")


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def extract(cfg: DictConfig) -> None:
    try:
        check_model_group(cfg)  # a tiny model's settings never apply to a user's checkpoint
        build_step(cfg)  # the tiny model a recipe names, built when missing: the job's first step
        summary = run_extract(cfg)
    except ConfigError as e:
        log.error("configuration error: %s", e)
        sys.exit(e.exit_code)
    except EngineStartError as e:  # before any shard; the engine's traceback with hydra.verbose=pipeline
        log.debug("the engine's error in full", exc_info=e.__cause__)
        where = "hydra.verbose=pipeline shows" if e.__cause__ else "the engine actor's Ray log holds"
        log.error("%s; nothing was written (%s the engine's traceback)", e, where)
        sys.exit(e.exit_code)
    except DiffGateError as e:  # before any shard: the report says why
        log.error("stopped by the diff gate: %s", e)
        sys.exit(e.exit_code)
    except NoValidRecords as e:
        log.error("%s", e)
        sys.exit(e.exit_code)
    except DirBusy as e:  # nothing was touched
        log.error("%s", e)
        sys.exit(e.exit_code)
    except ClaimLost as e:
        log.error("run stopped, no manifest written: %s", e)
        sys.exit(e.exit_code)
    except OSError as e:  # a full disk, a read-only mount, a failing device: one line, the traceback on request
        log.debug("the error in full", exc_info=e)
        log.error("%s", os_error_line(e))
        sys.exit(ExitCode.FAILED)
    except RuntimeError as e:  # e.g. units that failed after all retries: the run stays unfinished (no manifest)
        log.error("run failed, no manifest written (rerun the same command to resume): %s", e)
        sys.exit(ExitCode.FAILED)
    print(f"run directory: {summary.out_dir.resolve()}")
    reasons = f"{count_text(summary.rejects_by_reason)}; " if summary.rejects_by_reason else ""
    print(f"wrote {summary.num_samples} samples, {summary.num_tokens} tokens in {summary.num_shards} shard(s) "
          f"({summary.resumed_shards} finished earlier); {summary.num_rejects} rejected "
          f"({reasons}see rejects.parquet); {summary.num_truncated} truncated to data.max_length; "
          f"{summary.seconds:.1f}s")
    print(f"capture points: {', '.join(summary.points)}")
    if (line := answers_line(summary.regeneration, summary.engine)) is not None:
        print(line)
    for line in describe(summary.gate, summary.seconds) + describe_storage(summary.storage, summary.gate):
        print(line)
    print(f"check it with: python -m pipeline.verify {summary.out_dir}")


def main() -> int:
    """`python -m pipeline.extract` and the console script `pipeline-extract`: overrides from sys.argv."""
    exit_on_bad_overrides(sys.argv[1:])
    sys.argv[1:] = model_group_overrides(sys.argv[1:])  # model.path without a model group: model=local
    return run_command(extract)


if __name__ == "__main__":
    sys.exit(main())
