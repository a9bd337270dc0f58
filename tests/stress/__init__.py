"""The stress tier: several processes hammering one writable view of a real mount while
S3 changes under it and the handler restarts (``python -m tests.stress.run --help``;
README.md here). No file is named ``test_*.py``: the default ``pytest`` run never
collects it."""
