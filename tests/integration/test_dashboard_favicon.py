"""The dashboard's icon: ``/favicon.ico`` (what a browser asks for unprompted) and the SVG every
page links to, both served by the app itself, behind the same authentication and headers as the
pages."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import Engine
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from sqla_jobs.dashboard import create_app

from ._dashboard import dashboard

ICO_HEADER = b"\x00\x00\x01\x00"  # reserved 0, type 1 (icon)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def icon_link(page: str) -> str:
    found = re.search(r'<link rel="icon" type="image/svg\+xml" href="([^"]+)">', page)
    assert found, "no icon linked"
    return found.group(1)


def test_favicon_ico_is_served_as_an_icon(clean: Engine) -> None:
    """The request every browser makes for ``/favicon.ico`` gets an icon, not a 404."""
    with dashboard(clean) as client:
        response = client.get("/favicon.ico")
    assert response.status_code == 200
    assert response.headers["content-type"] == "image/vnd.microsoft.icon"
    assert response.content.startswith(ICO_HEADER)
    assert PNG_SIGNATURE in response.content, "one PNG image inside"


@pytest.mark.parametrize("path", ["/", "/jobs", "/workers", "/throughput", "/nowhere"])
def test_every_page_links_an_svg_icon_the_app_serves(clean: Engine, path: str) -> None:
    """The linked icon resolves, as SVG, and holds nothing the CSP would have to stop."""
    with dashboard(clean) as client:
        href = icon_link(client.get(path).text)
        icon = client.get(href)
    assert href == "/static/favicon.svg"
    assert icon.status_code == 200
    assert icon.headers["content-type"] == "image/svg+xml"
    assert icon.text.startswith("<svg ")
    assert re.search(r"<script|href|url\(", icon.text) is None, "nothing it could load or run"


def test_the_icons_need_the_same_credentials_as_the_pages(clean: Engine) -> None:
    """No exception to the sign-in: an icon is no secret, but one open path would tell a stranger
    that a sqla-jobs dashboard answers here; a browser sends the page's credentials with it."""
    with dashboard(clean, credentials=("ops", "secret")) as client:
        for path in ("/favicon.ico", "/static/favicon.svg"):
            assert client.get(path).status_code == 401, path
            signed_in = client.get(path, auth=("ops", "secret"))
            assert signed_in.status_code == 200, path
            assert signed_in.headers["x-content-type-options"] == "nosniff"


def test_mounted_under_a_prefix_the_linked_icon_is_under_it(clean: Engine) -> None:
    outer = Starlette(routes=[Mount("/ops/jobs", app=create_app(clean))])
    with TestClient(outer) as client:
        href = icon_link(client.get("/ops/jobs/").text)
        assert href == "/ops/jobs/static/favicon.svg"
        assert client.get(href).status_code == 200


@pytest.mark.parametrize("path", ["/static/nope.css", "/static/..%2F_app.py", "/static/"])
def test_only_the_named_static_files_are_served(clean: Engine, path: str) -> None:
    with dashboard(clean) as client:
        assert client.get(path).status_code == 404
