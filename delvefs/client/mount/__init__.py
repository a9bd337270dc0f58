"""The mount process: everything ``composition.serve`` wires, from the FUSE adapter down to
the core (``fs``), the data cache (``cache``) and S3 (``s3async``)."""
