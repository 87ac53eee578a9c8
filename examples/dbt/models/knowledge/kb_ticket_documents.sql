-- One pgkb document per solved ticket: doc_key, title, chunks (jsonb, the shape kb.replace_document
-- takes), source_url and metadata. The table is the desired state of the knowledge base; its post-hook
-- (macros/pgkb_publish.sql) writes it into pgkb: changed tickets are replaced, unchanged ones are no-ops
-- (same content hash), and documents of this model whose ticket is gone are deleted.
{{ config(post_hook="{{ pgkb_publish() }}") }}

with tickets as (
    select
        *,
        language = 'zh' as is_zh
    from {{ ref('stg_support_tickets') }}
)

select
    'tickets/' || ticket_id as doc_key,
    ticket_id || ' ' || subject as title,
    'https://support.example.com/tickets/' || ticket_id as source_url,
    jsonb_build_object(
        'ticket_id', ticket_id,
        'product', product,
        'language', language,
        'priority', priority,
        'opened_on', to_char(opened_on, 'YYYY-MM-DD')
    ) as metadata,
    jsonb_build_array(
        jsonb_build_object(
            'content', description,
            'heading_path', jsonb_build_array(subject, case when is_zh then '问题描述' else 'Problem' end),
            'metadata', jsonb_build_object('part', 'problem')
        ),
        jsonb_build_object(
            'content', resolution,
            'heading_path', jsonb_build_array(subject, case when is_zh then '解决方案' else 'Resolution' end),
            'metadata', jsonb_build_object('part', 'resolution')
        )
    ) as chunks
from tickets
