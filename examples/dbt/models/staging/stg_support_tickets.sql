-- Staging: typed, trimmed ticket rows. Only solved tickets (resolved / closed, with a resolution) are
-- knowledge; a ticket that is reopened drops out here and its document is deleted on the next run.
with source as (
    select * from {{ source('support', 'support_tickets') }}
)

select
    trim(ticket_id) as ticket_id,
    opened_on,
    lower(trim(product)) as product,
    lower(trim(language)) as language,
    lower(trim(priority)) as priority,
    trim(subject) as subject,
    trim(description) as description,
    trim(resolution) as resolution
from source
where
    lower(trim(status)) in ('resolved', 'closed')
    and nullif(trim(resolution), '') is not null
