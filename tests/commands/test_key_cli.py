"""`pgkb key create|list|revoke` (pgkb.commands.key) as a subprocess against the real database: a user manages
their own keys through their own login, an administrator anyone's (--user); bad input is a clear error that
changes nothing."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # runs `pgkb key` in a subprocess per test

KEY = re.compile(r"pgkb_([0-9a-f]{16})_([0-9a-f]{64})")


@pytest.fixture
def users(db):
    for user in ("alice", "bob"):
        db.execute("select kb.create_user(%s, %s)", [user, user])
    return db


def key(db, *args: str, role: str | None = None) -> subprocess.CompletedProcess:
    """`pgkb key *args` logged in as ``role`` (default: the administrator)."""
    info = db.info
    dsn = f"host={info.host} port={info.port} dbname={info.dbname} user={role or info.user}"
    return subprocess.run(
        [sys.executable, "-m", "pgkb.cli", "key", *args],
        env={**os.environ, "PGKB_DATABASE_URL": dsn},
        capture_output=True,
        text=True,
        timeout=120,
    )


def keys(db) -> list:
    return db.execute("select * from kb.api_keys order by key_id").fetchall()


def test_a_user_creates_lists_and_revokes_their_own_keys(users):
    made = key(users, "create", "laptop", role="alice")
    assert made.returncode == 0, made.stderr
    match = KEY.fullmatch(made.stdout.strip())  # the key alone on stdout
    assert match, made.stdout
    key_id = match.group(1)
    assert f"API key {key_id} ('laptop') for alice, expires " in made.stderr and "shown only this once" in made.stderr
    expires = users.execute("select expires_at - created_at from kb.api_keys").fetchone()[0]
    assert round(expires.total_seconds() / 86400) == 90  # the default

    listed = key(users, "list", role="alice")
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split()[:3] == ["key_id", "owner", "status"]
    assert row.split()[:3] == [key_id, "alice", "active"] and row.split()[-2:] == ["never", "laptop"]
    assert match.group(2) not in listed.stdout

    as_json = key(users, "create", "dify", "--expires", "12h", "--json", role="alice")
    record = json.loads(as_json.stdout)
    assert set(record) == {"key_id", "api_key", "owner", "name", "expires_at"} and record["owner"] == "alice"
    assert KEY.fullmatch(record["api_key"]).group(1) == record["key_id"]

    # a whole key is accepted to revoke it (its secret is dropped before the database sees it)
    revoked = key(users, "revoke", made.stdout.strip(), role="alice")
    assert revoked.returncode == 0, revoked.stderr
    assert revoked.stdout.startswith(f"pgkb: API key {key_id} revoked (")
    statuses = {r["key_id"]: r["status"] for r in json.loads(key(users, "list", "--json", role="alice").stdout)}
    assert statuses == {key_id: "revoked", record["key_id"]: "active"}


def test_administrator_manages_anyones_keys_and_users_only_their_own(users):
    made = key(users, "create", "for-bob", "--user", "bob", "--expires", "2099-01-31T18:00+08:00")
    assert made.returncode == 0, made.stderr
    bob_key = KEY.fullmatch(made.stdout.strip()).group(1)
    assert users.execute("select expires_at from kb.api_keys").fetchone()[0].isoformat() == "2099-01-31T10:00:00+00:00"
    # alice can neither list nor revoke bob's keys, nor make one for him
    before = keys(users)
    for args, message in [
        (("list", "--user", "bob"), "only pgkb administrators may list API keys for another user"),
        (("create", "x", "--user", "bob"), "only pgkb administrators may create API keys for another user"),
        (("revoke", bob_key), f"unknown API key {bob_key}"),
    ]:
        done = key(users, *args, role="alice")
        assert done.returncode == 1 and message in done.stderr, (args, done.stderr)
    assert key(users, "list", role="alice").stdout.splitlines()[1:] == []
    assert keys(users) == before
    # the administrator sees and revokes it
    assert [r["owner"] for r in json.loads(key(users, "list", "--json").stdout)] == ["bob"]
    assert key(users, "list", "--user", "bob", "--json").stdout.count(bob_key) == 1
    assert key(users, "revoke", f"pgkb_{bob_key}").returncode == 0


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (("create",), 2, "pgkb: key create needs NAME"),
        (("revoke",), 2, "pgkb: key revoke needs KEY_ID"),
        (("create", ""), 2, "pgkb: key create needs NAME"),
        (("create", "   "), 1, "an API key needs a name"),
        (("create", "n" * 101), 1, "the API key name is 101 characters long; at most 100 are accepted"),
        (("create", "x", "--expires", "NaN"), 2, "--expires must be days (90d), hours (12h) or a date / time"),
        (("create", "x", "--expires", "inf"), 2, "--expires must be days (90d)"),
        (("create", "x", "--expires", "infinity"), 2, "--expires must be days (90d)"),
        (("create", "x", "--expires=-5d"), 2, "--expires must be days (90d)"),
        (("create", "x", "--expires", "999999d"), 2, "--expires must be days (90d)"),
        (("create", "x", "--expires", "0d"), 1, "expires_at must be a finite time in the future"),
        (("create", "x", "--expires", "2001-01-01"), 1, "expires_at must be a finite time in the future"),
        (("create", "x", "--user", "nobody"), 1, 'unknown pgkb user "nobody"'),
        (("revoke", "xyz"), 1, "an API key id is 16 lower-case hexadecimal digits"),
        (("revoke", "0123456789abcdef"), 1, "unknown API key 0123456789abcdef"),
        (("list", "--user", "nobody"), 1, 'unknown pgkb user "nobody"'),
    ],
)
def test_bad_input_is_a_clear_error_that_changes_nothing(users, args, status, message):
    key(users, "create", "existing")
    before = keys(users)
    done = key(users, *args)
    assert done.returncode == status and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and keys(users) == before
