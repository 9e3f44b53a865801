"""Sample jobs for the demo: an installed app's jobs.py, so workers find them by themselves."""

import hashlib
import time

from django_dbqueue import job


@job
def checksum(text: str, rounds: int = 50) -> str:
    digest = text.encode()
    for _ in range(rounds):
        digest = hashlib.sha256(digest).digest()
    return digest.hex()[:16]


@job(queue="emails")
def send_welcome_mail(user_id: int, lang: str = "en") -> dict[str, object]:
    time.sleep(0.001)  # stands in for talking to a mail server
    return {"user_id": user_id, "lang": lang, "sent": True}


@job(queue="reports", max_attempts=1)
def build_report(name: str) -> None:
    raise RuntimeError(f"report {name!r} failed: the data source is unreachable (demo error)")
