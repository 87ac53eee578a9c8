-- 012 user timeouts: a pgkb user's own SQL sessions (psql) get a statement and a lock timeout, so a read
-- cannot wait behind a stuck lock or run unbounded; kb.create_user applies them to every mapped login role.

insert into kb.settings (key, value, description) values
(
    'user_statement_timeout', '30s',
    'statement_timeout given to the login roles of pgkb users in this database (kb.create_user)'
),
('user_lock_timeout', '10s', 'lock_timeout given to the login roles of pgkb users in this database')
on conflict (key) do nothing;
