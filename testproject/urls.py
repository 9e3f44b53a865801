from django.contrib import admin
from django.urls import path

from django_dbqueue.observability.views import metrics
from testproject import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("locks/report/<int:pk>/", views.locked_report, name="locked-report"),
    path("metrics/", metrics, name="dbqueue-metrics"),
]
