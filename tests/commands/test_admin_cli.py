"""`pgkb user|team|kb` (pgkb.commands.user, team, kb) against the real database, as an administrator and as
ordinary users logged in as themselves (PGKB_DATABASE_URL naming their role): each command calls the SQL
functions of db/functions/14_lifecycle.sql and 10_identity.sql and prints what they return, or their error (exit 1);
a user sees and changes only what the SQL lets them. Usage mistakes exit 2 before the database is asked."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest
from pgkb.cli import main

DIM = 384  # the default model, multilingual-e5-small


def dsn(db, user: str | None = None) -> str:
    info = db.info
    return f"host={info.host} port={info.port} dbname={info.dbname} user={user or info.user}"


@pytest.fixture
def pgkb(db, monkeypatch, capsys):
    """pgkb(*args, role=None) -> (exit code, stdout, stderr) of `pgkb *args` logged in as ``role`` (default: the
    administrator)."""

    def run(*args: str, role: str | None = None) -> tuple[int, str, str]:
        monkeypatch.setenv("PGKB_DATABASE_URL", dsn(db, role))
        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def roles(db):
    """Login roles a test makes (role names are cluster-wide: unique ones, dropped afterwards)."""
    made: list[str] = []

    def name() -> str:
        made.append(f"admin_cli_{uuid.uuid4().hex[:8]}")
        return made[-1]

    yield name
    for role in made:
        db.execute(f"drop role if exists {role}")


def as_json(result: tuple[int, str, str]):
    code, out, err = result
    assert code == 0, err
    return json.loads(out)


def state(db) -> tuple:
    """What a refused command must leave as it was."""
    return tuple(
        db.execute(sql).fetchone()[0]
        for sql in (
            "select array_agg((name, db_role, is_admin)::text order by name) from kb.users",
            "select array_agg(name order by name) from kb.teams",
            "select array_agg((team_id, user_id)::text order by 1) from kb.memberships",
            "select array_agg((name, visibility, owner_id, team_id, chunk_count)::text order by name)"
            " from kb.knowledge_bases",
            "select count(*) from kb.chunks",
        )
    )


def test_an_administrator_runs_the_whole_lifecycle(db, pgkb, roles):
    login = roles()
    code, out, err = pgkb("user", "add", "alice", "--login", login)
    assert code == 0, err
    assert out.startswith(f'pgkb: user alice (login role {login}, created)\nnext: connect as {login}:\n  psql "')
    url = out.split('psql "', 1)[1].split('"', 1)[0]
    assert f"user={login}" in url
    assert db.execute("select pg_has_role(%s, 'pgkb_user', 'member')", [login]).fetchone() == (True,)
    with psycopg.connect(url) as conn:  # the printed next step works
        assert conn.execute("select username from kb.whoami()").fetchone() == ("alice",)
    again = as_json(pgkb("user", "add", "alice", "--login", login, "--json"))  # the role exists now
    assert again["login_created"] is False and again["login"] == login and f"user={login}" in again["url"]
    assert as_json(pgkb("user", "add", "bob", "--json"))["login"] is None

    assert pgkb("team", "add", "eng")[1] == "pgkb: team eng\n"
    for user in ("alice", "bob"):
        assert pgkb("team", "add-member", "eng", user)[1] == f"pgkb: {user} is in eng\n"
    assert as_json(pgkb("team", "list", "--json"))[0] | {"created_at": None} == {
        "name": "eng",
        "members": ["alice", "bob"],
        "created_at": None,
    }

    created = as_json(pgkb("kb", "create", "runbooks", "--owner", "alice", "--description", "ops", "--json"))
    assert (created["visibility"], created["owner"], created["team"], created["description"]) == (
        "private",
        "alice",
        None,
        "ops",
    )
    assert pgkb("kb", "share", "runbooks", "eng")[1] == "pgkb: knowledge base runbooks: team, owner alice, team eng\n"
    assert as_json(pgkb("kb", "visibility", "runbooks", "public", "--json"))["visibility"] == "public"
    db.execute(
        "select kb.replace_document('runbooks', 'r.md', 'r', %s::jsonb)",
        [json.dumps([{"content": "restart the service"}, {"content": "check the logs"}])],
    )
    users = {u["name"]: u for u in as_json(pgkb("user", "list", "--json"))}
    assert users["alice"]["db_role"] == login and users["alice"]["teams"] == ["eng"]
    assert users["alice"]["knowledge_bases"] == ["runbooks"]
    listed = {k["name"]: k for k in as_json(pgkb("kb", "list", "--json"))}
    assert listed["runbooks"]["documents"] == 1 and listed["runbooks"]["chunks"] == 2

    code, _, err = pgkb("user", "remove", "alice")  # she owns runbooks
    assert code == 1 and 'pgkb user "alice" owns 1 knowledge base(s): runbooks' in err
    assert pgkb("user", "remove", "alice", "--transfer-to", "bob")[1] == (
        "pgkb: user alice removed (1 knowledge base now bob's)\n"
    )
    assert db.execute("select pg_has_role(%s, 'pgkb_user', 'member')", [login]).fetchone() == (False,)
    assert as_json(pgkb("team", "remove-member", "eng", "bob", "--json"))["removed"] is True
    assert pgkb("team", "remove-member", "eng", "bob")[1] == "pgkb: bob was not in eng\n"

    assert pgkb("kb", "delete", "runbooks")[0] == 2  # not without --yes
    assert db.execute("select count(*) from kb.chunks").fetchone() == (2,)
    assert (
        pgkb("kb", "delete", "runbooks", "--yes")[1]
        == "pgkb: knowledge base runbooks deleted (1 documents, 2 chunks)\n"
    )
    assert "runbooks" not in {k["name"] for k in as_json(pgkb("kb", "list", "--json"))}


def test_the_doctor_is_clean_after_kb_delete(db, pgkb, monkeypatch, fake_embeddings):
    endpoint = fake_embeddings(lambda texts: [[1.0] + [0.0] * (DIM - 1) for _ in texts])
    db.execute("update kb.settings set value = %s where key = 'embedding_url'", [endpoint.url])
    monkeypatch.setenv("PGKB_EMBED_PROVIDER", "http")
    monkeypatch.setenv("PGKB_EMBED_URL", endpoint.url)
    monkeypatch.delenv("PGKB_EMBED_MODEL", raising=False)
    for name in ("kept", "gone"):
        pgkb("kb", "create", name)
        db.execute(
            "select kb.replace_document(%s, 'd.md', 'd', %s::jsonb)",
            [name, json.dumps([{"content": f"{name} text", "embedding": [1.0] + [0.0] * (DIM - 1)}])],
        )
    db.execute("select kb.replace_document('gone', 'queued.md', 'q', '[{\"content\": \"not embedded\"}]'::jsonb)")
    assert as_json(pgkb("kb", "delete", "gone", "--yes", "--json")) == {"deleted": "gone", "documents": 2, "chunks": 2}
    report = as_json(pgkb("db", "doctor", "--json"))
    assert report["healthy"], [c for c in report["checks"] if c["status"] == "problem"]


@pytest.fixture
def colleagues(db):
    """alice and bob in team eng, carol not; alice owns eng-team (team) and alice-private, bob bob-private, carol
    public-kb; mallory is a login role of pgkb_user mapped to no pgkb user."""
    for user in ("alice", "bob", "carol"):
        db.execute("select kb.create_user(%s, %s)", [user, user])
    db.execute("select kb.create_team('eng')")
    for user in ("alice", "bob"):
        db.execute("select kb.add_team_member('eng', %s)", [user])
    for name, visibility, owner, team in (
        ("eng-team", "team", "alice", "eng"),
        ("alice-private", "private", "alice", None),
        ("bob-private", "private", "bob", None),
        ("public-kb", "public", "carol", None),
    ):
        db.execute("select kb.create_knowledge_base(%s, %s, team => %s, owner => %s)", [name, visibility, team, owner])
        db.execute(
            "select kb.replace_document(%s, 'd.md', 'd', %s::jsonb)", [name, json.dumps([{"content": f"{name} text"}])]
        )
    db.execute("grant pgkb_user to mallory")  # a login role that is no pgkb user (role grants are cluster-wide)
    yield db
    db.execute("revoke pgkb_user from mallory")


def test_an_ordinary_user_sees_only_what_the_sql_shows_them(colleagues, pgkb):
    kbs = {k["name"]: k for k in as_json(pgkb("kb", "list", "--json", role="carol"))}
    assert set(kbs) == {"public-kb"} and kbs["public-kb"]["can_write"] is True
    code, out, _ = pgkb("kb", "list", role="bob")
    assert code == 0 and [line.split()[0] for line in out.splitlines()[1:]] == ["bob-private", "eng-team", "public-kb"]
    assert [u["name"] for u in as_json(pgkb("user", "list", "--json", role="bob"))] == ["bob"]
    assert as_json(pgkb("team", "list", "--json", role="bob"))[0]["members"] is None
    assert pgkb("team", "list", role="bob")[1] == f"{'eng':<24} (members: administrators only)\n"
    assert as_json(pgkb("team", "list", "--json", role="carol")) == []
    assert pgkb("user", "list", role="mallory")[1].endswith(
        "no pgkb users you may see (an unmapped login role sees none)\n"
    )


@pytest.mark.parametrize(
    ("role", "args", "message"),
    [
        ("carol", ("kb", "delete", "bob-private", "--yes"), 'unknown knowledge base "bob-private"'),
        ("carol", ("kb", "visibility", "eng-team", "public"), 'unknown knowledge base "eng-team"'),
        ("carol", ("kb", "share", "alice-private", "eng"), 'unknown knowledge base "alice-private"'),
        ("carol", ("kb", "share", "public-kb", "eng"), 'you are not a member of a team "eng"'),
        ("bob", ("kb", "share", "eng-team", "eng"), 'only the owner of knowledge base "eng-team"'),
        ("bob", ("kb", "visibility", "eng-team", "public"), 'only the owner of knowledge base "eng-team"'),
        ("bob", ("kb", "delete", "eng-team", "--yes"), 'only the owner of knowledge base "eng-team"'),
        ("bob", ("kb", "create", "eng-team", "--visibility", "public"), 'only the owner of knowledge base "eng-team"'),
        ("alice", ("kb", "create", "bob-private"), 'knowledge base name "bob-private" is not available'),
        ("alice", ("kb", "create", "mine", "--owner", "bob"), "only pgkb administrators may create knowledge bases"),
        ("alice", ("kb", "visibility", "alice-private", "secret"), 'invalid visibility "secret"'),
        ("alice", ("user", "add", "eve"), "only pgkb administrators may create users"),
        ("alice", ("user", "add", "eve", "--login", "eve_role"), "only pgkb administrators may create users"),
        ("alice", ("user", "remove", "bob", "--transfer-to", "alice"), "only pgkb administrators may remove users"),
        ("alice", ("team", "add", "evil"), "only pgkb administrators may create teams"),
        ("alice", ("team", "add-member", "eng", "carol"), "only pgkb administrators may change team membership"),
        (
            "alice",
            ("team", "remove-member", "eng", "bob"),
            "only pgkb administrators may remove other users from teams",
        ),
        ("carol", ("team", "remove-member", "eng", "carol"), 'you are not a member of a team "eng"'),
        ("mallory", ("kb", "create", "mallorys"), "session user mallory is not a pgkb user"),
        (None, ("user", "remove", "nobody"), 'unknown pgkb user "nobody"'),
        (None, ("team", "add-member", "nope", "alice"), 'unknown team "nope"'),
        (None, ("kb", "delete", "nope", "--yes"), 'unknown knowledge base "nope"'),
        (None, ("kb", "create", "has space"), 'invalid knowledge base name "has space"'),
        (None, ("user", "add", " "), 'invalid pgkb user name " "'),
        (None, ("user", "add", "a b", "--login", "eve_role"), 'invalid pgkb user name "a b"'),
        (None, ("team", "add", "x" * 101), "invalid team name"),
    ],
)
def test_what_the_sql_refuses_is_printed_and_changes_nothing(colleagues, pgkb, role, args, message):
    before = state(colleagues)
    code, out, err = pgkb(*args, role=role)
    assert (code, out) == (1, "") and message in err and "Traceback" not in err, err
    assert state(colleagues) == before
    assert colleagues.execute("select count(*) from pg_roles where rolname = 'eve_role'").fetchone() == (0,)


def test_an_owner_changes_and_deletes_their_own(colleagues, pgkb):
    shown = as_json(pgkb("kb", "visibility", "eng-team", "private", "--json", role="alice"))
    assert (shown["visibility"], shown["team"]) == ("private", "eng")
    assert "eng-team" not in {k["name"] for k in as_json(pgkb("kb", "list", "--json", role="bob"))}
    assert pgkb("kb", "share", "eng-team", "eng", role="alice")[0] == 0
    assert "eng-team" in {k["name"] for k in as_json(pgkb("kb", "list", "--json", role="bob"))}
    made = as_json(pgkb("kb", "create", "alice-team2", "--visibility", "team", "--team", "eng", "--json", role="alice"))
    assert (made["owner"], made["team"]) == ("alice", "eng")
    assert as_json(pgkb("kb", "delete", "alice-private", "--yes", "--json", role="alice"))["documents"] == 1
    assert pgkb("team", "remove-member", "eng", "alice", role="alice")[1] == "pgkb: alice removed from eng\n"
    assert as_json(pgkb("team", "list", "--json", role="alice")) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("user", "add"), "pgkb: user add needs NAME"),
        (("user", "remove"), "pgkb: user remove needs NAME"),
        (("team", "add"), "pgkb: team add needs TEAM"),
        (("team", "add-member", "eng"), "pgkb: team add-member needs TEAM USER"),
        (("team", "remove-member", "eng", "a", "b"), "pgkb: team remove-member needs TEAM USER"),
        (("team", "list", "x"), "pgkb: team list needs no names"),
        (("kb", "create"), "pgkb: kb create needs NAME"),
        (("kb", "share", "eng-team"), "pgkb: kb share needs NAME TEAM"),
        (("kb", "visibility", "eng-team"), "pgkb: kb visibility needs NAME private|team|public"),
        (("kb", "delete", "eng-team"), "pass --yes"),
    ],
)
def test_usage_mistakes_exit_2_and_change_nothing(colleagues, pgkb, args, message):
    before = state(colleagues)
    code, _, err = pgkb(*args)
    assert code == 2 and message in err, err
    assert state(colleagues) == before


def test_a_refusal_filed_as_an_operational_error_is_not_a_lost_connection(db, pgkb):
    """kb.use_embedding_model refuses with SQLSTATE 55000, which psycopg files under OperationalError: the
    command prints the database's message and hint, not "cannot reach the database"."""
    db.execute("select kb.register_embedding_model('other-model', 8, '', '')")
    db.execute("select kb.replace_document('kb-for-model', 'a.md', 'a', '[{\"content\": \"text\"}]'::jsonb)")
    code, _, err = pgkb("model", "use", "other-model")
    assert code == 1 and "cannot reach the database" not in err
    assert "have no" in err and "pgkb model use --force" in err


def test_model_add_and_list_say_how_a_model_is_stored(db, pgkb):
    """`pgkb model add` prints the storage it chose and why; `pgkb model list` shows it per model."""
    code, out, _ = pgkb("model", "add", "big-1024", "--dimension", "1024")
    assert code == 0 and "stored and indexed as halfvec (above 512 dimensions)" in out, out
    code, out, _ = pgkb("model", "add", "small-256", "--dimension", "256")
    assert code == 0 and "stored and indexed as vector (512 dimensions or fewer)" in out, out
    code, out, _ = pgkb("model", "add", "full-1024", "--dimension", "1024", "--storage", "vector")
    assert code == 0 and "stored and indexed as vector;" in out, out
    code, out, _ = pgkb("model", "list")
    storage = {line.split()[0]: line.split()[2] for line in out.splitlines()[1:]}
    assert storage == {"multilingual-e5-small": "vector", "big-1024": "halfvec", "small-256": "vector",
                       "full-1024": "vector"}  # fmt: skip
    code, _, err = pgkb("model", "add", "big-1024", "--dimension", "1024", "--storage", "vector")
    assert code != 0 and "stored as halfvec, not vector" in err, err
