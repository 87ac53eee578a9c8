-- Snippets for people: a one-line window of a chunk around the first match of the query, the matches
-- marked. Matching uses the search's own term model (kb_internal.query_terms over kb.fold_text: no English
-- function words), so a highlight appears where the lexical leg found a term: CJK bigrams anywhere, a
-- Latin-script term only as a whole token of the text (a word, or a camelCase, snake_case or letter/digit
-- part, as kb.lexical_terms splits it; "to" is not marked inside "symptoms"), full-width and Traditional
-- characters included.

-- content with white space runs collapsed, cut to `width` characters around the first query term (a
-- quarter of the width before it), every run of characters covered by a query term wrapped in open_mark
-- and close_mark, '…' where text was cut. Marks are inserted as given: a client that renders HTML passes
-- markers it escapes afterwards. Immutable; never raises for any text; width is clamped to 20..2000 and
-- only the first 10000 characters (after collapsing white space) are read. Security definer only to call
-- kb_internal.query_terms: it reads no table.
-- Internal: true when a token of kb.lexical_terms may end between character a and character b (NULL: the
-- text's start or end), given as written and folded (kb.fold_text): not both letters or digits, a lower-case
-- letter before an upper-case one (camelCase), or a letter beside a digit (ISO27001).
create or replace function kb_internal.token_boundary(a text, a_folded text, b text, b_folded text)
returns boolean
language sql immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$
    select a is null or b is null or a_folded = '' or b_folded = ''
        or not (a_folded ~ '^[a-z0-9]$' and b_folded ~ '^[a-z0-9]$')
        or (a <> upper(a) and b <> lower(b))
        or (a_folded ~ '^[0-9]$') <> (b_folded ~ '^[0-9]$')
$$;

create or replace function kb.snippet(
    content text, query text, width integer default 160, open_mark text default '', close_mark text default ''
)
returns text
language plpgsql immutable parallel safe security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    -- the first 10000 characters at most: a snippet shows at most 2000, and matching is quadratic in the worst
    -- case (one short term repeated all along), so the work per call stays bounded whatever the input
    collapsed text := btrim(regexp_replace(left(coalesce(content, ''), 40000), '\s+', ' ', 'g'));
    cut boolean := length(collapsed) > 10000 or length(content) > 40000;
    chars text [] := string_to_array(left(collapsed, 10000), null);
    n integer := coalesce(cardinality(chars), 0);
    folded text;
    covered boolean [];
    term text;
    latin boolean;
    last integer;
    hit integer;
    pos integer;
    first_hit integer;
    lo integer;
    hi integer;
    out text := '';
    inside boolean := false;
begin
    if n = 0 then
        return '';
    end if;
    width := least(greatest(coalesce(width, 160), 20), 2000);
    folded := kb.fold_text(array_to_string(chars, ''));
    if length(folded) <> n then
        -- a character whose folding changes the length: fold one by one, keeping positions aligned
        select string_agg(case when length(kb.fold_text(c)) = 1 then kb.fold_text(c) else lower(c) end, '' order by i)
        into folded
        from unnest(chars) with ordinality as u (c, i);
    end if;
    covered := array_fill(false, array[n]);
    for term in select distinct t from unnest(kb_internal.query_terms(coalesce(query, ''))) as t loop
        latin := term ~ '^[a-z0-9]+$';
        pos := 0;
        loop
            hit := strpos(substr(folded, pos + 1), term);
            exit when hit = 0 or length(folded) <> n;
            hit := pos + hit;
            pos := hit;     -- overlapping matches (CJK bigrams) restart one character later
            last := hit + length(term) - 1;
            -- a Latin-script term only where a token of the text starts and ends
            continue when latin and not (
                kb_internal.token_boundary(chars[hit - 1], substr(folded, hit - 1, 1), chars[hit], substr(folded, hit, 1))
                and kb_internal.token_boundary(
                    chars[last], substr(folded, last, 1), chars[last + 1], substr(folded, last + 1, 1)
                )
            );
            for i in hit .. least(last, n) loop
                covered[i] := true;
            end loop;
            first_hit := least(coalesce(first_hit, hit), hit);
        end loop;
    end loop;
    lo := greatest(1, coalesce(first_hit, 1) - width / 4);
    hi := least(n, lo + width - 1);
    lo := greatest(1, least(lo, hi - width + 1));
    for i in lo .. hi loop
        if covered[i] and not inside then
            out := out || open_mark;
            inside := true;
        elsif not covered[i] and inside then
            out := out || close_mark;
            inside := false;
        end if;
        out := out || chars[i];
    end loop;
    if inside then
        out := out || close_mark;
    end if;
    return (case when lo > 1 then '…' else '' end) || out || (case when hi < n or cut then '…' else '' end);
end
$$;
