"""System checks of the DBQUEUE settings: what a newcomer gets wrong is named in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from django.conf import settings
from django.core import checks
from django.test import override_settings

from django_dbqueue.checks import check_queue_reads, check_queue_settings, check_setting_names
from django_dbqueue.conf import DEFAULTS
from tests.support import ROOT


def messages(check: Any, **dbqueue: Any) -> list[tuple[str, str, str]]:
    with override_settings(DBQUEUE={**settings.DBQUEUE, **dbqueue}):
        return [(m.id or "", m.msg, m.hint or "") for m in check()]


def test_a_misspelled_key_is_named_with_the_setting_it_resembles() -> None:
    assert messages(check_setting_names, QUEUE=["default"]) == [
        (
            "django_dbqueue.E004",
            "DBQUEUE['QUEUE'] is not a django-dbqueue setting; did you mean 'QUEUES'?",
            "Rename 'QUEUE' to 'QUEUES': an unknown key is ignored.",
        )
    ]


def test_a_key_missing_its_last_letter_is_named() -> None:
    assert messages(check_setting_names, MAX_ATTEMPT=5) == [
        (
            "django_dbqueue.E004",
            "DBQUEUE['MAX_ATTEMPT'] is not a django-dbqueue setting; did you mean 'MAX_ATTEMPTS'?",
            "Rename 'MAX_ATTEMPT' to 'MAX_ATTEMPTS': an unknown key is ignored.",
        )
    ]


def test_a_lower_case_key_is_named_with_its_upper_case_setting() -> None:
    assert messages(check_setting_names, lease_timeout=30) == [
        (
            "django_dbqueue.E004",
            "DBQUEUE['lease_timeout'] is not a django-dbqueue setting; "
            "did you mean 'LEASE_TIMEOUT'?",
            "Rename 'lease_timeout' to 'LEASE_TIMEOUT': an unknown key is ignored.",
        )
    ]


def test_a_key_like_no_setting_lists_the_settings() -> None:
    assert messages(check_setting_names, BROKER_URL="redis://") == [
        (
            "django_dbqueue.E004",
            "DBQUEUE['BROKER_URL'] is not a django-dbqueue setting.",
            "The settings are: " + ", ".join(DEFAULTS) + ".",
        )
    ]


def test_every_known_key_passes() -> None:
    assert messages(check_setting_names, **DEFAULTS) == []


def test_the_key_check_is_registered() -> None:
    with override_settings(DBQUEUE={**settings.DBQUEUE, "QUEUE": ["default"]}):
        found = [m.id for m in checks.run_checks() if m.id and m.id.startswith("django_dbqueue")]
    assert found == ["django_dbqueue.E004"]


def test_manage_py_check_names_the_misspelled_key() -> None:
    env = {
        "DBQUEUE_DB": "sqlite",
        "DBQUEUE_SETTINGS_JSON": json.dumps({"MAX_ATTEMPT": 5}),
        "PATH": "/usr/bin:/bin",
    }
    proc = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "SystemCheckError: System check identified some issues:",
        "",
        "ERRORS:",
        "?: (django_dbqueue.E004) DBQUEUE['MAX_ATTEMPT'] is not a django-dbqueue setting; "
        "did you mean 'MAX_ATTEMPTS'?",
        "\tHINT: Rename 'MAX_ATTEMPT' to 'MAX_ATTEMPTS': an unknown key is ignored.",
        "",
        "System check identified 1 issue (0 silenced).",
    ]


def test_lease_of_two_heartbeats_is_an_error_whose_message_and_hint_agree() -> None:
    assert messages(check_queue_settings, LEASE_TIMEOUT=60, HEARTBEAT_INTERVAL=30) == [
        (
            "django_dbqueue.E003",
            "DBQUEUE['HEARTBEAT_INTERVAL'] (30) must be at most a third of "
            "DBQUEUE['LEASE_TIMEOUT'] (60), or a live worker whose heartbeat is late loses "
            "its jobs to another worker.",
            "Set LEASE_TIMEOUT to at least 3x HEARTBEAT_INTERVAL (90 or more), "
            "or lower HEARTBEAT_INTERVAL.",
        )
    ]


def test_lease_of_three_heartbeats_passes() -> None:
    assert messages(check_queue_settings, LEASE_TIMEOUT=60, HEARTBEAT_INTERVAL=20) == []
    # 3 * 0.1 is 0.30000000000000004 in floating point: still three heartbeats.
    assert messages(check_queue_settings, LEASE_TIMEOUT=0.3, HEARTBEAT_INTERVAL=0.1) == []


class ReplicaReads:
    """A read/write router that sends every read to "replica"."""

    def db_for_read(self, model: Any, **hints: Any) -> str:
        return "replica"

    def db_for_write(self, model: Any, **hints: Any) -> str:
        return "default"


def test_a_router_that_reads_the_queue_from_a_replica_is_an_error() -> None:
    with override_settings(DATABASE_ROUTERS=[f"{__name__}.ReplicaReads"]):
        found = messages(check_queue_reads)
        assert {id for id, _, _ in found} == {"django_dbqueue.E007"}
        assert len(found) == 6  # each queue model, named
        assert any("django_dbqueue.QueueState" in text for _, text, _ in found)
        assert all("SAFE_READ_ALIASES" in hint for _, _, hint in found)
        assert messages(check_queue_reads, SAFE_READ_ALIASES=["replica"]) == []
    assert messages(check_queue_reads) == []


def test_an_unknown_cross_database_enqueue_mode_is_an_error() -> None:
    found = messages(check_queue_reads, CROSS_DATABASE_ENQUEUE="shout")
    assert [id for id, _, _ in found] == ["django_dbqueue.E008"]
    for mode in ("warn", "raise", "ignore"):
        assert messages(check_queue_reads, CROSS_DATABASE_ENQUEUE=mode) == []
