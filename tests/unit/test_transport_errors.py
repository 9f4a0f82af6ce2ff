"""A bad database URL is refused in one sentence that never shows the password."""

import pytest

from sqlqueue_orm import ConfigurationError, Transport


def test_a_bad_url_is_refused_without_showing_its_password():
    with pytest.raises(ConfigurationError) as raised:
        Transport("postgresql+nosuchdriver://app:s3cret@db.example/shop")
    assert "s3cret" not in str(raised.value)
    assert "db.example" in str(raised.value)
