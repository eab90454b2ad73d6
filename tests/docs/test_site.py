"""The documentation site builds in strict mode: a broken link, a missing page or anchor, a page in no toctree fails.

The configuration reference is generated from the typed schema: every key of every job's config is on it with a doc
line, so a key added without one fails here.
"""
from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
import typing

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from pipeline.config import register_configs
from pipeline.config.compose import JOBS
from tests.helpers import REPO
from tests.helpers.markers import CHROMIUM, needs_chromium

SPHINX = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html"]


def build(src, out) -> subprocess.CompletedProcess:
    return subprocess.run([*SPHINX, str(src), str(out)], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    proc = build(REPO / "docs", out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def test_the_site_builds_strictly(site):
    assert (site / "index.html").is_file() and (site / "reference" / "configuration.html").is_file()


@pytest.mark.parametrize("breakage", ["a link to a page that does not exist", "a link to a missing anchor"])
def test_a_broken_link_fails_the_build(tmp_path, breakage):
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs, ignore=shutil.ignore_patterns("_build"))
    target = "how-to/no-such-page.md" if "page" in breakage else "getting-started.md#no-such-heading"
    page = docs / "index.md"
    page.write_text(page.read_text() + f"\n\nSee [this]({target}).\n")
    proc = build(docs, tmp_path / "out")
    assert proc.returncode != 0
    assert "index.md" in proc.stderr and ("no-such-page" in proc.stderr or "no-such-heading" in proc.stderr)


def _schema_keys(schema: type, prefix: str = "") -> set[str]:
    """Every key the schema declares, walked here independently of the generator."""
    out = set()
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        hint, path = hints[f.name], prefix + f.name
        if prefix or not dataclasses.is_dataclass(hint):  # a top-level group is a section: test_every_group_...
            out.add(path)
        if dataclasses.is_dataclass(hint):
            out |= _schema_keys(hint, path + ".")
        elif typing.get_origin(hint) is dict and dataclasses.is_dataclass(typing.get_args(hint)[1]):
            out |= _schema_keys(typing.get_args(hint)[1], path + ".<dtype>.")
    return out


def _documented(page: str) -> dict[str, str]:
    """key -> its meaning cell, from the generated page's tables."""
    rows = re.findall(r"^\| `([^`]+)` \| [^|]* \| [^|]* \| ((?:[^|\\]|\\\|)*) \|", page, re.M)
    return {key: doc.strip() for key, doc in rows}


def test_every_schema_key_is_documented(site):
    page = (REPO / "docs/reference/configuration.md").read_text()
    documented = _documented(page)
    for schema in JOBS.values():
        keys = _schema_keys(schema)
        assert keys <= set(documented), sorted(keys - set(documented))
        assert not [k for k in keys if not documented[k]], [k for k in keys if not documented[k]]
    html = (site / "reference" / "configuration.html").read_text()
    assert "runner.storage_dtype" in html and "diff.thresholds.&lt;dtype&gt;.rel_l2" in html


def test_every_top_level_group_is_a_section_that_says_what_it_is(site):
    page = (REPO / "docs/reference/configuration.md").read_text()
    for schema in JOBS.values():
        hints = typing.get_type_hints(schema)
        for f in dataclasses.fields(schema):
            if dataclasses.is_dataclass(hints[f.name]):
                section = re.search(rf"^## {f.name}\n\n(.+)$", page, re.M)
                assert section and section.group(1).strip() and not section.group(1).startswith("|"), f.name


def _flat(node, prefix="") -> set[str]:
    if not isinstance(node, dict):
        return set()
    out = set()
    for key, value in node.items():
        path = f"{prefix}{key}"
        out.add(path)
        if path in ("engine.options", "model.sampling") or path.startswith("diff.reference"):
            continue  # engine options are documented per engine; sampling and entries are user-keyed mappings
        out |= _flat(value, path + ".")
    return out


@pytest.mark.parametrize("config_name", sorted(JOBS))
def test_every_composed_key_is_in_the_reference(site, config_name):
    """What Hydra really composes for each job (its conf/ defaults) is all in the reference."""
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose(config_name=config_name)
    composed = _flat(OmegaConf.to_container(cfg, resolve=False))
    composed = {re.sub(r"^diff\.thresholds\.[a-z0-9]+", "diff.thresholds.<dtype>", k) for k in composed}
    page = (REPO / "docs/reference/configuration.md").read_text()
    documented = set(_documented(page)) | set(re.findall(r"^## ([a-z_]+)$", page, re.M))  # groups are sections
    # a mapping is documented by its entries' rows (diff.thresholds.<dtype>.rel_l2, ...)
    documented |= {k for k in composed if any(d.startswith(k + ".") for d in documented)}
    assert composed - {"hydra"} <= documented, sorted(composed - documented)


def test_every_command_argument_is_in_the_reference(site):
    from tests.helpers.docblocks import ARGPARSE
    import importlib

    page = (REPO / "docs/reference/commands.md").read_text()
    for command, module in ARGPARSE.items():
        assert f"## {command}\n" in page
        for action in importlib.import_module(module).parser()._actions:
            name = (action.option_strings or [action.dest])[-1]
            if name != "--help":
                assert f"`{name}" in page or f", {name}" in page, (command, name)


@needs_chromium
@pytest.mark.parametrize("page", ["index.html", "reference/configuration.html"])
def test_pages_render_in_headless_chromium(site, tmp_path, page):
    shot = tmp_path / "page.png"
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           "--enable-logging=stderr", "--v=0", "--window-size=1280,1600",
                           f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
                           (site / page).as_uri()], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [line for line in proc.stderr.splitlines() if ":CONSOLE" in line] == []
    assert shot.stat().st_size > 20_000
