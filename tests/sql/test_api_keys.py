"""API keys in the database (db/functions/12_api_keys.sql, migration 024): made, listed and revoked by their
users and by administrators, checked by the service role only; the table readable by no end user, not even
through EXPLAIN or error messages; expired and revoked keys refused; bad input refused with a clear error
that changes nothing.

alice and bob are pgkb users mapped to their login roles, mallory a login role granted pgkb_user but mapped
to no pgkb user, svc a member of pgkb_service (the role the servers connect as)."""

from __future__ import annotations

import hashlib
import re

import psycopg
import pytest

KEY = re.compile(r"pgkb_([0-9a-f]{16})_([0-9a-f]{64})")
LATER = "now() + interval '90 days'"


@pytest.fixture
def world(db, steady_statistics):
    for user in ("alice", "bob"):
        db.execute("select kb.create_user(%s, %s)", [user, user])
    db.execute("grant pgkb_service to svc")  # role grants are cluster-wide: undone below
    db.execute("grant pgkb_user to mallory")
    yield db
    db.execute("revoke pgkb_service from svc")
    db.execute("revoke pgkb_user from mallory")


def create(conn, user: str | None, name: str = "laptop", expires: str = LATER) -> tuple[str, str]:
    """(key_id, api_key) of a new key."""
    return conn.execute(f"select * from kb.create_api_key(%s, %s, {expires})", [user, name]).fetchone()


def verify(svc, api_key: str) -> str | None:
    """kb_service.verify_api_key as the servers call it: the key id and the SHA-256 of the secret."""
    match = KEY.fullmatch(api_key)
    key_id, secret = match.groups() if match else (api_key[:20], api_key)
    digest = hashlib.sha256(secret.encode()).digest()
    return svc.execute("select kb_service.verify_api_key(%s, %s)", [key_id, digest]).fetchone()[0]


def snapshot(db) -> list:
    return db.execute("select * from kb.api_keys order by key_id").fetchall()


def listed(conn, user: str | None = None) -> dict[str, tuple]:
    """key_id -> (owner, name, status) of kb.list_api_keys."""
    return {r[0]: r[1:] for r in conn.execute("select key_id, owner, name, status from kb.list_api_keys(%s)", [user])}


def test_key_lifecycle(world, connect_as):
    alice, svc = connect_as("alice"), connect_as("svc")
    key_id, api_key = create(alice, None, "laptop")
    match = KEY.fullmatch(api_key)
    assert match and match.group(1) == key_id
    # only the hash of the secret is kept
    (row,) = snapshot(world)
    assert bytes(row[3]) == hashlib.sha256(match.group(2).encode()).digest()
    assert match.group(2) not in repr(row) and api_key not in repr(row)
    assert listed(alice) == {key_id: ("alice", "laptop", "active")}
    assert "secret" not in " ".join(c.name for c in alice.execute("select * from kb.list_api_keys()").description)

    assert verify(svc, api_key) == "alice"
    used = world.execute("select last_used_at from kb.api_keys").fetchone()[0]
    assert used is not None
    assert verify(svc, api_key) == "alice"  # used again within a minute: no write
    assert world.execute("select last_used_at from kb.api_keys").fetchone()[0] == used
    pushed = world.execute("update kb.api_keys set last_used_at = now() - interval '2 minutes' returning last_used_at")
    pushed = pushed.fetchone()[0]
    assert verify(svc, api_key) == "alice"  # last used over a minute ago: recorded again
    assert world.execute("select last_used_at from kb.api_keys").fetchone()[0] > pushed

    # a wrong secret, an unknown id: NULL, like a revoked key
    assert verify(svc, api_key[:-1] + ("0" if api_key[-1] != "0" else "1")) is None
    assert verify(svc, f"pgkb_{'0' * 16}_{match.group(2)}") is None

    revoked = alice.execute("select kb.revoke_api_key(%s)", [key_id]).fetchone()[0]
    assert verify(svc, api_key) is None
    assert listed(alice) == {key_id: ("alice", "laptop", "revoked")}
    assert alice.execute("select kb.revoke_api_key(%s)", [key_id]).fetchone()[0] == revoked  # the first time stays


def test_expired_keys_are_refused(world, connect_as):
    alice, svc = connect_as("alice"), connect_as("svc")
    key_id, api_key = create(alice, None, "short", "now() + interval '1 second'")
    assert verify(svc, api_key) == "alice"
    world.execute("update kb.api_keys set expires_at = now() - interval '1 millisecond'")
    assert verify(svc, api_key) is None
    assert listed(alice) == {key_id: ("alice", "short", "expired")}


def test_users_manage_their_own_keys_and_admins_everyones(world, connect_as):
    alice, bob = connect_as("alice"), connect_as("bob")
    alice_id, _ = create(alice, "alice", "a")  # naming oneself is fine
    bob_id, _ = create(bob, None, "b")
    admin_made, _ = create(world, "bob", "made-by-admin")
    assert set(listed(alice)) == {alice_id}
    assert set(listed(bob)) == {bob_id, admin_made}
    assert set(listed(world)) == {alice_id, bob_id, admin_made}  # administrators: everyone's
    assert set(listed(world, "alice")) == {alice_id}
    # an administrator revokes anyone's key
    world.execute("select kb.revoke_api_key(%s)", [bob_id])
    assert listed(bob)[bob_id][2] == "revoked"


def test_another_users_keys_cannot_be_listed_revoked_or_made(world, connect_as):
    alice, bob = connect_as("alice"), connect_as("bob")
    alice_id, alice_key = create(alice, None)
    before = snapshot(world)
    for user in ("alice", "nobody"):  # an existing and an unknown user: the same answer
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as e:
            bob.execute("select * from kb.list_api_keys(%s)", [user])
        assert str(e.value).startswith("only pgkb administrators may list API keys for another user")
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as e:
            create(bob, user)
        assert str(e.value).startswith("only pgkb administrators may create API keys for another user")
    # another user's key and a key that does not exist: the same error
    messages = []
    for key_id in (alice_id, "0123456789abcdef"):
        with pytest.raises(psycopg.errors.NoDataFound) as e:
            bob.execute("select kb.revoke_api_key(%s)", [key_id])
        messages.append(str(e.value).replace(key_id, "<id>"))
    assert messages[0] == messages[1]
    # a login role mapped to no pgkb user (mallory), and the service acting for nobody, own no key either
    for role in ("mallory", "svc"):
        with pytest.raises(psycopg.errors.NoDataFound):
            connect_as(role).execute("select kb.revoke_api_key(%s)", [alice_id])
    assert snapshot(world) == before
    assert verify(connect_as("svc"), alice_key) == "alice"


def test_end_users_cannot_read_the_key_table(world, connect_as):
    create(world, "bob", "bobs-key")
    for role in ("alice", "mallory", "svc"):
        conn = connect_as(role)
        for sql in (
            "select 1 from kb.api_keys limit 1",
            "explain analyze select 1 from kb.api_keys where name ^@ 'bob'",
            "explain select 1 from kb.api_keys where key_id ^@ '0'",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for table api_keys"):
                conn.execute(sql)
        assert conn.execute(
            "select has_table_privilege('kb.api_keys', 'SELECT') or has_any_column_privilege('kb.api_keys', 'SELECT')"
        ).fetchone() == (False,)
    for role in ("alice", "mallory"):  # checking keys is the service role's alone
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for schema kb_service"):
            connect_as(role).execute("select kb_service.verify_api_key('0123456789abcdef', '\\x00')")


def test_explain_over_the_list_learns_nothing(world, connect_as):
    """kb.list_api_keys is never inlined: a predicate on bob's key id or name plans and counts alike for a
    prefix that exists (bob's) and one that does not."""
    bob_id, _ = create(world, "bob", "bobs-key")
    alice = connect_as("alice")
    alice.execute("select * from kb.create_api_key(null, 'mine', now() + interval '1 day')")

    def plan(sql: str, value: str) -> list[str]:
        rows = [r[0] for r in alice.execute(f"explain (analyze, costs off, timing off, summary off) {sql}", [value])]
        return [re.sub(r"Memory(?: Usage)?: \d+kB", "", line).replace(value, "<v>") for line in rows]

    for sql, secret, nothing in [
        ("select 1 from kb.list_api_keys() where key_id ^@ %s", bob_id[:6], "zzzzzz"),
        ("select 1 from kb.list_api_keys() where name = %s", "bobs-key", "zzzz-key"),
        ("select 1 from kb.list_api_keys() where owner = %s", "bob", "zzz"),
    ]:
        assert plan(sql, secret) == plan(sql, nothing), sql
    assert not alice.execute("select 1 from kb.list_api_keys() where owner = 'bob'").fetchall()


def test_service_acting_for_a_user_cannot_make_keys(world, connect_as):
    svc = connect_as("svc")
    svc.execute("set pgkb.acting_user = 'alice'")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="not through pgkb.acting_user"):
        create(svc, None)
    assert snapshot(world) == []


def test_unmapped_role_has_no_keys(world, connect_as):
    mallory = connect_as("mallory")
    create(world, "alice")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="session user mallory is not a pgkb user"):
        create(mallory, None)
    assert listed(mallory) == {}


BAD_CREATE = [
    (None, "''", LATER, psycopg.errors.InvalidParameterValue, "an API key needs a name"),
    (None, "null", LATER, psycopg.errors.InvalidParameterValue, "an API key needs a name"),
    (None, "'  \t '", LATER, psycopg.errors.InvalidParameterValue, "an API key needs a name"),
    (None, "repeat('n', 101)", LATER, psycopg.errors.InvalidParameterValue, "is 101 characters long; at most 100"),
    (None, "repeat('名', 1000000)", LATER, psycopg.errors.InvalidParameterValue, "is 1000000 characters long"),
    (None, "E'a\\nb'", LATER, psycopg.errors.InvalidParameterValue, "control character"),
    (None, "'ok'", "'infinity'", psycopg.errors.InvalidParameterValue, "finite time in the future, got infinity"),
    (None, "'ok'", "'-infinity'", psycopg.errors.InvalidParameterValue, "finite time in the future"),
    (None, "'ok'", "now() - interval '1 second'", psycopg.errors.InvalidParameterValue, "finite time in the future"),
    (None, "'ok'", "now()", psycopg.errors.InvalidParameterValue, "finite time in the future"),
    (None, "'ok'", "null", psycopg.errors.InvalidParameterValue, "finite time in the future, got NULL"),
    (None, "'ok'", "'NaN'", psycopg.errors.InvalidDatetimeFormat, "invalid input syntax for type timestamp"),
    ("'nobody'", "'ok'", LATER, psycopg.errors.NoDataFound, 'unknown pgkb user "nobody"'),
    ("repeat('u', 5000)", "'ok'", LATER, psycopg.errors.NoDataFound, "unknown pgkb user"),
]


@pytest.mark.parametrize(("user", "name", "expires", "error", "message"), BAD_CREATE)
def test_bad_input_to_create_changes_nothing(world, user, name, expires, error, message):
    before = snapshot(world)
    with pytest.raises(error, match=re.escape(message)) as e:
        world.execute(f"select * from kb.create_api_key({user or 'null'}, {name}, {expires})")
    assert len(str(e.value)) < 500  # a huge input is never echoed whole
    assert snapshot(world) == before


@pytest.mark.parametrize(
    "key_id",
    ["", "xyz", "0123456789ABCDEF", "0123456789abcde", "0123456789abcdef0", "0123456789abcdef\n", None, "x" * 100_000],
)
def test_malformed_key_ids_are_refused(world, connect_as, key_id):
    alice = connect_as("alice")
    _, api_key = create(alice, None)
    before = snapshot(world)
    for attempt in (key_id, api_key):  # a whole key pasted by mistake is refused too, and never echoed
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="16 (lower-case )?hexadecimal digits") as e:
            alice.execute("select kb.revoke_api_key(%s)", [attempt])
        assert api_key not in str(e.value) and api_key[22:] not in str(e.value)
    assert snapshot(world) == before


@pytest.mark.parametrize(
    "presented",
    [
        "",
        "pgkb_",
        "pgkb__",
        "Bearer x",
        "pgkb_0123456789ABCDEF_" + "0" * 64,
        "pgkb_0123456789abcdef_" + "0" * 63,
        "\x01" * 10,
        "x" * 100_000,
    ],
)
def test_malformed_keys_are_refused_by_verify(world, connect_as, presented):
    svc = connect_as("svc")
    create(world, "alice")
    before = snapshot(world)
    assert verify(svc, presented) is None
    for key_id, digest in (("0123456789abcdef", b"short"), (None, None), ("0123456789abcdef", None)):
        assert svc.execute("select kb_service.verify_api_key(%s, %s)", [key_id, digest]).fetchone()[0] is None
    assert snapshot(world) == before


def test_verify_writes_nothing_on_a_read_only_session_and_never_waits(world, connect_as):
    """Last use is recorded at most once a minute, never in a read-only transaction (a standby is the same
    case), and never by waiting for a row another transaction holds (a revocation in progress)."""
    key_id, api_key = create(world, "alice")
    svc = connect_as("svc")
    svc.execute("set default_transaction_read_only = on")
    assert verify(svc, api_key) == "alice"
    assert world.execute("select last_used_at from kb.api_keys").fetchone()[0] is None
    svc.execute("set default_transaction_read_only = off")
    svc.execute("set lock_timeout = '200ms'")
    with world.transaction():
        world.execute("select 1 from kb.api_keys where key_id = %s for update", [key_id])
        assert verify(svc, api_key) == "alice"  # lock_timeout would raise had it waited
    assert world.execute("select last_used_at from kb.api_keys").fetchone()[0] is None
    assert verify(svc, api_key) == "alice"
    assert world.execute("select last_used_at from kb.api_keys").fetchone()[0] is not None


def test_a_blank_name_is_refused_however_it_is_blank(world, connect_as):
    """Issue 32, finding 6a: a name of a zero-width space was accepted (U+3000 alone was refused)."""
    alice = connect_as("alice")
    for name in ("\u200b", "\u3000", " \u200b\ufeff ", "\u2060"):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="needs a name"):
            create(alice, None, name)
    assert snapshot(world) == []


def counters(conn) -> tuple:
    return conn.execute(
        "select coalesce(sum(seq_tup_read), 0), coalesce(sum(idx_tup_fetch), 0), coalesce(sum(idx_scan), 0)"
        " from pg_stat_xact_user_tables where schemaname = 'kb' and relname in ('api_keys', 'users')"
    ).fetchone()


def test_revoking_another_users_key_reads_what_an_unknown_id_reads(world, connect_as):
    """Issue 32, finding 6b: bob's key id fetched an api_keys row (and 5 users rows) where an unknown id fetched
    none: the same error, but the counters told that the id exists."""
    alice, bob = connect_as("alice"), connect_as("bob")
    create(alice, None, "mine")
    bob_id, _ = create(bob, None)
    seen = []
    for key_id in ("0123456789abcdef", bob_id, "0123456789abcdef", bob_id):
        with alice.transaction():
            before = counters(alice)
            with pytest.raises(psycopg.errors.NoDataFound), alice.transaction():
                alice.execute("select kb.revoke_api_key(%s)", [key_id])
            seen.append(tuple(b - a for a, b in zip(before, counters(alice), strict=True)))
    assert seen[1] == seen[2] == seen[3], seen  # the first call also reads the session's first lookups


def test_a_whole_key_is_refused_and_never_logged(world, connect_as):
    """Issue 32, finding 6c: a whole key pasted into kb.revoke_api_key was written to the server log as the failed
    statement's text. It is refused by name, and the function logs no statement."""
    alice = connect_as("alice")
    key_id, api_key = create(alice, None)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="whole API key") as e:
        alice.execute(f"select kb.revoke_api_key('{api_key}')")
    assert api_key not in str(e.value) and KEY.fullmatch(api_key).group(2) not in str(e.value)
    assert listed(alice)[key_id][2] == "active"
    superuser = world.execute("select rolsuper from pg_roles where rolname = current_user").fetchone()[0]
    log = world.execute("select pg_read_file(coalesce(pg_current_logfile(), 'server.log'))").fetchone()[0]
    if superuser:
        assert KEY.fullmatch(api_key).group(2) not in log
