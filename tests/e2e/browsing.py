"""Steps the browser tests share."""

from __future__ import annotations

import re

from playwright.sync_api import expect


def sign_in(page, username: str, password: str) -> None:
    """Sign in as a user would: the job list sends an anonymous visitor to the sign-in page, and
    signing in lands on the job list."""
    page.goto("/jobs/")
    expect(page).to_have_url(re.compile(r"/accounts/login/"))  # anonymous: to the sign-in page first
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in", exact=True).click()
    expect(page).to_have_url(re.compile(r"/jobs/$"))
