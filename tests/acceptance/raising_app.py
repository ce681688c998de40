"""An application module whose import raises something other than ImportError, as a module with
a missing setting does: ``sqla-jobs worker tests.acceptance.raising_app:jobs`` must say so in one
line."""

raise RuntimeError("settings are missing SECRET_KEY")
