"""View definitions (rulesets): load, validate, compile and match.

Shared by the event handler and the FUSE client. The hot path lives in the C
extension ``rulesets._native``; ``rulesets.reference`` is the pure-Python reference
of the matching semantics (and ``rulesets.globs`` of the glob semantics) that the
extension must agree with. docs/RULESETS.md is the user's reference.
"""
from .expressions import TimeRule
from .loader import Problem, ViewsError, load_views, parse_views
from .matcher import Matcher, compile_views
from .model import ObjectInfo, RuleBlock, View, view_id

__all__ = ["load_views", "parse_views", "ViewsError", "Problem", "View", "RuleBlock", "ObjectInfo",
           "TimeRule", "compile_views", "Matcher", "view_id"]
