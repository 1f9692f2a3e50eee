"""The docs site builds in strict mode (every page in the nav, every link and anchor resolves), README.md's links
name files that exist, and the configuration reference is what the schemas give today."""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _mkdocs_build(config: Path, site_dir: Path) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` from the repository root (the snippets' base path), output kept for the message."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(config),
            "--site-dir",
            str(site_dir),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site_dir = tmp_path_factory.mktemp("site")
    result = _mkdocs_build(REPO / "mkdocs.yml", site_dir)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    return site_dir


def test_site_builds_strict(site):
    assert (site / "index.html").is_file()
    assert (site / "reference" / "configuration" / "index.html").is_file()
    # the included per-package READMEs and BENCHMARKS.md really were pulled in, not left as a directive
    benchmarks = (site / "benchmarks" / "index.html").read_text()
    assert "--8&lt;--" not in benchmarks and "bench/" in benchmarks


def test_broken_link_fails_the_build(tmp_path):
    """The check above can fail: the same site with one dead anchor and one missing page is refused."""
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs)
    with (docs / "limits.md").open("a") as page:
        page.write("\n[gone](eval.md#no-such-section) and [missing](no-such-page.md)\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text(
        re.sub(r"(?m)^docs_dir: .*$", f"docs_dir: {docs}", (REPO / "mkdocs.yml").read_text()), encoding="utf-8"
    )
    result = _mkdocs_build(config, tmp_path / "site")
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "no-such-section" in output and "no-such-page.md" in output, output


_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_readme_links_resolve(site):
    """Every relative link of README.md names a file; a link into docs/ with an anchor names a heading there."""
    problems = []
    for target in _LINK.findall((REPO / "README.md").read_text()):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        if not path:
            continue  # an anchor of the README itself
        if not (REPO / path).exists():
            problems.append(f"{target}: no file {path}")
        elif anchor and path.startswith("docs/") and path.endswith(".md"):
            page = Path(path).relative_to("docs").with_suffix("")
            html = site / ("index.html" if page.name == "index" else page / "index.html")
            if f'id="{anchor}"' not in html.read_text():
                problems.append(f"{target}: no heading #{anchor} in {path}")
    assert not problems, "README.md links that do not resolve:\n" + "\n".join(problems)


def test_readme_anchors_resolve():
    """README.md's own ``#anchor`` links name one of its headings (GitHub's slugs)."""
    text = (REPO / "README.md").read_text()
    slugs = {
        re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        for heading in re.findall(r"(?m)^#+ (.+)$", re.sub(r"(?s)```.*?```", "", text))
    }
    missing = [t for t in _LINK.findall(text) if t.startswith("#") and t[1:] not in slugs]
    assert not missing, f"README.md anchors without a heading: {missing}"


def test_config_reference_is_current():
    """docs/reference/configuration.md is exactly what the schemas render (regenerate it, never edit it)."""
    spec = importlib.util.spec_from_file_location("gen_config_reference", REPO / "docs" / "gen_config_reference.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    text, missing = generator.render(generator.entry_points())
    committed = (REPO / "docs" / "reference" / "configuration.md").read_text()
    assert committed == text, (
        "docs/reference/configuration.md is stale: run `uv run python docs/gen_config_reference.py` and commit it"
    )
    # every entry point's root schema has its section, and a known key with its description is rendered
    assert "[EvalMasterConfig](#evalmasterconfig)" in text and "\n## EvalMasterConfig\n" in text
    assert "| `num_tests_per_prompt` | int (>= 1) | `1` | Samples per task (n); any n >= 1. |" in text
    print(f"{len(missing)} config keys without a description (`docs/gen_config_reference.py --list-missing`)")
