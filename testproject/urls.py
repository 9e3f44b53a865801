import importlib.util

from django.contrib import admin
from django.urls import path

from testproject import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("locks/report/<int:pk>/", views.locked_report, name="locked-report"),
]
# The cluster's metrics need the `metrics` extra; the demo runs on the base install.
if importlib.util.find_spec("prometheus_client") is not None:
    from django_dbqueue.observability.views import metrics

    urlpatterns.append(path("metrics/", metrics, name="dbqueue-metrics"))
