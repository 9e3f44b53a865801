"""``metrics``: the cluster's metrics as a Django view the project mounts.

    path("metrics/", django_dbqueue.observability.views.metrics)

Access control: with ``DBQUEUE["METRICS_TOKEN"]`` set, a request must send
``Authorization: Bearer <token>`` (compared in constant time); without it the view is
open, and the project guards the URL itself (a decorator, its proxy, a network policy).
"""

from __future__ import annotations

import hmac

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from django_dbqueue.conf import settings

try:
    from prometheus_client import CONTENT_TYPE_LATEST

    from django_dbqueue.observability.cluster import cache
except ImportError as exc:  # the view is mounted, the optional package is missing
    raise ImproperlyConfigured(
        f"django_dbqueue.observability.views needs prometheus_client ({exc}): "
        "pip install 'django-dbqueue[metrics]'."
    ) from exc


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    token = settings.METRICS_TOKEN
    if token:
        sent = request.headers.get("Authorization", "")
        if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
            response = HttpResponse("Unauthorized\n", status=401, content_type="text/plain")
            response["WWW-Authenticate"] = 'Bearer realm="dbqueue metrics"'
            return response
    return HttpResponse(cache.get(), content_type=CONTENT_TYPE_LATEST)
