"""What both processes use, owned by neither: S3 access (``s3``, the only module that
imports boto3), configuration from flags and environment (``config``) and the garbage
collector and GIL policy (``quietgc``). Imports nothing of the client or the handler."""
