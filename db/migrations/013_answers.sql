-- 013 answers: settings of kb.ask (db/functions/6x_*.sql). The chat endpoint is any OpenAI-compatible
-- /chat/completions (DeepSeek, Qwen/DashScope compatible mode, OpenAI, vLLM, Ollama); empty chat_url means
-- none: kb.ask answers extractively. kb.settings is readable by no pgkb user, so the key never leaves it.

insert into kb.settings (key, value, description) values
(
    'chat_url', '',
    'OpenAI-compatible chat endpoint of kb.ask: a base URL (https://api.deepseek.com, '
    || 'http://127.0.0.1:11434/v1) or the full /chat/completions URL; empty = no endpoint, extractive answers'
),
(
    'chat_model', 'deepseek-chat',
    'model name sent to chat_url (deepseek-chat, qwen-plus, gpt-4o-mini, the vLLM/Ollama model name)'
),
('chat_api_key', '', 'Bearer token for chat_url; empty: read the variable named by chat_api_key_env, else none'),
(
    'chat_api_key_env', 'PGKB_CHAT_API_KEY',
    'name of an environment variable of the PostgreSQL server process holding the chat API key'
),
(
    'chat_timeout_ms', '20000',
    'timeout of one chat call (connect, and each read while streaming); keep it below user_statement_timeout'
),
('chat_max_tokens', '1024', 'max_tokens of one chat answer'),
('chat_temperature', '0', 'temperature of the chat answer (0 = as deterministic as the endpoint allows)'),
(
    'answer_min_score', '0.45',
    'kb.answer_gate: a question is answered when kb.answer_score(evidence) reaches this; else "not found"'
),
(
    'answer_vector_weight', '0.5',
    'kb.answer_score: weight of the rescaled vector cosine against the query-term idf coverage (0..1)'
),
(
    'answer_vector_floor', '0.75',
    'kb.answer_score: cosine similarity that counts as no evidence (rescaled to 0)'
),
(
    'answer_vector_ceiling', '0.92',
    'kb.answer_score: cosine similarity that counts as full evidence (rescaled to 1)'
)
on conflict (key) do nothing;
