from django.contrib import admin
from django.urls import path

from testproject import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("locks/report/<int:pk>/", views.locked_report, name="locked-report"),
]
