"""Issue 9 L2: the MCP server never sees more than the user it acts for. It refuses to serve as a role that
bypasses visibility (superuser, BYPASSRLS, pgkb administrator, owner of schema kb), and every read path
(search, get_document, list_knowledge_bases, kb:// resources) applies the acting user's visibility. Real
SDK client sessions over stdio against the test database; the world is test_mcp's."""

from __future__ import annotations

import subprocess
import sys

import anyio
import pytest
from mcp import Client, MCPError
from test_mcp import server_env, stdio_params, text_of, world  # noqa: F401  (world is a fixture)


def _dsn(db, user: str) -> str:
    info = db.info
    return f"host={info.host} port={info.port} dbname={info.dbname} user={user}"


@pytest.fixture
def privileged_roles(world):  # noqa: F811
    """Login roles that see everything: a BYPASSRLS service, a pgkb_admin service, a mapped admin user."""
    roles = {"bypasser": "bypassrls", "adminsvc": "", "adminuser": ""}
    for role, attrs in roles.items():
        world.execute(f"drop role if exists {role}")
        world.execute(f"create role {role} login {attrs}")
        world.execute(f"grant pgkb_service to {role}")
    world.execute("grant pgkb_admin to adminsvc")
    world.execute("select kb.create_user('adminuser', 'adminuser', true)")
    yield world, list(roles)
    world.execute("delete from kb.users where name = 'adminuser'")
    for role in roles:
        world.execute(f"drop owned by {role}")
        world.execute(f"drop role {role}")


@pytest.mark.slow
def test_refuses_to_start_as_a_role_that_bypasses_visibility(privileged_roles):
    db, roles = privileged_roles
    for user in [db.info.user, *roles]:  # db.info.user: the bootstrap superuser
        env = server_env(db, PGKB_DATABASE_URL=_dsn(db, user), PGKB_USER="alice")
        proc = subprocess.run(
            [sys.executable, "-m", "pgkb.cli", "mcp"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        assert proc.returncode == 2, (user, proc.stderr)
        assert "refusing to serve" in proc.stderr and f"role {user}" in proc.stderr


def test_service_role_problem_names_each_kind(privileged_roles, connect_as):
    db, _ = privileged_roles
    assert db.execute("select kb.service_role_problem()").fetchone()[0].endswith("is a superuser")
    expected = {
        "bypasser": "has BYPASSRLS",
        "adminsvc": "is a member of pgkb_admin",
        "adminuser": "maps to a pgkb administrator",
        "svc": None,
        "alice": None,
    }
    for role, problem in expected.items():
        got = connect_as(role).execute("select kb.service_role_problem()").fetchone()[0]
        assert (got is None) if problem is None else got.endswith(problem), (role, got)
    # acting for an administrator does not make the service role unfit (it is checked on session_user)
    svc = connect_as("svc")
    svc.execute("set pgkb.acting_user = 'adminuser'")
    assert svc.execute("select kb.service_role_problem()").fetchone()[0] is None


@pytest.mark.slow
@pytest.mark.parametrize("user", ["alice", None])
def test_every_read_path_applies_the_acting_users_visibility(world, user):  # noqa: F811
    """The probes of the issue: as alice (and as nobody), bob's private knowledge base and document are
    invisible through list_knowledge_bases, get_document and the kb:// resource, and the errors are the
    same as for names that do not exist."""
    expected = {"team-docs", "alice-notes", "empty-kb"} if user else {"team-docs"}

    async def main():
        params = stdio_params(world, **({"PGKB_USER": user} if user else {}))
        async with Client(params, read_timeout_seconds=60) as client:
            kbs = await client.call_tool("list_knowledge_bases", {})
            assert {k["name"] for k in kbs.structured_content["knowledge_bases"]} == expected
            for args in ({"doc_id": "bobmarker.md"}, {"doc_id": "bobmarker.md", "kb": "bob-notes"}):
                secret = await client.call_tool("get_document", args)
                missing = await client.call_tool("get_document", {k: v.replace("bob", "nob") for k, v in args.items()})
                assert secret.is_error and missing.is_error
                assert text_of(secret).replace("bob", "nob") == text_of(missing)
                assert "bobmarker 私人" not in text_of(secret)
            with pytest.raises(MCPError) as secret:
                await client.read_resource("kb://bob-notes/bobmarker.md")
            with pytest.raises(MCPError) as missing:
                await client.read_resource("kb://nob-notes/nobmarker.md")
            assert str(secret.value).replace("bob", "nob") == str(missing.value)
            found = await client.call_tool("search_knowledge", {"query": "bobmarker secret plans", "top_k": 20})
            assert "bobmarker" not in text_of(found)

    anyio.run(main)
