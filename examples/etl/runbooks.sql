-- SQL-only ETL into pgkb: a source table (as a dbt model or an ETL job would produce it) is written into
-- a knowledge base with kb.replace_document, one call per document, no Python involved. Chunks arrive
-- without embeddings and are queued; `pgkb worker --once` embeds them, then kb.hybrid_search finds them.
--
--   psql "$(pgkb db url)" -f examples/etl/runbooks.sql && pgkb worker --once

create temporary table runbook_source (
    path text not null,
    step integer not null,
    title text not null,
    section text not null,
    body text not null,
    primary key (path, step)
);

insert into runbook_source (path, step, title, section, body) values
(
    'runbooks/payment-timeout.md', 1, '支付回调超时处理', '现象',
    '支付网关回调在 30 秒内没有响应时，订单会停留在“待支付”状态。'
),
(
    'runbooks/payment-timeout.md', 2, '支付回调超时处理', '处理步骤',
    '先在监控面板确认回调队列积压，再执行 replay_callbacks 脚本重放失败的回调。'
),
(
    'runbooks/cert-rotation.md', 1, 'TLS certificate rotation', 'Steps',
    'Renew the certificate with certbot, reload nginx, then verify the expiry date with openssl s_client.'
);

select
    src.path,
    result.document_id,
    result.chunk_count,
    result.changed,
    result.queued
from (
    select
        rs.path,
        min(rs.title) as title,
        jsonb_agg(
            jsonb_build_object('content', rs.body, 'heading_path', jsonb_build_array(rs.section))
            order by rs.step
        ) as chunks
    from runbook_source as rs
    group by rs.path
) as src
cross join
    lateral kb.replace_document(
        kb => 'runbooks',
        doc_key => src.path,
        title => src.title,
        chunks => src.chunks,
        source_type => 'etl'
    ) as result
order by src.path;
