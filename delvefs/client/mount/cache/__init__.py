"""A mount's local data cache: sparse files per object version (``datacache``), their bound
(``cachebound``), entries (``cacheentry``), byte ranges (``ranges``) and the journal of
dirty files (``journal``)."""
