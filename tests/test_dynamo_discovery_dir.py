"""Dynamo's file discovery in a directory another local user could write.

Dynamo's file backend trusts every entry in its directory: an entry names the TCP address a
client sends its requests to.  Another user who made the directory first (``/tmp/dyn`` of the
examples, or Dynamo's own default ``/tmp/dynamo_store_kv``) could plant an instance that
receives every request, and remove ours.  So a worker, a client and the engine's Dynamo door
refuse such a directory, in one line, before any runtime starts; a missing one is made 0700.
The attacker is a real process of another uid (``tests/other_user.py``) where root is had.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from other_user import OTHER_UID, needs_other_user, run_as_other_user
from serve_support import cli, echo_backend, make_env, new_root

from worker_sdk.dynamo.loader import UnsafeDiscoveryDir, secure_discovery_dir

ROOT = Path(__file__).resolve().parents[1]
ECHO = ROOT / "examples" / "echo" / "main.py"

MAKE_SHARED = ("import os, sys; os.umask(0); "
               "os.makedirs(os.path.join(sys.argv[1], 'v1', 'instances'), 0o777)")


@pytest.fixture
def place() -> Iterator[Path]:
    """A sticky, world-writable directory like /tmp (tmp_path is not reachable by others)."""
    path = Path(tempfile.mkdtemp(prefix="vt-dynkv-", dir="/tmp"))
    os.chmod(path, 0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def file_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in [n for n in os.environ if n.startswith("DYN_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("DYN_DISCOVERY_BACKEND", "file")
    return monkeypatch


def test_a_missing_directory_is_made_private_and_given_to_dynamo_links_resolved(
        file_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    target = tmp_path / "kv"
    file_env.setenv("DYN_FILE_KV", str(target))
    assert secure_discovery_dir() == str(target)
    assert stat.S_IMODE(target.stat().st_mode) == 0o700
    link = tmp_path / "link"
    link.symlink_to(target)
    file_env.setenv("DYN_FILE_KV", str(link))
    assert secure_discovery_dir() == str(target)
    assert os.environ["DYN_FILE_KV"] == str(target)
    os.chmod(target, 0o755)  # made by hand: others could read the instance ids (a request's key)
    secure_discovery_dir()
    assert stat.S_IMODE(target.stat().st_mode) == 0o700


def test_dynamos_default_is_checked_too(file_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    file_env.delenv("DYN_FILE_KV", raising=False)
    file_env.setenv("TMPDIR", str(tmp_path))
    assert secure_discovery_dir() == str(tmp_path / "dynamo_store_kv")
    file_env.setenv("DYN_DISCOVERY_BACKEND", "etcd")
    assert secure_discovery_dir() is None


@pytest.mark.parametrize("where", ["", "v1/instances"])
def test_a_directory_of_ours_others_could_write_is_made_private_and_checked(
        file_env: pytest.MonkeyPatch, tmp_path: Path, where: str) -> None:
    """Ours but open to all (a chmod, a umask of 0): made 0700, then nothing in it may be
    another's or a link (a group-writable one is what umask 002 gives everyone: no refusal)."""
    kv = tmp_path / "kv"
    (kv / "v1" / "instances").mkdir(parents=True)
    os.chmod(kv / where, 0o777)
    (kv / "v1" / "instances" / "ours").write_text("{}")
    file_env.setenv("DYN_FILE_KV", str(kv))
    assert secure_discovery_dir() == str(kv)
    assert stat.S_IMODE(kv.stat().st_mode) == 0o700
    planted = kv / "v1" / "instances" / "planted"
    planted.symlink_to("/etc/passwd")
    with pytest.raises(UnsafeDiscoveryDir) as caught:
        secure_discovery_dir()
    message = str(caught.value)
    assert "\n" not in message and f"holds {planted}, which is a link" in message, message
    assert "receive your requests" in message
    if os.geteuid() == 0:  # (a file another user left there while it was open)
        planted.unlink()
        planted.write_text("{}")
        os.chown(planted, 65534, 65534)
        with pytest.raises(UnsafeDiscoveryDir, match="which belongs to uid 65534"):
            secure_discovery_dir()


@needs_other_user
@pytest.mark.process
def test_a_directory_another_user_made_first_is_refused(
        file_env: pytest.MonkeyPatch, place: Path) -> None:
    shared = place / "dyn"
    done = run_as_other_user(MAKE_SHARED, shared)
    assert done.returncode == 0, done.stderr
    file_env.setenv("DYN_FILE_KV", str(shared))
    with pytest.raises(UnsafeDiscoveryDir, match=f"belongs to uid {OTHER_UID}"):
        secure_discovery_dir()
    link = place / "mine"  # a link another user planted, to a directory of theirs
    run_as_other_user("import os, sys; os.symlink(sys.argv[1], sys.argv[2])", shared, link)
    file_env.setenv("DYN_FILE_KV", str(link))
    with pytest.raises(UnsafeDiscoveryDir, match=f"that is {shared}"):
        secure_discovery_dir()


@needs_other_user
@pytest.mark.process
def test_a_worker_client_and_engine_refuse_another_users_directory(place: Path) -> None:
    pytest.importorskip("dynamo.runtime", reason="needs ai-dynamo-runtime (the dynamo extra)")
    from worker_sdk.dynamo.client import Client

    shared = place / "dyn"
    assert run_as_other_user(MAKE_SHARED, shared).returncode == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYN_")}
    env.update(DYN_LOG="error",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    worker = subprocess.run(
        [sys.executable, "-m", "worker_sdk.dynamo", str(ECHO), "--endpoint", "a.b.generate",
         "--discovery-dir", str(shared)],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
    assert worker.returncode == 4, worker.stderr
    [line] = worker.stderr.strip().splitlines()
    assert f"{shared} belongs to uid {OTHER_UID}" in line, worker.stderr
    assert list((shared / "v1" / "instances").iterdir()) == []  # nothing was advertised there

    with pytest.raises(UnsafeDiscoveryDir, match="belongs to"):
        Client("a.b.generate", discovery_dir=str(shared))

    root = new_root()
    try:
        engine_env = {k: v for k, v in make_env(root, [echo_backend()]).items()
                      if not k.startswith("DYN_")}
        engine_env.update(DYN_DISCOVERY_BACKEND="file", DYN_FILE_KV=str(shared),
                          DYN_REQUEST_PLANE="tcp", DYN_EVENT_PLANE="zmq")
        done = cli(engine_env, "--serve", "--gpus", "sim:8GiB", "--backends",
                   engine_env["VRAMTUI_TEST_BACKENDS"], "--dynamo", "t")
        assert done.returncode == 1, done.stderr
        last = done.stderr.splitlines()[-1]
        assert last.startswith("vramtui --serve: Dynamo could not start: the Dynamo discovery "
                               f"directory {shared} belongs to uid {OTHER_UID}"), done.stderr
        assert list((shared / "v1" / "instances").iterdir()) == []
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_an_entry_that_goes_while_it_is_checked_is_no_refusal(
        file_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Our other workers write there meanwhile: Dynamo writes an entry as ``.tmp_<id>``, links
    it to its name and unlinks the temporary (and removes an entry when its worker stops), so
    a name listed a moment ago may be gone when it is looked at; that is no reason to refuse
    the directory (a second worker started at once exited 4)."""
    kv = tmp_path / "kv"
    instances = kv / "v1" / "instances"
    instances.mkdir(parents=True)
    os.chmod(kv, 0o700)
    gone = instances / ".tmp_c6ad2cb2c772cea3"
    gone.write_text("{}")
    (instances / "a%2Fb%2Fgenerate%2F98283f4bdd22ceb7").write_text("{}")
    real_lstat = os.lstat

    def lstat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        if os.fspath(path) == str(gone) and gone.exists():  # another worker, between the two
            gone.unlink()
        return real_lstat(path, *args, **kwargs)  # type: ignore[arg-type]

    file_env.setattr(os, "lstat", lstat)
    file_env.setenv("DYN_FILE_KV", str(kv))
    assert secure_discovery_dir() == str(kv)
    assert not gone.exists()
