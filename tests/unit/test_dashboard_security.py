"""The dashboard's request checks: CSRF token, origin, host names."""

from __future__ import annotations

from sqlqueue_orm.contrib.dashboard import security

OWN = "http://127.0.0.1:8800"


def test_a_post_passes_only_with_the_token_of_its_cookie_from_its_own_origin():
    guard = security.CsrfGuard(b"k" * 32)
    token = guard.token("cookie")
    assert guard.refusal("cookie", token, OWN, None, OWN) is None
    assert guard.refusal("cookie", token, None, OWN + "/errors?x=1", OWN) is None  # Referer
    assert "no origin" in guard.refusal("cookie", token, None, None, OWN)
    assert "no origin" in guard.refusal("cookie", token, "null", None, OWN)
    assert "another origin" in guard.refusal("cookie", token, "http://127.0.0.1:8801", None, OWN)
    assert "another origin" in guard.refusal("cookie", token, None, "http://evil.example/", OWN)
    assert "cookie is missing" in guard.refusal(None, token, OWN, None, OWN)
    assert "token" in guard.refusal("cookie", None, OWN, None, OWN)
    assert "token" in guard.refusal("other", token, OWN, None, OWN)
    assert security.CsrfGuard().token("cookie") != token  # another secret, another token


def test_only_pages_the_browser_navigates_to_or_loads_itself_issue_a_cookie():
    def fetch(site, mode="navigate", dest="document"):
        return {"sec-fetch-site": site, "sec-fetch-mode": mode, "sec-fetch-dest": dest}

    assert security.issues_cookie("GET", {})  # a client that sends no Sec-Fetch headers
    assert security.issues_cookie("GET", fetch("none"))  # typed in the address bar
    assert security.issues_cookie("GET", fetch("same-origin"))
    assert security.issues_cookie("GET", fetch("cross-site"))  # another site's link
    assert security.issues_cookie("HEAD", fetch("cross-site"))
    # Requests another site makes come without the Lax cookie: a new one would replace it.
    assert not security.issues_cookie("POST", fetch("cross-site"))  # its form
    assert not security.issues_cookie("POST", fetch("same-origin"))  # a refused POST's page
    assert not security.issues_cookie("GET", fetch("cross-site", dest="iframe"))
    assert not security.issues_cookie("GET", fetch("cross-site", "no-cors", "image"))
    assert not security.issues_cookie("GET", fetch("cross-site", "cors", "empty"))


def test_host_names_without_ports():
    assert security.host_name("127.0.0.1:8800") == "127.0.0.1"
    assert security.host_name("LocalHost") == "localhost"
    assert security.host_name("[::1]:8800") == "::1"
    assert security.host_name("[::1]") == "::1"
    check = security.HostCheck(lambda *a: None, ["[::1]", "Localhost"])  # type: ignore[arg-type, return-value]
    assert check.hosts == {"::1", "localhost"}
