"""Views that exercise named_lock in the tests."""

from django.http import HttpRequest, HttpResponse

from django_dbqueue.locks import named_lock


@named_lock("report:{pk}", blocking=False, on_fail=423, retry_delay=5)
def locked_report(request: HttpRequest, pk: int) -> HttpResponse:
    return HttpResponse(f"report {pk}\n", content_type="text/plain")
