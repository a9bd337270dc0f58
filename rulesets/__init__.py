"""View definitions (rulesets): load, validate, compile and match.

Shared by the event handler and the FUSE client. The hot path lives in the C
extension ``rulesets._native``; ``rulesets.globs`` is the pure-Python reference
of the glob semantics that the extension must agree with.
"""
