"""The client of the event handler's HTTP API (docs/API.md): ``api`` (sync and async
clients, shard routing, failover), ``endpoints`` (each request without I/O) and ``proofs``
(a mount's proofs of S3 list rights)."""
