{#
  pgkb_publish(kb, relation, owner): the SQL that writes `relation` (default: the model whose post-hook
  calls it) into the pgkb knowledge base `kb` (default: var('pgkb_kb')). The relation has one row per
  document: doc_key, title, chunks (jsonb array in kb.replace_document's shape), source_url, metadata.
    - every row goes through kb.replace_document (source_type 'dbt', metadata.dbt_model = owner): a row
      whose content hash is unchanged is a no-op (changed = false); a changed one is replaced atomically and
      its chunks are queued for `pgkb worker`;
    - documents of the knowledge base written by this owner (source_type 'dbt', metadata.dbt_model = owner)
      whose doc_key is no longer in the relation are removed with kb.delete_document. Documents written by
      anything else (pgkb ingest, other models) are never touched;
    - each call is recorded in <target schema>.pgkb_publish_log with dbt's invocation_id.
  As a post-hook it runs inside the model's transaction: if any write fails, the model and the knowledge
  base both stay as they were.
#}
{% macro pgkb_publish(kb=none, relation=none, owner=none) -%}
    {%- set kb = kb or var('pgkb_kb') -%}
    {%- set relation = relation or this -%}
    {%- set owner = owner or relation.identifier -%}
    {%- set log_table = pgkb_publish_log_relation() -%}
    create schema if not exists {{ adapter.quote(log_table.schema) }};

    create table if not exists {{ log_table }} (
        invocation_id text not null,
        model text not null,
        kb text not null,
        doc_key text not null,
        action text not null check (action in ('replaced', 'unchanged', 'deleted')),
        document_id bigint,
        chunk_count integer,
        queued integer,
        logged_at timestamptz not null default clock_timestamp()
    );

    insert into {{ log_table }} (invocation_id, model, kb, doc_key, action, document_id, chunk_count, queued)
    select
        {{ pgkb_literal(invocation_id) }},
        {{ pgkb_literal(owner) }},
        {{ pgkb_literal(kb) }},
        doc.doc_key,
        case when written.changed then 'replaced' else 'unchanged' end,
        written.document_id,
        written.chunk_count,
        written.queued
    from (select * from {{ relation }} order by doc_key) as doc
    cross join lateral kb.replace_document(
        kb => {{ pgkb_literal(kb) }},
        doc_key => doc.doc_key,
        title => doc.title,
        chunks => doc.chunks,
        source_url => doc.source_url,
        metadata => coalesce(doc.metadata, '{}') || jsonb_build_object('dbt_model', {{ pgkb_literal(owner) }}),
        source_type => 'dbt'
    ) as written;

    insert into {{ log_table }} (invocation_id, model, kb, doc_key, action)
    select
        {{ pgkb_literal(invocation_id) }},
        {{ pgkb_literal(owner) }},
        {{ pgkb_literal(kb) }},
        gone.doc_key,
        'deleted'
    from (
        select listed.doc_key
        from kb.list_knowledge_bases() as kbs
        cross join lateral kb.list_documents(kbs.name) as listed
        where
            kbs.name = {{ pgkb_literal(kb) }}
            and listed.source_type = 'dbt'
            and listed.metadata ->> 'dbt_model' = {{ pgkb_literal(owner) }}
            and not exists (
                select from {{ relation }} as doc where normalize(doc.doc_key, nfc) = listed.doc_key
            )
        order by listed.doc_key
    ) as gone
    cross join lateral kb.delete_document({{ pgkb_literal(kb) }}, gone.doc_key) as deleted (existed)
    where deleted.existed
{%- endmacro %}


{# The table pgkb_publish records its calls in: <target schema>.pgkb_publish_log. #}
{% macro pgkb_publish_log_relation() -%}
    {{ return(api.Relation.create(database=target.database, schema=target.schema, identifier='pgkb_publish_log')) }}
{%- endmacro %}


{#
  pgkb_publish_report(): on-run-end hook; logs one line per model and knowledge base that pgkb_publish
  wrote in this invocation (replaced / unchanged / deleted, chunks queued for embedding). Runs no SQL of
  its own as a hook (returns nothing).
#}
{% macro pgkb_publish_report() -%}
    {%- if execute -%}
        {%- set log_table = pgkb_publish_log_relation() -%}
        {%- set found = run_query("select to_regclass(" ~ pgkb_literal(log_table | string) ~ ") is not null") -%}
        {%- if found.columns[0].values()[0] -%}
            {%- set summary -%}
                select
                    model,
                    kb,
                    count(*) filter (where action = 'replaced') as replaced,
                    count(*) filter (where action = 'unchanged') as unchanged,
                    count(*) filter (where action = 'deleted') as deleted,
                    coalesce(sum(queued), 0) as queued
                from {{ log_table }}
                where invocation_id = {{ pgkb_literal(invocation_id) }}
                group by model, kb
                order by model, kb
            {%- endset -%}
            {%- for row in run_query(summary).rows -%}
                {%- do log("pgkb_publish: " ~ row[0] ~ " -> knowledge base " ~ row[1] ~ ": " ~ row[2] ~ " replaced, "
                    ~ row[3] ~ " unchanged, " ~ row[4] ~ " deleted; " ~ row[5]
                    ~ " chunks queued (run `pgkb worker --once` to embed them)", info=True) -%}
            {%- endfor -%}
        {%- endif -%}
    {%- endif -%}
{%- endmacro %}


{# A SQL string literal for value (single quotes doubled). #}
{% macro pgkb_literal(value) -%}
    '{{ (value | string) | replace("'", "''") }}'
{%- endmacro %}
