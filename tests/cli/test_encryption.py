"""The CLI on an encrypted store directory: with the keys it reads everything; without, it
lists what is readable and says the rest is encrypted; nothing sealed is called damaged or
pruned unopened; ``re-encrypt`` seals again with the current key, skipping a live writer."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from checkpointer import CheckpointWriter, FileStore, JournalStore, Snapshot, load
from checkpointer._cli import main
from checkpointer.stores import Encryption
from tests.stores.sealed_cases import STATE, save

OLD = "old:" + "AQ" * 21 + "A="  # 32 bytes of 0x01.. in base64
NEW, OTHER = Encryption.new_key("new"), Encryption.new_key("other")


def run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str]:
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out + err


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """Two keys sealed with OLD: a snapshot file and a journal."""
    keys = Encryption.from_text(OLD)
    save(FileStore(tmp_path, encryption=keys), "snap")
    save(JournalStore(tmp_path, encryption=keys), "chat")
    return tmp_path


def key_file(tmp_path: Path, *keys: str) -> Path:
    path = tmp_path / "keys.txt"
    path.write_text("\n".join(keys) + "\n")
    path.chmod(0o600)
    return path


def test_with_the_key_every_command_reads_it(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ls, show and verify with --key-file read titles and messages; all ok."""
    keys = key_file(tmp_path / "..", OLD)
    status, out = run(capsys, "ls", root, "--key-file", keys)
    assert status == 0 and "my password" in out and "encrypted" not in out, out
    status, out = run(capsys, "verify", root, "--key-file", keys)
    assert status == 0 and "2 ok" in out, out
    status, out = run(capsys, "show", root, "snap", "--key-file", keys)
    assert status == 0 and "hunter2" in out, out


def test_the_environment_gives_the_keys(
    root: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """CHECKPOINTER_KEYS, when no --key-file is given."""
    monkeypatch.setenv("CHECKPOINTER_KEYS", f"{NEW},{OLD}")
    status, out = run(capsys, "verify", root)
    assert status == 0 and "2 ok" in out, out


def test_without_a_key_it_lists_and_says_encrypted_never_bad(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each is listed and said encrypted, not damaged: ls and verify succeed."""
    status, out = run(capsys, "ls", root, "--json")
    assert status == 0 and out.count("encrypted") == 2 and "hunter2" not in out, out
    rows = {row["key"]: row for row in json.loads(out)}
    assert rows["snap"]["seq"] == 2 and rows["snap"]["updated_at"], rows  # its readable meta
    status, out = run(capsys, "verify", root)
    assert (
        status == 0 and "2 not checked" in out and out.count("encrypted, and no key given") == 2
    ), out


def test_with_the_wrong_key_it_is_bad_but_prune_keeps_it(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A key that does not open them: reported (exit 1), and prune never removes them."""
    keys = key_file(tmp_path / "..", OTHER)
    status, out = run(capsys, "verify", root, "--key-file", keys)
    assert status == 1 and "'old'" in out, out
    past = time.time() - 30 * 86400
    for name in ("snap.json", "chat.jsonl"):
        os.utime(root / name, (past, past))
    options: list[list[str]] = [["--key-file", str(keys)], []]
    for given in options:
        status, out = run(capsys, "prune", root, "--older-than", "1d", *given)
        assert (root / "snap.json").exists() and (root / "chat.jsonl").exists(), out


def test_re_encrypt_seals_with_the_current_key_and_skips_a_live_writer(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rotation: the key a live writer holds is left (exit 1) and its file untouched; the
    writer writes on; run again after it closed, every checkpoint opens with NEW alone."""
    keys = key_file(tmp_path / "..", NEW, OLD)
    live_store = FileStore(root, encryption=Encryption.from_text(OLD))
    state = {"n": 1}
    with CheckpointWriter(lambda: Snapshot("snap", dict(state)), live_store, exit_hooks=False) as w:
        held = (root / "snap.json").read_bytes()
        status, out = run(capsys, "re-encrypt", root, "--key-file", keys)
        assert status == 1 and "a live writer holds it" in out, out
        assert (root / "snap.json").read_bytes() == held
        state["n"] = 2
        assert w.flush_sync().__class__.__name__ == "Written"
    status, out = run(capsys, "re-encrypt", root, "--key-file", keys)
    assert status == 0 and "2 sealed" in out, out
    only_new = Encryption.from_text(NEW)
    for store in (FileStore(root, encryption=only_new), JournalStore(root, encryption=only_new)):
        key = "snap" if type(store) is FileStore else "chat"
        loaded = load(store, key)
        assert loaded is not None
        assert loaded.state == ({"n": 2} if key == "snap" else STATE)


def test_re_encrypt_seals_plaintext_only_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store from before encryption: left until --plaintext, then sealed."""
    save(FileStore(tmp_path / "r"), "snap")
    keys = key_file(tmp_path, NEW)
    status, out = run(capsys, "re-encrypt", tmp_path / "r", "--key-file", keys)
    assert status == 1 and "plaintext" in out, out
    status, out = run(capsys, "re-encrypt", tmp_path / "r", "--key-file", keys, "--plaintext")
    assert status == 0, out
    assert b"hunter2" not in (tmp_path / "r" / "snap.json").read_bytes()
    loaded = load(FileStore(tmp_path / "r", encryption=Encryption.from_text(NEW)), "snap")
    assert loaded is not None and loaded.state == STATE


def test_a_bad_key_is_refused_without_being_printed(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key file or CHECKPOINTER_KEYS holding a bare key (no ``id:``): an error that
    never shows the key."""
    secret = NEW.partition(":")[2]
    status, out = run(capsys, "ls", root, "--key-file", key_file(tmp_path / "..", secret))
    assert status != 0 and "id:base64" in out and secret not in out and secret[:8] not in out
    monkeypatch.setenv("CHECKPOINTER_KEYS", secret)
    status, out = run(capsys, "ls", root)
    assert status != 0 and "id:base64" in out and secret not in out and secret[:8] not in out


def test_re_encrypt_says_what_it_cannot_read_and_goes_on(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A sealed file with its marker damaged, a plaintext one cut short: each left and
    said (never "--plaintext seals it" for the first), the others sealed, exit 1."""
    save(FileStore(root), "cut")
    (root / "cut.json").write_bytes((root / "cut.json").read_bytes()[:40])
    damaged = bytearray((root / "snap.json").read_bytes())
    damaged[damaged.find(b"checkpointer-sealed")] ^= 1
    (root / "snap.json").write_bytes(bytes(damaged))
    keys = key_file(tmp_path / "..", NEW, OLD)
    status, out = run(capsys, "re-encrypt", root, "--key-file", keys, "--plaintext")
    assert status == 1 and "1 sealed" in out and "2 left" in out, out
    left = {line.split()[1]: line for line in out.splitlines() if line.startswith("left")}
    assert "neither sealed nor plaintext" in left[str(root / "snap.json") + ":"], out
    assert "--plaintext" not in left[str(root / "snap.json") + ":"], out
    assert "cannot be read" in left[str(root / "cut.json") + ":"], out
    assert load(JournalStore(root, encryption=Encryption.from_text(NEW)), "chat") is not None


def test_without_a_key_it_names_the_key_id_and_only_claims_a_meta_it_has(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each says the key id it needs; the snapshot's meta is readable, the journal's is not
    (it is inside its sealed rows), and the summary does not call them a store of the
    user's own."""
    status, out = run(capsys, "verify", root)
    lines = {line.split()[1]: line for line in out.splitlines() if line.startswith("note")}
    snap, chat = lines[f"{root / 'snap.json'}:"], lines[f"{root / 'chat.jsonl'}:"]
    assert status == 0 and "key id 'old'" in snap and "key id 'old'" in chat, out
    assert "meta is readable" in snap and "meta" not in chat, out
    assert out.splitlines()[-1].endswith("2 not checked (encrypted)"), out


def test_a_key_file_binary_empty_or_open_to_others_is_said_so(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Raw key bytes, or no key: status 1 naming the file and the format, no traceback and
    no byte of it shown; mode 0644: used, with a warning naming it; a BOM and CRLF: read."""
    raw = tmp_path / ".." / "raw.key"
    raw.write_bytes(b"\x01\xe1\xff" + os.urandom(29))
    status, out = run(capsys, "ls", root, "--key-file", raw)
    assert status == 1 and "raw.key" in out and "id:base64" in out, out
    assert "Traceback" not in out and "\\x" not in out, out
    keys = key_file(tmp_path / "..", OLD)
    keys.chmod(0o644)
    status, out = run(capsys, "ls", root, "--key-file", keys)
    assert status == 0 and "my password" in out, out
    assert "open to others (mode 0644)" in out and str(keys) in out, out
    keys.chmod(0o600)
    status, out = run(capsys, "ls", root, "--key-file", keys)
    assert status == 0 and "open to others" not in out, out
    keys.write_text("\ufeff" + OLD + "\r\n")  # saved by Notepad: a BOM, CRLF
    status, out = run(capsys, "ls", root, "--key-file", keys)
    assert status == 0 and "my password" in out, out
    keys.write_text("\n")
    status, out = run(capsys, "ls", root, "--key-file", keys)
    assert status == 1 and "no key in it" in out, out
