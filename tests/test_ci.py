"""`.ci/run` on a machine like a CI runner's: not root, /usr/sbin off PATH."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.conftest import require

ROOT = Path(__file__).resolve().parent.parent


def _stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)


def test_ci_installs_with_sudo_when_not_root_and_finds_dovecot_in_sbin(tmp_path: Path) -> None:
    require(Path("/usr/sbin/dovecot").exists(), "dovecot is not installed in /usr/sbin")
    (tmp_path / ".ci").mkdir()
    shutil.copy(ROOT / ".ci" / "run", tmp_path / ".ci" / "run")
    stubs, venv, log = tmp_path / "stubs", tmp_path / ".venv" / "bin", tmp_path / "calls.log"
    stubs.mkdir()
    venv.mkdir(parents=True)
    for tool in ("dirname", "mkdir"):
        (stubs / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    _stub(stubs, "id", "echo 1000")
    _stub(stubs, "sudo", f'echo "sudo: $*" >> {log}; "$@"')
    _stub(stubs, "apt-get", f'echo "apt-get: $*" >> {log}')
    _stub(stubs, "redis-server", "true")
    _stub(stubs, "python3", '[ "$1" != -c ]')  # no ensurepip: python3-venv is missing
    _stub(venv, "pip", "true")
    _stub(venv, "python", "true")
    run = subprocess.run(
        ["/bin/bash", str(tmp_path / ".ci" / "run")],
        env={"PATH": str(stubs)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    calls = log.read_text().splitlines()
    assert "sudo: apt-get update -qq" in calls
    assert any(c.startswith("sudo: apt-get install") and "python3-venv" in c for c in calls)
    assert not any("dovecot-imapd" in c for c in calls), calls  # /usr/sbin/dovecot is there
