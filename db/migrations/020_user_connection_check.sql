-- 020 user connection check: a pgkb user's sessions get client_connection_check_interval next to their
-- statement and lock timeouts (kb.bound_sessions), so a query whose client is gone stops within that
-- interval instead of running to its end (issue 20). Existing users get it when db/functions re-applies
-- kb.bound_sessions to every mapped login role (90_grants.sql).

insert into kb.settings (key, value, description) values
(
    'user_client_connection_check_interval', '5s',
    'client_connection_check_interval given to the login roles of pgkb users in this database'
)
on conflict (key) do nothing;
