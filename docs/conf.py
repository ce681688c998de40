"""Sphinx configuration of the sqla-jobs documentation site (``nox -s docs``).

The build is strict: ``nox -s docs`` runs ``sphinx-build -n -W --keep-going``, so a broken
cross-reference, a link to a page or heading that does not exist, or a link to a repository
file that is not there fails it. docs/README.md says how the site is put together.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import os
import re
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import Directive, directives
from sphinx.application import Sphinx
from sphinx.errors import PycodeError
from sphinx.pycode import ModuleAnalyzer
from sphinx.util import logging as sphinx_logging
from sphinx.util.nodes import split_explicit_title

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

project = "sqla-jobs"
author = "the sqla-jobs authors"
copyright = "the sqla-jobs authors"
release = metadata.version("sqla-jobs")
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
# README.md is this directory's page for maintainers, not a page of the site.
exclude_patterns = ["_build", "README.md"]

# -- strictness --------------------------------------------------------------------------------
# -- strictness --------------------------------------------------------------------------------
#: The modules inside the package's subpackages (``sqla_jobs.worker.pruner``): private, whatever
#: their names, as docs/architecture.md says. A subpackage's own name (``sqla_jobs.worker``,
#: ``sqla_jobs.testing``) is not among them: what it exports is public.
PRIVATE_MODULES = sorted(
    ".".join(path.relative_to(ROOT).with_suffix("").parts)
    for path in (ROOT / "sqla_jobs").glob("*/**/*.py")
    if path.name != "__init__.py" and "versions" not in path.parts
)

# Every cross-reference must resolve (sphinx-build -n). The exceptions are listed here, each for
# a reason; anything else unresolved fails the build.
nitpicky = True
nitpick_ignore_regex = [
    # No inventory of other projects' docs can be fetched where the docs are built (no network),
    # so intersphinx is off and references to these packages' names are left as text.
    (
        r"py:.*",
        r"(sqlalchemy|pydantic|pydantic_core|psycopg|prometheus_client|opentelemetry"
        r"|typing_extensions|starlette|jinja2|uvicorn)(\..*)?",
    ),
    # The same for the standard library's names (builtins such as int and str resolve anyway).
    (
        r"py:.*",
        r"(asyncio|collections|contextlib|dataclasses|datetime|enum|logging|threading|typing"
        r"|types|uuid|time|inspect|json)\..*",
    ),
    (r"py:.*", r"(datetime|timedelta|Awaitable|Callable|Mapping|Sequence|Iterable|Iterator)"),
    # Type variables (``T`` in ``step(...) -> T``, the payload model ``M``) have no page.
    (r"py:class", r"(sqla_jobs\.[a-z_.]+\.)?[A-Z](_contra)?"),
    # Private modules are named in docstrings for readers of the code; the reference documents
    # the public names only, so they stay text: those whose name starts with ``_``, and every
    # module inside a subpackage (``sqla_jobs.worker.pruner``; :data:`PRIVATE_MODULES`).
    (r"py:.*", r"(~?sqla_jobs\.)?_[a-z_]+(\..*)?"),
    (r"py:.*", r"~?(" + "|".join(re.escape(m) for m in PRIVATE_MODULES) + r")(\..*)?"),
]

# -- MyST ------------------------------------------------------------------------------------
myst_enable_extensions = ["colon_fence", "deflist"]
# Headings up to ### get anchors, so [text](worker.md#graceful-shutdown) is checked like a page.
myst_heading_anchors = 3

# -- autodoc -------------------------------------------------------------------------------------
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
napoleon_google_docstring = False
napoleon_numpy_docstring = False

# -- HTML ------------------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"sqla-jobs {release}"
html_static_path: list[str] = []
html_show_sourcelink = False


# -- the repository -----------------------------------------------------------------------------
def _repository_url() -> str | None:
    """The repository's web address: ``SQLA_JOBS_REPO_URL``, else pyproject's
    ``[project.urls]`` Repository (or Source). None: repository files are named, not linked."""
    url = os.environ.get("SQLA_JOBS_REPO_URL")
    if url:
        return url.rstrip("/")
    try:
        import tomllib
    except ImportError:  # Python 3.10
        return None
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"].get("urls", {})
    for key in ("Repository", "Source", "Source code", "Code"):
        if urls.get(key):
            return str(urls[key]).rstrip("/")
    return None


REPO_URL = _repository_url()
REPO_BRANCH = os.environ.get("SQLA_JOBS_REPO_BRANCH", "main")


def repo_role(
    name: str,
    rawtext: str,
    text: str,
    lineno: int,
    inliner: Any,
    options: dict[str, Any] | None = None,
    content: list[str] | None = None,
) -> tuple[list[nodes.Node], list[nodes.system_message]]:
    """``{repo}`bench/README.md``` (or ``{repo}`the benchmarks <bench/README.md>```): a file of
    the repository, linked on the repository's site. A path that does not exist fails the build."""
    has_title, title, target = split_explicit_title(text)
    path, _, anchor = target.partition("#")
    if not (ROOT / path).exists() or ".." in Path(path).parts:
        msg = inliner.reporter.error(
            f"{{repo}} link to {path!r}: no such file in the repository", line=lineno
        )
        return [inliner.problematic(rawtext, rawtext, msg)], [msg]
    label = title if has_title else path
    if REPO_URL is None:
        return [nodes.literal(rawtext, label)], []
    kind = "tree" if (ROOT / path).is_dir() else "blob"
    uri = f"{REPO_URL}/{kind}/{REPO_BRANCH}/{path}" + (f"#{anchor}" if anchor else "")
    inner: nodes.Node = nodes.Text(label) if has_title else nodes.literal(label, label)
    return [nodes.reference(rawtext, "", inner, refuri=uri)], []


class CliHelp(Directive):
    """``sqla-jobs SUBCOMMAND --help``, rendered from the parser itself at build time, so the
    page shows the flags, environment variables and defaults the code has."""

    required_arguments = 0
    optional_arguments = 2
    has_content = False
    option_spec = {"width": directives.positive_int}

    def run(self) -> list[nodes.Node]:
        # Defaults come from SQLA_JOBS_* variables: show the documented ones, not the builder's.
        # argparse wraps to $COLUMNS.
        saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("SQLA_JOBS_")}
        saved_columns = os.environ.get("COLUMNS")
        os.environ["COLUMNS"] = str(self.options.get("width", 100))
        try:
            cli = importlib.import_module("sqla_jobs.cli")
            parser: argparse.ArgumentParser = cli.build_parser()
            for word in self.arguments:
                action = next(
                    a for a in parser._actions if isinstance(a, argparse._SubParsersAction)
                )
                if word not in action.choices:
                    raise self.error(f"sqla-jobs has no command {word!r}")
                parser = action.choices[word]
            text = parser.format_help()
        finally:
            os.environ.update(saved)
            os.environ.pop("COLUMNS")
            if saved_columns is not None:
                os.environ["COLUMNS"] = saved_columns
        # argparse wraps to the terminal; the epilog repeats the exit codes on every command.
        text = text.split("\nExit codes:")[0].rstrip()
        text = re.sub(r"\n+An unexpected database error.*", "", text, flags=re.S).rstrip()
        block = nodes.literal_block(text, text)
        block["language"] = "text"
        return [block]


def resolve_reexports(app: Sphinx, env: Any, node: Any, contnode: Any) -> Any:
    """Resolve a name by where the reference documents it: ``sqla_jobs.hooks.Hooks`` (or
    ``Hooks.on_enqueue`` in the hooks module's docstring) is ``sqla_jobs.Hooks``, documented once
    under the package that re-exports it; ``sqla_jobs._handler_types.HandlerOf`` is
    ``sqla_jobs.kinds.HandlerOf``, under the public module that re-exports it."""
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "").lstrip("~.")
    parts = target.split(".")
    if parts[0] == "sqla_jobs" and len(parts) > 2:
        tail = parts[2:]  # sqla_jobs.<module>.<Name>...
    elif parts[0] != "sqla_jobs":
        tail = parts  # <Name>... relative to the current module
    else:
        return None
    domain = env.get_domain("py")
    public = [m for m in domain.modules if not any(p.startswith("_") for p in m.split("."))]
    for module in ["sqla_jobs", *sorted(public)]:
        candidate = ".".join([module, *tail])
        if candidate == target or candidate not in domain.objects:
            continue
        node["reftarget"] = candidate
        return domain.resolve_xref(
            env, node["refdoc"], app.builder, node["reftype"], candidate, node, contnode
        )
    return None


_TYPE_CHECKING_DONE: set[str] = set()


def resolve_type_checking_imports(app: Sphinx, obj: Any, bound_method: bool) -> None:
    """Before autodoc reads a signature, run the top-level ``if TYPE_CHECKING:`` block of the
    module that defines it, so that the annotations naming what the module imports there
    (``AsyncSession``, ``KindArgs``) resolve to the real objects, as they do for mypy. Only in
    this build's process; names the module already has are kept."""
    name = getattr(obj, "__module__", None)
    if name and name.startswith("sqla_jobs"):
        _run_type_checking_block(name)


def _run_type_checking_block(name: str) -> None:
    if name in _TYPE_CHECKING_DONE:
        return
    _TYPE_CHECKING_DONE.add(name)
    module = sys.modules.get(name) or importlib.import_module(name)
    if module.__file__ is None:
        return
    tree = ast.parse(Path(module.__file__).read_text(), module.__file__)
    for node in tree.body:
        if not (isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")):
            continue
        for stmt in node.body:
            # What it imports from the package may itself be defined under TYPE_CHECKING there.
            if isinstance(stmt, ast.ImportFrom) and stmt.level:
                base = name.rsplit(".", stmt.level)[0]
                _run_type_checking_block(f"{base}.{stmt.module}" if stmt.module else base)
            elif isinstance(stmt, ast.ImportFrom) and (stmt.module or "").startswith("sqla_jobs"):
                _run_type_checking_block(stmt.module or "")
            scratch = dict(vars(module))
            exec(compile(ast.Module([stmt], []), module.__file__, "exec"), scratch)
            for key, value in scratch.items():
                vars(module).setdefault(key, value)


def document_reexported_data(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    """Data a public module re-exports (``sqla_jobs.worker.EXIT_STUCK`` is defined in
    ``sqla_jobs.worker.facade``) is documented by the ``#:`` comment where it is defined: autodoc
    looks for one only in the module it documents, and shows the value's type's docstring (int's,
    tuple's) when it finds none. Data with no comment anywhere gets no text rather than that."""
    if what != "data" or not name.startswith("sqla_jobs."):
        return
    module, _, attr = name.rpartition(".")
    comment = _data_comment(module, attr)
    if comment is not None:
        lines[:] = comment
    elif lines and obj.__doc__ is not None and obj.__doc__ == type(obj).__doc__:
        lines[:] = []


def _data_comment(module: str, attr: str) -> list[str] | None:
    """The ``#:`` comment of ``module.attr``, followed through ``from ... import`` to where it is
    assigned; None if there is none."""
    try:
        analyzer = ModuleAnalyzer.for_module(module)
        docs = analyzer.find_attr_docs()
    except PycodeError:
        return None
    if ("", attr) in docs:
        return list(docs["", attr])
    # The package imports absolutely (``from sqla_jobs.observe.tracing import SYSTEM``).
    for node in ast.parse(analyzer.code).body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sqla_jobs"):
            for alias in node.names:
                if (alias.asname or alias.name) == attr:
                    return _data_comment(node.module or "", alias.name)
    return None


#: The public modules whose ``__all__`` the reference must cover, besides the package itself.
PUBLIC_MODULES = [
    "sqla_jobs.hooks",
    "sqla_jobs.testing",
    "sqla_jobs.metrics",
    "sqla_jobs.otel",
    "sqla_jobs.throughput",
]
if (ROOT / "sqla_jobs" / "dashboard").is_dir():
    PUBLIC_MODULES.append("sqla_jobs.dashboard")


def check_public_names(app: Sphinx, env: Any) -> None:
    """Fail the build when a public name has no entry in the API reference: every name in
    ``sqla_jobs.__all__``, and in the ``__all__`` of each public module (documented there, or
    under the package that re-exports it)."""
    objects = env.get_domain("py").objects
    missing = []
    for module_name in ["sqla_jobs", *PUBLIC_MODULES]:
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", []):
            if f"{module_name}.{name}" not in objects and f"sqla_jobs.{name}" not in objects:
                missing.append(f"{module_name}.{name}")
    if missing:
        sphinx_logging.getLogger(__name__).warning(
            "public names missing from the API reference (docs/api/): %s", ", ".join(missing)
        )


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("env-check-consistency", check_public_names)
    app.connect("autodoc-before-process-signature", resolve_type_checking_imports)
    app.connect("autodoc-process-docstring", document_reexported_data)
    app.add_role("repo", repo_role)
    app.add_directive("cli-help", CliHelp)
    app.connect("missing-reference", resolve_reexports)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
