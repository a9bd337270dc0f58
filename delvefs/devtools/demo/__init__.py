"""The publish/subscribe sequence-alignment demo (``make demo``; docs/DEMO.md).

Roles, each runnable on its own so that ``compose/`` can give each a container:
``genome`` simulates a reference and reads with known origins; ``publisher`` uploads
read files through the plain S3 API, waits for whole samples in its view and checks that
each was aligned exactly once; ``aligner`` is one member of the work-queue group that
shares the reads, and ``align`` its command per file (align into a scratch directory,
rename it into the output view: an atomic publish); ``run`` orchestrates all of them on
one machine and kills one aligner mid-file.
"""
