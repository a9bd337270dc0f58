"""The publish/subscribe sequence-alignment demo (``make demo``).

Roles, each runnable on its own so that ``compose/`` can give each a container:
``genome`` simulates a reference and reads with known origins, ``publisher``
uploads read files through the plain S3 API, ``subscriber`` aligns what appears
in its view and writes results into its output view, ``run`` orchestrates all of
them on one machine.
"""
