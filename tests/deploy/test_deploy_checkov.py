"""checkov on the chart's rendered manifests and on the OpenTofu modules: no failed
check, and every check skipped says why, where it is skipped."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from deploy_helpers import DEPLOY, explain, run_tool
from test_deploy_helm import ETCD_CHART, ETCD_VALUES, KUBE, VALUES, template, write_values

pytestmark = pytest.mark.timeout(3000)
# checkov's inline skips: `#checkov:skip=CKV_X:why` (HCL), `checkov.io/skipN: CKV_X=why`
# (a manifest's annotation).
SKIP = re.compile(r"checkov(?::skip=|\.io/skip\d+:\s*)(CKV\w*_\d+)[:=]?(.*)")


def test_chart_manifests_pass_checkov(helm: Path, checkov: Path, tmp_path: Path) -> None:
    done = run_tool([*template(helm), "-f", write_values(tmp_path, VALUES)])
    assert done.returncode == 0, explain(done)
    rendered = tmp_path / "rendered" / "meridian.yaml"
    rendered.parent.mkdir()
    rendered.write_text(done.stdout)
    done = run_tool(
        [helm, "template", "etcd", ETCD_CHART, "--namespace", "meridian-etcd", "--kube-version",
         KUBE, "-f", write_values(tmp_path, ETCD_VALUES)]
    )  # fmt: skip
    assert done.returncode == 0, explain(done)
    (rendered.parent / "etcd.yaml").write_text(done.stdout)
    done = run_tool(
        [checkov, "--directory", rendered.parent, "--framework", "kubernetes", "--compact",
         "--quiet", "--skip-download"]
    )  # fmt: skip
    assert done.returncode == 0, explain(done)
    assert "Passed checks:" in done.stdout, explain(done)


def test_terraform_modules_pass_checkov(checkov: Path) -> None:
    """The modules hold only helm releases and a namespace, for which checkov has few
    checks: what matters is that it parses them all and fails none (the workloads
    themselves are checked as rendered manifests above)."""
    done = run_tool(
        [checkov, "--directory", DEPLOY / "terraform", "--framework", "terraform", "--quiet",
         "--skip-download", "--output", "json"]
    )  # fmt: skip
    assert done.returncode == 0, explain(done)
    report = json.loads(done.stdout)
    summary = report.get("summary", report)
    assert summary["failed"] == 0 and summary["parsing_errors"] == 0, explain(done)


def test_every_skip_is_justified_in_place() -> None:
    skips = 0
    for path in sorted(DEPLOY.rglob("*")):
        if path.suffix not in {".tf", ".yaml", ".tpl"} or ".terraform" in path.parts:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            match = SKIP.search(line)
            if match:
                skips += 1
                why = match.group(2).strip(" \"'")
                assert len(why.split()) >= 4, f"{path}:{number}: {match.group(1)} skipped unsaid"
    assert skips < 30, "so many skips hide real findings"
