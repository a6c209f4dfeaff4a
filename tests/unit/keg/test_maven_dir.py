"""keg.embedded.kafka.ensure_maven_dir: Maven's own files stay out of keg's package.

Maven's dependency plugin writes `target/dependency-maven-plugin-markers/` beside the pom
it runs (the unpack goals' markers): run on the pom inside the package, that put a build
artefact into the source tree. A stand-in `mvn` here does what Maven does with its files
(markers beside the pom, artifacts into -DoutputDirectory) and records the pom it ran.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from keg.embedded.kafka import ensure_maven_dir, maven_dir_ready

FAKE_MVN = """#!/bin/sh
# Maven's file behaviour, no network: markers in target/ beside the -f pom, the
# artifact into -DoutputDirectory.
pom="" out=""
while [ $# -gt 0 ]; do
  case "$1" in
    -f) pom="$2"; shift ;;
    -DoutputDirectory=*) out="${1#-DoutputDirectory=}" ;;
  esac
  shift
done
echo "$pom" >> "$MVN_RAN"
mkdir -p "$(dirname "$pom")/target/dependency-maven-plugin-markers"
touch "$(dirname "$pom")/target/dependency-maven-plugin-markers/app.marker"
echo artifact > "$out/app.jar"
"""


@pytest.fixture
def fake_mvn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    if shutil.which("java") is None:
        pytest.skip("java is not installed (mvn needs it; keg checks it first)")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mvn = bin_dir / "mvn"
    mvn.write_text(FAKE_MVN)
    mvn.chmod(0o755)
    ran = tmp_path / "mvn-ran.txt"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("MVN_RAN", str(ran))
    return ran


def test_maven_writes_nothing_beside_the_packaged_pom(tmp_path: Path, fake_mvn: Path) -> None:
    package = tmp_path / "package"
    package.mkdir()
    pom = package / "registry-pom.xml"
    pom.write_text("<project/>")
    target = tmp_path / "cache" / "app-1"

    assert ensure_maven_dir(pom, target, ["dependency:unpack-dependencies"], "app") == target

    assert (target / "app.jar").read_text() == "artifact\n"
    assert maven_dir_ready(target, pom)
    assert sorted(p.name for p in package.iterdir()) == ["registry-pom.xml"]
    # Maven's scratch directory (its pom copy and target/) is gone from the cache too.
    assert sorted(p.name for p in target.parent.iterdir() if not p.name.endswith(".lock")) \
        == ["app-1"]
    (ran,) = fake_mvn.read_text().split()
    assert Path(ran).parent != package and not Path(ran).exists()


def test_a_ready_directory_runs_no_maven(tmp_path: Path, fake_mvn: Path) -> None:
    pom = tmp_path / "pom.xml"
    pom.write_text("<project/>")
    target = tmp_path / "cache" / "app-1"
    ensure_maven_dir(pom, target, ["dependency:unpack-dependencies"], "app")
    ensure_maven_dir(pom, target, ["dependency:unpack-dependencies"], "app")
    assert len(fake_mvn.read_text().split()) == 1
    pom.write_text("<project><!-- changed --></project>")
    assert not maven_dir_ready(target, pom)
    ensure_maven_dir(pom, target, ["dependency:unpack-dependencies"], "app")
    assert len(fake_mvn.read_text().split()) == 2
